// orthros._cuda: the Orthros attention layer forward and backward of the CUDA library
// (cuda/include/orthros/cuda/layer.hpp, layer_backward.hpp) on DLPack arrays. The module entry
// (module.cpp) calls bind_layer().
//
// The functions take keyword arguments only: the LayerConfig fields (dtype, d_model,
// num_q_heads, num_kv_heads, head_dim, window, rope_theta, qk_norm, rms_eps, scale=None,
// deterministic=False, num_splits=0), the host-side lengths and the arrays (d = H_q*D,
// d_kv = H_kv*D, all in `dtype`, row-major):
//   x [sum T_b, d_model], x_out [sum T_out_b, d_model], w_q [d_model, d], w_k / w_v [d_model, d_kv],
//   w_o [d, d_model], alpha / beta / alpha_out / beta_out [d], q_norm / k_norm [D] (None when
//   qk_norm is off), k_cache / v_cache [B, capacity, H_kv, D], y [sum T_b, d_model],
//   y_out [sum T_out_b, d_model]; the backward's dy / dy_out (y's shapes) and gradients dx, dx_out,
//   dw_q, dw_k, dw_v, dw_o, dalpha, dbeta, dalpha_out, dbeta_out, dq_norm, dk_norm (the shapes of
//   what they differentiate). The cuBLAS handle is the extension's, one per device.
#include "dlpack_args.hpp"
#include "orthros/cuda/layer.hpp"
#include "orthros/cuda/layer_backward.hpp"

#include <cublas_v2.h>
#include <nanobind/stl/string.h>

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

namespace orthros::pycuda {

namespace {

const char* const kConfigKeys[] = {"dtype",    "d_model", "num_q_heads",   "num_kv_heads",
                                   "head_dim", "window",  "rope_theta",    "qk_norm",
                                   "rms_eps",  "scale",   "deterministic", "num_splits"};
const char* const kLayoutKeys[] = {"q_lens", "out_lens", "cache_lens"};
const char* const kWeightKeys[] = {"w_q",  "w_k",       "w_v",      "w_o",    "alpha",
                                   "beta", "alpha_out", "beta_out", "q_norm", "k_norm"};

/// Keyword arguments of one layer call: every key must be known, the required ones present.
class Kwargs {
 public:
  Kwargs(const char* fn, nb::kwargs kw, std::set<std::string> allowed) : fn_(fn), kw_(std::move(kw)) {
    for (auto [k, v] : kw_) {
      const std::string key = nb::cast<std::string>(k);
      if (!allowed.count(key))
        throw nb::type_error((fn_ + "() got an unexpected keyword argument '" + key + "'").c_str());
    }
  }
  bool has(const char* key) const { return PyDict_GetItemString(kw_.ptr(), key) != nullptr; }
  nb::handle get(const char* key) const {
    PyObject* v = PyDict_GetItemString(kw_.ptr(), key);  // borrowed: the dict outlives the call
    if (!v) throw nb::type_error((fn_ + "() missing required keyword argument '" + key + "'").c_str());
    return v;
  }
  /// The argument, or None when it was not given.
  nb::handle get_or_none(const char* key) const { return has(key) ? get(key) : nb::none(); }
  template <typename T>
  T value(const char* key) const {
    T out{};
    const nb::handle h = get(key);
    // An integer argument must be an int (or a NumPy / torch integer: __index__), not a str or float.
    const bool int_ok = !(std::is_integral_v<T> && !std::is_same_v<T, bool>) || PyIndex_Check(h.ptr());
    if (!int_ok || !nb::try_cast<T>(h, out)) {
      PyErr_Clear();
      throw Error(std::string(key) + " has the wrong type (got " + nb::type_name(get(key).type()).c_str() + ")");
    }
    return out;
  }
  template <typename T>
  T value_or(const char* key, T fallback) const {
    return has(key) && !get(key).is_none() ? value<T>(key) : fallback;
  }

