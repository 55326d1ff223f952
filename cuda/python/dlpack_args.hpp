/// \file dlpack_args.hpp
/// \brief Argument checking of the `orthros._cuda` extension: DLPack arrays (any framework's
/// tensor that implements `__dlpack__` / `__dlpack_device__`, or a raw "dltensor" capsule),
/// host-side length lists, dtype / kernel strings and the stream handle.
///
/// Every check throws orthros::Error (Python: orthros.Error) whose message names the argument
/// and the values. All checks here are host-side and make no CUDA call, except
/// require_current_device(), which asks the runtime for the current device and is called last.
#pragma once

#include "orthros/cuda/attention.hpp"
#include "orthros/error.hpp"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace orthros::pycuda {

namespace nb = nanobind;

/// DLPack device type of CUDA device memory (kDLCUDA).
constexpr int kDLCUDA = 2;

/// One array argument, imported through DLPack. `data` is null when the argument was None or
/// the array has no elements (the library accepts null for empty buffers).
struct Array {
  const char* name = "";
  bool present = false;  ///< false: the argument was None
  nb::ndarray<> nd;      ///< keeps the producer's buffer alive for the call
  std::vector<std::int64_t> shape;
  void* data = nullptr;
  std::int64_t numel() const;
  std::int64_t nbytes() const;
};

/// Imports `obj` (a DLPack-speaking object or capsule) as the array called `name`. `None` gives
/// an absent Array when `may_be_none`, else an error. A CUDA array is exported with
/// `__dlpack__(stream=-1)`: the extension does not synchronize streams; the caller's arrays must
/// be ready on the call's stream (they are, when it is the stream that produced them).
/// \throws orthros::Error when `obj` speaks no DLPack or is None where an array is needed.
Array import_array(nb::handle obj, const char* name, bool may_be_none = false);

/// One expected axis of a shape: `label` is printed (e.g. "sum T_b"), `value` < 0 = any size.
struct Dim {
  const char* label;
  std::int64_t value;
};

/// Name of the array's DLPack dtype: "bf16", "f16", "f32", "f64", "int32", ... .
std::string dtype_name_of(const Array& a);
/// The array's dtype as a kernel dtype; \throws orthros::Error unless bf16 / f16 / f32.
cuda::DType activation_dtype(const Array& a);

/// \throws orthros::Error unless `a` is present (message: `a.name` + " must be an array " + why).
void require_present(const Array& a, const std::string& why);
/// \throws orthros::Error unless a present `a` has dtype `dt` (`what` names where it comes from,
///   e.g. "q's dtype").
void expect_dtype(const Array& a, cuda::DType dt, const char* what);
/// \throws orthros::Error unless a present `a` is float32.
void expect_float32(const Array& a);
/// \throws orthros::Error unless a present `a` has the shape `dims` (number of axes and every
///   axis with value >= 0), e.g. "q has shape [29, 4, 16]; expected [sum T_b = 29, H_q, D = 16]".
void expect_shape(const Array& a, std::initializer_list<Dim> dims);
/// \throws orthros::Error unless a present `a` is C-contiguous (axes of size 1 may have any
///   stride) and its data pointer is a multiple of `alignment` bytes.
void expect_layout(const Array& a, std::size_t alignment);
/// Presence, dtype, shape and layout in one call, for an activation array of dtype `dt`.
void expect_tensor(const Array& a, cuda::DType dt, const char* what, std::initializer_list<Dim> dims,
                   std::size_t alignment = 16);
/// \throws orthros::Error unless every present array is on a CUDA device (DLPack kDLCUDA) and
///   all of them on the same one. Returns that device (-1 when no array is present).
int require_cuda(const std::vector<const Array*>& arrays);
/// \throws orthros::Error when `device` (>= 0) is not the caller's current CUDA device; makes
///   the one CUDA runtime call of the checks (cudaGetDevice), so it comes after all others.
void require_current_device(int device, const std::vector<const Array*>& arrays);

/// Host-side per-sequence lengths: a list / tuple of ints or a 1-D CPU integer array.
/// \throws orthros::Error naming `name` on anything else (a CUDA array included: lengths are
///   read on the host) and on negative values.
std::vector<std::int64_t> parse_lengths(nb::handle obj, const char* name);
/// The batch layout of q_lens / out_lens / cache_lens, checked as the library does (same
/// count, 0 <= T_out_b <= T_b < 2^31, cache_lens[b] >= T_b) so the errors come before any
/// CUDA call.
cuda::BatchLayout parse_layout(nb::handle q_lens, nb::handle out_lens, nb::handle cache_lens);
/// \throws orthros::Error when some cache_lens[b] exceeds `capacity` (named after `cache_name`).
void require_capacity(const cuda::BatchLayout& layout, std::int64_t capacity, const char* cache_name);

/// "bf16" / "f16" / "f32" -> DType; \throws orthros::Error naming `dtype` otherwise.
cuda::DType parse_dtype(const std::string& s);
/// "automatic" / "hopper" / "generic" -> KernelPath; \throws orthros::Error otherwise.
cuda::KernelPath parse_kernel(const std::string& s);
/// The stream argument (a cudaStream_t handle value, 0 = legacy default stream).
/// \throws orthros::Error on a negative value.
cudaStream_t parse_stream(std::int64_t stream);

/// Shape as "[a, b, c]".
std::string shape_string(const std::vector<std::int64_t>& shape);

}  // namespace orthros::pycuda
