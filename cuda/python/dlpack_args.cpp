// Argument checking of orthros._cuda (dlpack_args.hpp): DLPack import, shape / dtype / layout /
// device checks, host-side lengths, option strings.
#include "dlpack_args.hpp"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <limits>
#include <sstream>

namespace orthros::pycuda {

namespace {

namespace dl = nb::dlpack;

std::string type_of(nb::handle obj) { return nb::type_name(obj.type()).c_str(); }

/// "a CPU array", "a CUDA-managed array", ... for the DLPack device type `t`.
std::string device_phrase(int t) {
  switch (t) {
    case 1:
      return "a CPU array";
    case 2:
      return "a CUDA array";
    case 3:
      return "a CUDA pinned-host array";
    case 13:
      return "a CUDA managed-memory array";
    default:
      return "an array on DLPack device type " + std::to_string(t);
  }
}

/// The DLPack capsule of a CUDA array, exported without stream synchronization (stream=-1, the
/// array API's "the consumer orders the work itself"). A tensor that refuses export because it
/// requires grad (PyTorch) is exported through its detach() (same storage, no copy); a producer
/// that refuses stream=-1 is asked with no stream argument (its default synchronization).
nb::object cuda_capsule(nb::handle obj) {
  try {
    return obj.attr("__dlpack__")(nb::arg("stream") = -1);
  } catch (nb::python_error&) {
    if (nb::hasattr(obj, "requires_grad") && nb::hasattr(obj, "detach") && nb::bool_(obj.attr("requires_grad")))
      return obj.attr("detach")().attr("__dlpack__")(nb::arg("stream") = -1);
    return obj.attr("__dlpack__")();
  }
}

}  // namespace

std::int64_t Array::numel() const {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  return present ? n : 0;
}

std::int64_t Array::nbytes() const { return present ? static_cast<std::int64_t>(nd.nbytes()) : 0; }

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Array import_array(nb::handle obj, const char* name, bool may_be_none) {
  Array a;
  a.name = name;
  if (obj.is_none()) {
    require(may_be_none, name, " must be an array (got None)");
    return a;
  }
  nb::object source = nb::borrow(obj);
  if (!PyCapsule_CheckExact(obj.ptr()) && nb::hasattr(obj, "__dlpack_device__")) {
    int device_type = 0;
    try {
      nb::tuple dev = nb::cast<nb::tuple>(obj.attr("__dlpack_device__")());
      device_type = nb::cast<int>(dev[0]);
    } catch (nb::python_error& e) {
      throw Error(std::string(name) + ": __dlpack_device__() failed: " + e.what());
    }
    if (device_type == kDLCUDA) {
      try {
        source = cuda_capsule(obj);
      } catch (nb::python_error& e) {
        throw Error(std::string(name) + ": export through __dlpack__ failed: " + e.what());
      }
    }
  }
  if (PyCapsule_CheckExact(source.ptr()) && !PyCapsule_IsValid(source.ptr(), "dltensor")) {
    throw Error(std::string(name) + " is a DLPack capsule that was already consumed or is not a \"dltensor\" (name \"" +
                (PyCapsule_GetName(source.ptr()) ? PyCapsule_GetName(source.ptr()) : "") +
                "\"): a capsule can be used once");
  }
  if (!nb::try_cast<nb::ndarray<>>(source, a.nd, false)) {
    PyErr_Clear();
    throw Error(std::string(name) +
                " must be an array that speaks DLPack (__dlpack__ / __dlpack_device__, e.g. a torch tensor or a "
                "CuPy array) or a DLPack capsule (got " +
                type_of(obj) + ")");
  }
  a.present = true;
  for (size_t i = 0; i < a.nd.ndim(); ++i) a.shape.push_back(static_cast<std::int64_t>(a.nd.shape(i)));
  a.data = a.numel() > 0 ? a.nd.data() : nullptr;
  return a;
}

std::string dtype_name_of(const Array& a) {
  const dl::dtype t = a.nd.dtype();
  std::string base;
  switch (static_cast<dl::dtype_code>(t.code)) {
    case dl::dtype_code::Float:
      base = "f";
      break;
    case dl::dtype_code::Bfloat:
      base = "bf";
      break;
    case dl::dtype_code::Int:
      base = "int";
      break;
    case dl::dtype_code::UInt:
      base = "uint";
      break;
    case dl::dtype_code::Complex:
      base = "complex";
      break;
    case dl::dtype_code::Bool:
      return "bool";
    default:
      base = "code" + std::to_string(t.code) + "_";
      break;
  }
  std::string s = base + std::to_string(t.bits);
  if (t.lanes != 1) s += "x" + std::to_string(t.lanes);
  return s;
}

cuda::DType activation_dtype(const Array& a) {
  const std::string n = dtype_name_of(a);
  if (n == "bf16") return cuda::DType::bf16;
  if (n == "f16") return cuda::DType::f16;
  if (n == "f32") return cuda::DType::f32;
  throw Error(std::string(a.name) + " must be a bf16, f16 or f32 array (got dtype " + n + ")");
}

void require_present(const Array& a, const std::string& why) {
  require(a.present, a.name, " must be an array ", why, " (got None)");
}

void expect_dtype(const Array& a, cuda::DType dt, const char* what) {
  if (!a.present) return;
  const std::string n = dtype_name_of(a);
  require(n == cuda::dtype_name(dt), a.name, " must have dtype ", cuda::dtype_name(dt), " (", what, "); got ", n);
}

void expect_float32(const Array& a) {
  if (!a.present) return;
  const std::string n = dtype_name_of(a);
  require(n == "f32", a.name, " must be a float32 array (got dtype ", n, ")");
}

void expect_shape(const Array& a, std::initializer_list<Dim> dims) {
  if (!a.present) return;
  bool ok = a.shape.size() == dims.size();
  std::string expected = "[";
  size_t i = 0;
  for (const Dim& d : dims) {
    expected += (i ? ", " : "") + std::string(d.label);
    if (d.value >= 0) expected += " = " + std::to_string(d.value);
    if (ok && d.value >= 0 && a.shape[i] != d.value) ok = false;
    ++i;
  }
  expected += "]";
  require(ok, a.name, " has shape ", shape_string(a.shape), "; expected ", expected);
}

void expect_layout(const Array& a, std::size_t alignment) {
  if (!a.present || a.numel() == 0) return;
  std::vector<std::int64_t> strides, expected(a.shape.size());
  bool contiguous = true;
  for (std::int64_t i = static_cast<std::int64_t>(a.shape.size()) - 1, accum = 1; i >= 0; --i) {
    expected[i] = accum;
    if (a.shape[i] != 1 && a.nd.stride(i) != accum) contiguous = false;
    accum *= a.shape[i];
  }
  for (size_t i = 0; i < a.shape.size(); ++i) strides.push_back(a.nd.stride(i));
  require(contiguous, a.name, " must be C-contiguous (shape ", shape_string(a.shape), ", strides ",
          shape_string(strides), " elements; expected ", shape_string(expected), "): pass a contiguous copy");
  const auto addr = reinterpret_cast<std::uintptr_t>(a.data);
  if (addr % alignment != 0) {
    char hex[32];
    std::snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(addr));
    throw Error(std::string(a.name) + " must be " + std::to_string(alignment) + "-byte aligned (its data pointer " +
                hex + " is " + std::to_string(addr % alignment) +
                " bytes past a boundary; a view at an offset may not be)");
  }
}