 private:
  std::string fn_;
  nb::kwargs kw_;
};

using Names = std::vector<const char*>;
std::set<std::string> keys(std::initializer_list<Names> groups) {
  std::set<std::string> s{"stream", "workspace"};
  for (const Names& g : groups) s.insert(g.begin(), g.end());
  return s;
}
template <size_t N>
Names list(const char* const (&a)[N]) {
  return Names(a, a + N);
}

cuda::LayerConfig layer_config(const Kwargs& kw) {
  cuda::LayerConfig c;
  c.dtype = parse_dtype(kw.value<std::string>("dtype"));
  c.d_model = kw.value<std::int64_t>("d_model");
  c.num_q_heads = kw.value<int>("num_q_heads");
  c.num_kv_heads = kw.value<int>("num_kv_heads");
  c.head_dim = kw.value<int>("head_dim");
  c.window = kw.value<std::int64_t>("window");
  c.rope_theta = kw.value<double>("rope_theta");
  c.qk_norm = kw.value<bool>("qk_norm");
  c.rms_eps = kw.value<double>("rms_eps");
  if (kw.has("scale") && !kw.get("scale").is_none()) c.scale = kw.value<double>("scale");
  c.deterministic = kw.value_or<bool>("deterministic", false);
  c.num_splits = kw.value_or<int>("num_splits", 0);
  require(c.d_model >= 1 && c.num_q_heads >= 1 && c.num_kv_heads >= 1 && c.head_dim >= 1,
          "d_model, num_q_heads, num_kv_heads and head_dim must be >= 1 (got ", c.d_model, ", ", c.num_q_heads, ", ",
          c.num_kv_heads, ", ", c.head_dim, ")");
  return c;
}

cuda::BatchLayout layer_layout(const Kwargs& kw) {
  const nb::handle q_lens = kw.get("q_lens"), out_lens = kw.get("out_lens"), cache_lens = kw.get("cache_lens");
  return parse_layout(q_lens, out_lens, cache_lens);
}

const char* const kGradKeys[] = {"dw_q",  "dw_k",       "dw_v",      "dw_o",    "dalpha",
                                 "dbeta", "dalpha_out", "dbeta_out", "dq_norm", "dk_norm"};

/// The weight arrays (names: kWeightKeys) or their gradients (kGradKeys), shapes checked
/// against the config.
struct Weights {
  Array w_q, w_k, w_v, w_o, alpha, beta, alpha_out, beta_out, q_norm, k_norm;
  Weights(const Kwargs& kw, const cuda::LayerConfig& c, const char* const (&n)[10])
      : w_q(import_array(kw.get(n[0]), n[0])),
        w_k(import_array(kw.get(n[1]), n[1])),
        w_v(import_array(kw.get(n[2]), n[2])),
        w_o(import_array(kw.get(n[3]), n[3])),
        alpha(import_array(kw.get(n[4]), n[4])),
        beta(import_array(kw.get(n[5]), n[5])),
        alpha_out(import_array(kw.get(n[6]), n[6])),
        beta_out(import_array(kw.get(n[7]), n[7])),
        q_norm(import_array(c.qk_norm ? kw.get(n[8]) : kw.get_or_none(n[8]), n[8], !c.qk_norm)),
        k_norm(import_array(c.qk_norm ? kw.get(n[9]) : kw.get_or_none(n[9]), n[9], !c.qk_norm)) {
    const std::int64_t d = std::int64_t(c.num_q_heads) * c.head_dim, dkv = std::int64_t(c.num_kv_heads) * c.head_dim;
    const char* what = "the layer's dtype";
    expect_tensor(w_q, c.dtype, what, {{"d_model", c.d_model}, {"H_q*D", d}});
    expect_tensor(w_k, c.dtype, what, {{"d_model", c.d_model}, {"H_kv*D", dkv}});
    expect_tensor(w_v, c.dtype, what, {{"d_model", c.d_model}, {"H_kv*D", dkv}});
    expect_tensor(w_o, c.dtype, what, {{"H_q*D", d}, {"d_model", c.d_model}});
    for (const Array* a : {&alpha, &beta, &alpha_out, &beta_out}) expect_tensor(*a, c.dtype, what, {{"H_q*D", d}});
    for (const Array* a : {&q_norm, &k_norm}) expect_tensor(*a, c.dtype, what, {{"D", c.head_dim}});
  }
  void append_to(std::vector<const Array*>& v) const {
    for (const Array* a : {&w_q, &w_k, &w_v, &w_o, &alpha, &beta, &alpha_out, &beta_out, &q_norm, &k_norm})
      v.push_back(a);
  }
};

cuda::LayerWeightsDevice weights_device(const Weights& w) {
  cuda::LayerWeightsDevice d;
  d.w_q = w.w_q.data;
  d.w_k = w.w_k.data;
  d.w_v = w.w_v.data;
  d.w_o = w.w_o.data;
  d.alpha = w.alpha.data;
  d.beta = w.beta.data;
  d.alpha_out = w.alpha_out.data;
  d.beta_out = w.beta_out.data;
  d.q_norm = w.q_norm.data;
  d.k_norm = w.k_norm.data;
  return d;
}

/// The extension's cuBLAS handle of the current device (created on first use, never destroyed:
/// it lives as long as the process) with the lock that serializes its use: the library sets the
/// handle's stream and math mode for a call, so two calls must not share it concurrently.
struct LockedHandle {
  cublasHandle_t handle;
  std::unique_lock<std::mutex> lock;
};
LockedHandle cublas_handle() {
  static std::mutex mu;
  static std::map<int, cublasHandle_t> handles;
  int dev = 0;
  const cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) throw cuda::CudaError(std::string("cudaGetDevice: ") + cudaGetErrorString(e));
  std::unique_lock<std::mutex> lock(mu);
  cublasHandle_t& h = handles[dev];
  if (!h) {
    const cublasStatus_t s = cublasCreate(&h);
    if (s != CUBLAS_STATUS_SUCCESS) {
      h = nullptr;
      throw cuda::CublasError(std::string("cublasCreate: ") + cublasGetStatusString(s));
    }
  }
  return LockedHandle{h, std::move(lock)};
}

/// Scratch of a layer call: the caller's workspace, or (None) one allocated on the stream for
/// the call and freed on it afterwards (stream-ordered, so it is safe without a sync).
class Scratch {
 public:
  Scratch(const Array& ws, std::size_t needed, cudaStream_t stream) : stream_(stream) {
    if (ws.present) {
      ptr_ = ws.data;
      bytes_ = static_cast<std::size_t>(ws.nbytes());
      return;
    }
    if (needed == 0) return;
    const cudaError_t e = cudaMallocAsync(&owned_, needed, stream);
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw cuda::CudaError("cudaMallocAsync of the layer workspace (" + std::to_string(needed) +
                            " bytes): " + cudaGetErrorString(e));
    }
    ptr_ = owned_;
    bytes_ = needed;
  }
  ~Scratch() {
    if (owned_) cudaFreeAsync(owned_, stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* ptr() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }

 private:
  cudaStream_t stream_;
  void* owned_ = nullptr;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

std::size_t layer_workspace_bytes(nb::kwargs kwargs) {
  const Kwargs kw("layer_workspace_bytes", std::move(kwargs), keys({list(kConfigKeys), list(kLayoutKeys)}));
  return cuda::attention_layer_workspace_bytes(layer_config(kw), layer_layout(kw));
}

std::size_t layer_backward_workspace_bytes(nb::kwargs kwargs) {
  const Kwargs kw("layer_backward_workspace_bytes", std::move(kwargs), keys({list(kConfigKeys), list(kLayoutKeys)}));
  return cuda::attention_layer_backward_workspace_bytes(layer_config(kw), layer_layout(kw));
}

void layer_forward(nb::kwargs kwargs) {
  const Kwargs kw("layer_forward", std::move(kwargs),
                  keys({list(kConfigKeys), list(kLayoutKeys), list(kWeightKeys),
                        Names{"x", "x_out", "k_cache", "v_cache", "y", "y_out"}}));
  const cuda::LayerConfig c = layer_config(kw);
  const cuda::BatchLayout layout = layer_layout(kw);
  const cudaStream_t st = parse_stream(kw.value_or<std::int64_t>("stream", 0));
  const std::int64_t tq = layout.total_q(), to = layout.total_out();
  const Array x = import_array(kw.get("x"), "x"), x_out = import_array(kw.get_or_none("x_out"), "x_out", to == 0),
              k_cache = import_array(kw.get("k_cache"), "k_cache"),
              v_cache = import_array(kw.get("v_cache"), "v_cache"), y = import_array(kw.get("y"), "y"),
              y_out = import_array(kw.get_or_none("y_out"), "y_out", to == 0),
              ws = import_array(kw.get_or_none("workspace"), "workspace", true);
  const Weights w(kw, c, kWeightKeys);
  const char* what = "the layer's dtype";
  expect_tensor(x, c.dtype, what, {{"sum T_b", tq}, {"d_model", c.d_model}});
  expect_tensor(x_out, c.dtype, what, {{"sum T_out_b", to}, {"d_model", c.d_model}});
  expect_tensor(k_cache, c.dtype, what,
                {{"B = len(q_lens)", layout.batch()}, {"capacity", -1}, {"H_kv", c.num_kv_heads}, {"D", c.head_dim}});
  const std::int64_t cap = k_cache.shape[1];
  expect_tensor(v_cache, c.dtype, what,
                {{"B", layout.batch()}, {"capacity", cap}, {"H_kv", c.num_kv_heads}, {"D", c.head_dim}});
  expect_tensor(y, c.dtype, what, {{"sum T_b", tq}, {"d_model", c.d_model}});
  expect_tensor(y_out, c.dtype, what, {{"sum T_out_b", to}, {"d_model", c.d_model}});
  expect_layout(ws, 256);
  require_capacity(layout, cap, "k_cache/v_cache");
  std::vector<const Array*> all{&x, &x_out, &k_cache, &v_cache, &y, &y_out, &ws};
  w.append_to(all);
  require_current_device(require_cuda(all), all);

  cuda::LayerBuffers b;
  b.x = x.data;
  b.x_out = x_out.data;
  b.k_cache = k_cache.data;
  b.v_cache = v_cache.data;
  b.capacity = cap;
  b.y = y.data;
  b.y_out = y_out.data;
  const cuda::LayerWeightsDevice wd = weights_device(w);
  nb::gil_scoped_release release;
  const std::size_t need = ws.present ? 0 : cuda::attention_layer_workspace_bytes(c, layout);
  Scratch scratch(ws, need, st);
  b.workspace = scratch.ptr();
  b.workspace_bytes = scratch.bytes();
  LockedHandle h = cublas_handle();
  cuda::attention_layer_forward(c, layout, wd, b, h.handle, st);
}

void layer_backward(nb::kwargs kwargs) {
  const Kwargs kw("layer_backward", std::move(kwargs),
                  keys({list(kConfigKeys), list(kLayoutKeys), list(kWeightKeys), list(kGradKeys),
                        Names{"x", "x_out", "dy", "dy_out", "dx", "dx_out"}}));
  const cuda::LayerConfig c = layer_config(kw);
  const cuda::BatchLayout layout = layer_layout(kw);
  for (int i = 0; i < layout.batch(); ++i)
    require(layout.cache_lens[i] == layout.q_lens[i], "the backward is for training sequences (P = 0): cache_lens[", i,
            "] must equal q_lens[", i, "] = ", layout.q_lens[i], " (got ", layout.cache_lens[i], ")");
  const cudaStream_t st = parse_stream(kw.value_or<std::int64_t>("stream", 0));
  const std::int64_t tq = layout.total_q(), to = layout.total_out();
  const bool none_ok = to == 0;
  const Array x = import_array(kw.get("x"), "x"), x_out = import_array(kw.get_or_none("x_out"), "x_out", none_ok),
              dy = import_array(kw.get("dy"), "dy"), dy_out = import_array(kw.get_or_none("dy_out"), "dy_out", none_ok),
              dx = import_array(kw.get("dx"), "dx"), dx_out = import_array(kw.get_or_none("dx_out"), "dx_out", none_ok),
              ws = import_array(kw.get_or_none("workspace"), "workspace", true);
  const Weights w(kw, c, kWeightKeys), g(kw, c, kGradKeys);
  const char* what = "the layer's dtype";
  for (const Array* a : {&x, &dy, &dx}) expect_tensor(*a, c.dtype, what, {{"sum T_b", tq}, {"d_model", c.d_model}});
  for (const Array* a : {&x_out, &dy_out, &dx_out})
    expect_tensor(*a, c.dtype, what, {{"sum T_out_b", to}, {"d_model", c.d_model}});
  expect_layout(ws, 256);
  std::vector<const Array*> all{&x, &x_out, &dy, &dy_out, &dx, &dx_out, &ws};
  w.append_to(all);
  g.append_to(all);
  require_current_device(require_cuda(all), all);

  cuda::LayerBackwardBuffers b;
  b.x = x.data;
  b.x_out = x_out.data;
  b.dy = dy.data;
  b.dy_out = dy_out.data;
  b.grads.dx = dx.data;
  b.grads.dx_out = dx_out.data;
  b.grads.w_q = g.w_q.data;
  b.grads.w_k = g.w_k.data;
  b.grads.w_v = g.w_v.data;
  b.grads.w_o = g.w_o.data;
  b.grads.alpha = g.alpha.data;
  b.grads.beta = g.beta.data;
  b.grads.alpha_out = g.alpha_out.data;
  b.grads.beta_out = g.beta_out.data;
  b.grads.q_norm = g.q_norm.data;
  b.grads.k_norm = g.k_norm.data;
  const cuda::LayerWeightsDevice wd = weights_device(w);
  nb::gil_scoped_release release;
  const std::size_t need = ws.present ? 0 : cuda::attention_layer_backward_workspace_bytes(c, layout);
  Scratch scratch(ws, need, st);
  b.workspace = scratch.ptr();
  b.workspace_bytes = scratch.bytes();
  LockedHandle h = cublas_handle();
  cuda::attention_layer_backward(c, layout, wd, b, h.handle, st);
}

}  // namespace

void bind_layer(nb::module_& m) {
  m.def("layer_workspace_bytes", &layer_workspace_bytes,
        "layer_workspace_bytes(*, dtype, d_model, num_q_heads, num_kv_heads, head_dim, window, rope_theta, "
        "qk_norm, rms_eps, scale=None, deterministic=False, num_splits=0, q_lens, out_lens, cache_lens) -> int\n\n"
        "Scratch bytes layer_forward needs (the workspace must be 256-byte aligned). Raises orthros.Error on "
        "invalid arguments.");
  m.def("layer_forward", &layer_forward,
        "layer_forward(*, <LayerConfig fields>, x, x_out, w_q, w_k, w_v, w_o, alpha, beta, alpha_out, beta_out, "
        "q_norm, k_norm, k_cache, v_cache, y, y_out, workspace=None, q_lens, out_lens, cache_lens, stream=0)\n\n"
        "One Orthros attention layer (paper Algorithm 1; SPEC §2), asynchronous on `stream`: q, q' through "
        "W_Q, QK-norm, the scale-offsets and RoPE; k = RoPE(norm_k(x W_K)) and v = x W_V appended to the cache "
        "(rows cache_lens[b] - q_lens[b] .. cache_lens[b] - 1, mutated); y = o W_O, y_out = o' W_O. Shapes: "
        "x [sum T_b, d_model], x_out [sum T_out_b, d_model] (None when sum T_out_b = 0), w_q [d_model, H_q*D], "
        "w_k / w_v [d_model, H_kv*D], w_o [H_q*D, d_model], alpha/beta/alpha_out/beta_out [H_q*D], q_norm/"
        "k_norm [D] (None when qk_norm is False), k_cache/v_cache [B, capacity, H_kv, D], y / y_out as x / "
        "x_out; all in `dtype` on the current CUDA device, C-contiguous, 16-byte aligned (workspace: 256). "
        "workspace None: allocated on the stream for the call. Raises orthros.Error naming the argument on bad "
        "input, RuntimeError when a CUDA or cuBLAS call fails.");
  m.def("layer_backward_workspace_bytes", &layer_backward_workspace_bytes,
        "layer_backward_workspace_bytes(*, <LayerConfig fields>, q_lens, out_lens, cache_lens) -> int\n\n"
        "Scratch bytes layer_backward needs (256-byte aligned). Raises orthros.Error on invalid arguments.");
  m.def("layer_backward", &layer_backward,
        "layer_backward(*, <LayerConfig fields>, x, x_out, dy, dy_out, w_q, w_k, w_v, w_o, alpha, beta, "
        "alpha_out, beta_out, q_norm, k_norm, dx, dx_out, dw_q, dw_k, dw_v, dw_o, dalpha, dbeta, dalpha_out, "
        "dbeta_out, dq_norm, dk_norm, workspace=None, q_lens, out_lens, cache_lens, stream=0)\n\n"
        "Gradients of the layer (SPEC §9) for training sequences (P = 0: cache_lens == q_lens), the forward "
        "recomputed inside; every gradient is overwritten (weights' summed over the batch), each with the "
        "shape of what it differentiates (dq_norm/dk_norm None when qk_norm is False). Deterministic. Raises "
        "orthros.Error naming the argument on bad input, RuntimeError when a CUDA or cuBLAS call fails.");
}

}  // namespace orthros::pycuda