void expect_tensor(const Array& a, cuda::DType dt, const char* what, std::initializer_list<Dim> dims,
                   std::size_t alignment) {
  expect_dtype(a, dt, what);
  expect_shape(a, dims);
  expect_layout(a, alignment);
}

int require_cuda(const std::vector<const Array*>& arrays) {
  int device = -1;
  const char* first = nullptr;
  for (const Array* a : arrays) {
    if (!a->present) continue;
    const int t = a->nd.device_type();
    require(t == kDLCUDA, a->name, " must be a CUDA array (got ", device_phrase(t), ")");
    if (device < 0) {
      device = a->nd.device_id();
      first = a->name;
    }
    require(a->nd.device_id() == device, a->name, " is on CUDA device ", a->nd.device_id(), " but ", first,
            " is on CUDA device ", device, ": every array of a call must be on one device");
  }
  return device;
}

void require_current_device(int device, const std::vector<const Array*>& arrays) {
  if (device < 0) return;
  int current = -1;
  const cudaError_t e = cudaGetDevice(&current);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw cuda::CudaError(std::string("cudaGetDevice: ") + cudaGetErrorString(e));
  }
  for (const Array* a : arrays) {
    if (a->present) {
      require(device == current, a->name, " is on CUDA device ", device, " but the current device is ", current,
              ": make the arrays' device current (torch.cuda.device / cupy.cuda.Device) before the call");
      break;
    }
  }
}

std::vector<std::int64_t> parse_lengths(nb::handle obj, const char* name) {
  std::vector<std::int64_t> out;
  require(!obj.is_none(), name, " must be a list of ints (got None)");
  if (nb::hasattr(obj, "__dlpack_device__") || PyCapsule_CheckExact(obj.ptr())) {
    Array a = import_array(obj, name);
    const int t = a.nd.device_type();
    require(t == 1, name, " must be host-side (a list, a tuple or a 1-d CPU integer array; got ", device_phrase(t),
            "): lengths are read on the host, copy them there first");
    require(a.shape.size() == 1, name, " must be 1-d (got shape ", shape_string(a.shape), ")");
    const std::string dt = dtype_name_of(a);
    require(dt == "int32" || dt == "int64", name, " must have an integer dtype int32 or int64 (got ", dt, ")");
    const auto* base = static_cast<const char*>(a.nd.data());
    const std::int64_t step = a.nd.stride(0) * static_cast<std::int64_t>(a.nd.itemsize());
    for (std::int64_t i = 0; i < a.shape[0]; ++i) {
      const char* p = base + i * step;
      out.push_back(dt == "int32" ? *reinterpret_cast<const std::int32_t*>(p)
                                  : *reinterpret_cast<const std::int64_t*>(p));
    }
  } else {
    require(PySequence_Check(obj.ptr()) && !PyUnicode_Check(obj.ptr()) && !PyBytes_Check(obj.ptr()), name,
            " must be a list or tuple of ints, or a 1-d CPU integer array (got ", type_of(obj), ")");
    const Py_ssize_t n = PySequence_Size(obj.ptr());
    if (n < 0) {
      PyErr_Clear();
      throw Error(std::string(name) + " has no length (got " + type_of(obj) + ")");
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
      nb::object item = nb::steal(PySequence_GetItem(obj.ptr(), i));
      if (!item.is_valid()) throw nb::python_error();
      nb::object index = nb::steal(PyNumber_Index(item.ptr()));
      if (!index.is_valid() || PyBool_Check(item.ptr())) {
        PyErr_Clear();
        throw Error(std::string(name) + "[" + std::to_string(i) + "] must be an int (got " + type_of(item) + ")");
      }
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
      require(overflow == 0, name, "[", i, "] does not fit in 64 bits");
      out.push_back(v);
    }
  }
  for (size_t i = 0; i < out.size(); ++i) require(out[i] >= 0, name, "[", i, "] must be >= 0 (got ", out[i], ")");
  return out;
}

cuda::BatchLayout parse_layout(nb::handle q_lens, nb::handle out_lens, nb::handle cache_lens) {
  const auto t = parse_lengths(q_lens, "q_lens"), to = parse_lengths(out_lens, "out_lens"),
             c = parse_lengths(cache_lens, "cache_lens");
  require(to.size() == t.size() && c.size() == t.size(),
          "q_lens, out_lens and cache_lens must have one entry per sequence (got ", t.size(), ", ", to.size(), " and ",
          c.size(), " entries)");
  cuda::BatchLayout layout;
  constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();
  for (size_t b = 0; b < t.size(); ++b) {
    require(t[b] <= kIntMax, "q_lens[", b, "] (T) must be < 2^31 (got ", t[b], ")");
    require(to[b] <= t[b], "out_lens[", b, "] (T_out) must be <= q_lens[", b, "] = ", t[b], " (got ", to[b], ")");
    require(c[b] >= t[b], "cache_lens[", b, "] (P + T) must be >= q_lens[", b, "] = ", t[b], " (got ", c[b],
            "): the cache holds this call's tokens too");
    layout.q_lens.push_back(static_cast<int>(t[b]));
    layout.out_lens.push_back(static_cast<int>(to[b]));
    layout.cache_lens.push_back(c[b]);
  }
  return layout;
}

void require_capacity(const cuda::BatchLayout& layout, std::int64_t capacity, const char* cache_name) {
  for (size_t b = 0; b < layout.cache_lens.size(); ++b)
    require(layout.cache_lens[b] <= capacity, "cache_lens[", b, "] = ", layout.cache_lens[b], " exceeds the ",
            cache_name, " capacity ", capacity, " (axis 1 of its shape)");
}

cuda::DType parse_dtype(const std::string& s) {
  if (s == "bf16") return cuda::DType::bf16;
  if (s == "f16") return cuda::DType::f16;
  if (s == "f32") return cuda::DType::f32;
  throw Error("dtype must be one of \"bf16\", \"f16\", \"f32\" (got \"" + s + "\")");
}

cuda::KernelPath parse_kernel(const std::string& s) {
  if (s == "automatic") return cuda::KernelPath::automatic;
  if (s == "hopper") return cuda::KernelPath::hopper;
  if (s == "generic") return cuda::KernelPath::generic;
  throw Error("kernel must be one of \"automatic\", \"hopper\", \"generic\" (got \"" + s + "\")");
}

cudaStream_t parse_stream(std::int64_t stream) {
  require(stream >= 0, "stream must be a cudaStream_t handle value >= 0, 0 = the legacy default stream (got ", stream,
          ")");
  return reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(stream));
}

}  // namespace orthros::pycuda
