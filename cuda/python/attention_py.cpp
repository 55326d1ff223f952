// orthros._cuda: the attention operator, its backward and the KV-cache append of the CUDA
// library (cuda/include/orthros/cuda/attention.hpp, attention_backward.hpp) on DLPack arrays.
// The module entry (module.cpp) calls bind_attention().
//
// Shapes follow the library's layouts (SPEC §5): q/o/d_o/dq [sum T_b, H_q, D], q_out/o_out/
// d_o_out/dq_out [sum T_out_b, H_q, D], k_cache/v_cache [B, capacity, H_kv, D], lse
// [sum T_b, H_q], lse_out [sum T_out_b, H_q] (float32), dk/dv and k_new/v_new [sum T_b, H_kv, D].
// H_q and D are read from q's shape, B/capacity/H_kv from k_cache's; every other array is
// checked against them and against the host-side lengths before any CUDA call.
#include "dlpack_args.hpp"
#include "orthros/cuda/attention.hpp"
#include "orthros/cuda/attention_backward.hpp"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <exception>
#include <optional>
#include <string>

namespace orthros::pycuda {

namespace {

using nb::arg;

/// Sizes read from q [sum T_b, H_q, D] and k_cache [B, capacity, H_kv, D].
struct Dims {
  cuda::DType dtype;
  std::int64_t heads_q, heads_kv, head_dim, capacity;
};

/// Checks q and k_cache / v_cache (the arrays that define the sizes) and returns the sizes.
Dims query_and_cache_dims(const Array& q, const Array& k_cache, const Array& v_cache, const cuda::BatchLayout& layout) {
  const cuda::DType dt = activation_dtype(q);
  expect_shape(q, {{"sum T_b", layout.total_q()}, {"H_q", -1}, {"D", -1}});
  const std::int64_t hq = q.shape[1], d = q.shape[2];
  expect_dtype(k_cache, dt, "q's dtype");
  expect_shape(k_cache, {{"B = len(q_lens)", layout.batch()}, {"capacity", -1}, {"H_kv", -1}, {"D", d}});
  const std::int64_t cap = k_cache.shape[1], hkv = k_cache.shape[2];
  expect_tensor(v_cache, dt, "q's dtype", {{"B", layout.batch()}, {"capacity", cap}, {"H_kv", hkv}, {"D", d}});
  expect_layout(q, 16);
  expect_layout(k_cache, 16);
  require_capacity(layout, cap, "k_cache/v_cache");
  return Dims{dt, hq, hkv, d, cap};
}

/// The library's AttentionConfig of one call (the forward, the backward and the workspace-size
/// queries build it here; the library validates the values).
cuda::AttentionConfig attention_config(cuda::DType dtype, std::int64_t num_q_heads, std::int64_t num_kv_heads,
                                       std::int64_t head_dim, std::int64_t window, std::optional<double> scale,
                                       bool deterministic, int num_splits, cuda::KernelPath kernel) {
  cuda::AttentionConfig cfg;
  cfg.dtype = dtype;
  cfg.num_q_heads = static_cast<int>(num_q_heads);
  cfg.num_kv_heads = static_cast<int>(num_kv_heads);
  cfg.head_dim = static_cast<int>(head_dim);
  cfg.window = window;
  cfg.scale = scale;
  cfg.deterministic = deterministic;
  cfg.num_splits = num_splits;
  cfg.kernel = kernel;
  return cfg;
}

std::size_t workspace_size(const Array& ws) { return static_cast<std::size_t>(ws.nbytes()); }

void attention_forward(nb::handle q_, nb::handle q_out_, nb::handle k_cache_, nb::handle v_cache_, nb::handle o_,
                       nb::handle o_out_, nb::handle lse_, nb::handle lse_out_, nb::handle workspace_,
                       nb::handle q_lens, nb::handle out_lens, nb::handle cache_lens, std::int64_t window,
                       std::optional<double> scale, bool deterministic, int num_splits, const std::string& kernel,
                       std::int64_t stream) {
  const cuda::BatchLayout layout = parse_layout(q_lens, out_lens, cache_lens);
  const std::int64_t tq = layout.total_q(), to = layout.total_out();
  const cuda::KernelPath path = parse_kernel(kernel);
  const cudaStream_t st = parse_stream(stream);
  const Array q = import_array(q_, "q"), q_out = import_array(q_out_, "q_out", to == 0),
              k_cache = import_array(k_cache_, "k_cache"), v_cache = import_array(v_cache_, "v_cache"),
              o = import_array(o_, "o"), o_out = import_array(o_out_, "o_out", to == 0),
              lse = import_array(lse_, "lse", true), lse_out = import_array(lse_out_, "lse_out", true),
              ws = import_array(workspace_, "workspace", true);
  const Dims d = query_and_cache_dims(q, k_cache, v_cache, layout);
  expect_tensor(q_out, d.dtype, "q's dtype", {{"sum T_out_b", to}, {"H_q", d.heads_q}, {"D", d.head_dim}});
  expect_tensor(o, d.dtype, "q's dtype", {{"sum T_b", tq}, {"H_q", d.heads_q}, {"D", d.head_dim}});
  expect_tensor(o_out, d.dtype, "q's dtype", {{"sum T_out_b", to}, {"H_q", d.heads_q}, {"D", d.head_dim}});
  expect_float32(lse);
  expect_shape(lse, {{"sum T_b", tq}, {"H_q", d.heads_q}});
  expect_layout(lse, 16);
  expect_float32(lse_out);
  expect_shape(lse_out, {{"sum T_out_b", to}, {"H_q", d.heads_q}});
  expect_layout(lse_out, 16);
  expect_layout(ws, 16);
  const std::vector<const Array*> all{&q, &q_out, &k_cache, &v_cache, &o, &o_out, &lse, &lse_out, &ws};
  require_current_device(require_cuda(all), all);

  const cuda::AttentionConfig cfg =
      attention_config(d.dtype, d.heads_q, d.heads_kv, d.head_dim, window, scale, deterministic, num_splits, path);
  cuda::AttentionBuffers buf;
  buf.q = q.data;
  buf.q_out = q_out.data;
  buf.k_cache = k_cache.data;
  buf.v_cache = v_cache.data;
  buf.capacity = d.capacity;
  buf.o = o.data;
  buf.o_out = o_out.data;
  buf.lse = static_cast<float*>(lse.data);
  buf.lse_out = static_cast<float*>(lse_out.data);
  buf.workspace = ws.data;
  buf.workspace_bytes = workspace_size(ws);
  nb::gil_scoped_release release;
  cuda::attention_forward(cfg, layout, buf, st);
}

void attention_backward(nb::handle q_, nb::handle q_out_, nb::handle k_cache_, nb::handle v_cache_, nb::handle o_,
                        nb::handle o_out_, nb::handle lse_, nb::handle lse_out_, nb::handle d_o_, nb::handle d_o_out_,
                        nb::handle dq_, nb::handle dq_out_, nb::handle dk_, nb::handle dv_, nb::handle workspace_,
                        nb::handle q_lens, nb::handle out_lens, nb::handle cache_lens, std::int64_t window,
                        std::optional<double> scale, bool deterministic, std::int64_t stream) {
  const cuda::BatchLayout layout = parse_layout(q_lens, out_lens, cache_lens);
  for (int b = 0; b < layout.batch(); ++b)
    require(layout.cache_lens[b] == layout.q_lens[b], "the backward is for training sequences (P = 0): cache_lens[", b,
            "] must equal q_lens[", b, "] = ", layout.q_lens[b], " (got ", layout.cache_lens[b],
            ", i.e. P = ", layout.cache_lens[b] - layout.q_lens[b], " cached tokens)");
  const std::int64_t tq = layout.total_q(), to = layout.total_out();
  const cudaStream_t st = parse_stream(stream);
  const bool none_ok = to == 0;
  const Array q = import_array(q_, "q"), q_out = import_array(q_out_, "q_out", none_ok),
              k_cache = import_array(k_cache_, "k_cache"), v_cache = import_array(v_cache_, "v_cache"),
              o = import_array(o_, "o"), o_out = import_array(o_out_, "o_out", none_ok),
              lse = import_array(lse_, "lse"), lse_out = import_array(lse_out_, "lse_out", none_ok),
              d_o = import_array(d_o_, "d_o"), d_o_out = import_array(d_o_out_, "d_o_out", none_ok),
              dq = import_array(dq_, "dq"), dq_out = import_array(dq_out_, "dq_out", none_ok),
              dk = import_array(dk_, "dk"), dv = import_array(dv_, "dv"),
              ws = import_array(workspace_, "workspace", true);
  const Dims d = query_and_cache_dims(q, k_cache, v_cache, layout);
  const char* same = "q's dtype";
  for (const Array* a : {&o, &d_o, &dq})
    expect_tensor(*a, d.dtype, same, {{"sum T_b", tq}, {"H_q", d.heads_q}, {"D", d.head_dim}});
  for (const Array* a : {&q_out, &o_out, &d_o_out, &dq_out})
    expect_tensor(*a, d.dtype, same, {{"sum T_out_b", to}, {"H_q", d.heads_q}, {"D", d.head_dim}});
  for (const Array* a : {&dk, &dv})
    expect_tensor(*a, d.dtype, same,
                  {{"sum T_b (packed, not the cache layout)", tq}, {"H_kv", d.heads_kv}, {"D", d.head_dim}});
  expect_float32(lse);
  expect_shape(lse, {{"sum T_b", tq}, {"H_q", d.heads_q}});
  expect_layout(lse, 16);
  expect_float32(lse_out);
  expect_shape(lse_out, {{"sum T_out_b", to}, {"H_q", d.heads_q}});
  expect_layout(lse_out, 16);
  expect_layout(ws, 16);
  const std::vector<const Array*> all{&q,   &q_out,   &k_cache, &v_cache, &o,  &o_out, &lse, &lse_out,
                                      &d_o, &d_o_out, &dq,      &dq_out,  &dk, &dv,    &ws};
  require_current_device(require_cuda(all), all);

  const cuda::AttentionConfig cfg = attention_config(d.dtype, d.heads_q, d.heads_kv, d.head_dim, window, scale,
                                                    deterministic, 0, cuda::KernelPath::automatic);
  cuda::AttentionBackwardBuffers buf;
  buf.q = q.data;
  buf.q_out = q_out.data;
  buf.k_cache = k_cache.data;
  buf.v_cache = v_cache.data;
  buf.capacity = d.capacity;
  buf.o = o.data;
  buf.o_out = o_out.data;
  buf.lse = static_cast<const float*>(lse.data);
  buf.lse_out = static_cast<const float*>(lse_out.data);
  buf.d_o = d_o.data;
  buf.d_o_out = d_o_out.data;
  buf.dq = dq.data;
  buf.dq_out = dq_out.data;
  buf.dk = dk.data;
  buf.dv = dv.data;
  buf.workspace = ws.data;
  buf.workspace_bytes = workspace_size(ws);
  nb::gil_scoped_release release;
  cuda::attention_backward(cfg, layout, buf, st);
}

void rope_append_kv(nb::handle k_new_, nb::handle v_new_, nb::handle k_cache_, nb::handle v_cache_, nb::handle q_,
                    nb::handle q_out_, nb::handle q_lens, nb::handle out_lens, nb::handle cache_lens, double theta,
                    std::int64_t position_offset, int num_q_heads, std::int64_t stream) {
  const cuda::BatchLayout layout = parse_layout(q_lens, out_lens, cache_lens);
  const std::int64_t tq = layout.total_q(), to = layout.total_out();
  const cudaStream_t st = parse_stream(stream);
  const Array k_new = import_array(k_new_, "k_new"), v_new = import_array(v_new_, "v_new"),
              k_cache = import_array(k_cache_, "k_cache"), v_cache = import_array(v_cache_, "v_cache"),
              q = import_array(q_, "q", true), q_out = import_array(q_out_, "q_out", true);
  const cuda::DType dt = activation_dtype(k_cache);
  expect_shape(k_cache, {{"B = len(q_lens)", layout.batch()}, {"capacity", -1}, {"H_kv", -1}, {"D", -1}});
  expect_layout(k_cache, 16);
  const std::int64_t cap = k_cache.shape[1], hkv = k_cache.shape[2], d = k_cache.shape[3];
  const char* same = "k_cache's dtype";
  expect_tensor(v_cache, dt, same, {{"B", layout.batch()}, {"capacity", cap}, {"H_kv", hkv}, {"D", d}});
  expect_tensor(k_new, dt, same, {{"sum T_b", tq}, {"H_kv", hkv}, {"D", d}});
  expect_tensor(v_new, dt, same, {{"sum T_b", tq}, {"H_kv", hkv}, {"D", d}});
  expect_tensor(q, dt, same, {{"sum T_b", tq}, {"H_q = num_q_heads", num_q_heads}, {"D", d}});
  if (q_out.present && to > 0) require(q.present, "q_out is rotated together with q: pass q too (got q = None)");
  expect_tensor(q_out, dt, same, {{"sum T_out_b", to}, {"H_q = num_q_heads", num_q_heads}, {"D", d}});
  require_capacity(layout, cap, "k_cache/v_cache");
  const std::vector<const Array*> all{&k_new, &v_new, &k_cache, &v_cache, &q, &q_out};
  require_current_device(require_cuda(all), all);
  nb::gil_scoped_release release;
  cuda::rope_append_kv(dt, layout, num_q_heads, static_cast<int>(hkv), static_cast<int>(d), k_new.data, v_new.data,
                       k_cache.data, v_cache.data, cap, theta, position_offset, q.data, to > 0 ? q_out.data : nullptr,
                       st);
}

cuda::AttentionConfig config_of(const std::string& dtype, int num_q_heads, int num_kv_heads, int head_dim,
                                std::int64_t window, bool deterministic, int num_splits, const std::string& kernel) {
  return attention_config(parse_dtype(dtype), num_q_heads, num_kv_heads, head_dim, window, std::nullopt,
                          deterministic, num_splits, parse_kernel(kernel));
}

}  // namespace

void bind_attention(nb::module_& m) {
  m.def(
      "hopper_kernels_available",
      [] {
        try {
          return cuda::hopper_kernels_available();  // false without a usable device
        } catch (const std::exception&) {           // e.g. out of host memory: still an answer
          return false;
        }
      },
      "True when the current CUDA device runs the Hopper (sm_90a wgmma) kernels; False when it does "
      "not or when no GPU/driver is usable (never raises).");

  m.def(
      "attention_workspace_bytes",
      [](const std::string& dtype, int num_q_heads, int num_kv_heads, int head_dim, std::int64_t window,
         bool deterministic, int num_splits, nb::handle q_lens, nb::handle out_lens, nb::handle cache_lens,
         const std::string& kernel) {
        const cuda::BatchLayout layout = parse_layout(q_lens, out_lens, cache_lens);
        const auto cfg =
            config_of(dtype, num_q_heads, num_kv_heads, head_dim, window, deterministic, num_splits, kernel);
        return cuda::attention_workspace_bytes(cfg, layout);
      },
      nb::kw_only(), arg("dtype"), arg("num_q_heads"), arg("num_kv_heads"), arg("head_dim"), arg("window"),
      arg("deterministic") = false, arg("num_splits") = 0, arg("q_lens").none(), arg("out_lens").none(),
      arg("cache_lens").none(), arg("kernel") = "automatic",
      "Bytes of split-KV scratch attention_forward needs for this call (0 when it does not split). The "
      "split heuristic reads the current device's SM count (a CUDA call). Raises orthros.Error on invalid "
      "arguments.");

  m.def("attention_forward", &attention_forward, nb::kw_only(), arg("q").none(), arg("q_out").none() = nb::none(),
        arg("k_cache").none(), arg("v_cache").none(), arg("o").none(), arg("o_out").none() = nb::none(),
        arg("lse").none() = nb::none(), arg("lse_out").none() = nb::none(), arg("workspace").none() = nb::none(),
        arg("q_lens").none(), arg("out_lens").none(), arg("cache_lens").none(), arg("window"),
        arg("scale").none() = nb::none(), arg("deterministic") = false, arg("num_splits") = 0,
        arg("kernel") = "automatic", arg("stream") = 0,
        R"doc(The Orthros attention operator (paper Eq. 2; SPEC §2, §5) on the GPU, asynchronous on `stream`.

q [sum T_b, H_q, D], q_out [sum T_out_b, H_q, D] (None when sum T_out_b = 0), k_cache / v_cache
[B, capacity, H_kv, D] (rows 0 .. cache_lens[b]-1 of sequence b hold keys / values, this call's
tokens included), outputs o [sum T_b, H_q, D], o_out [sum T_out_b, H_q, D] (q's dtype: bf16, f16
or f32), lse [sum T_b, H_q], lse_out [sum T_out_b, H_q] (float32, natural log; None: not written).
workspace: attention_workspace_bytes() bytes of any dtype, or None (the library's internal buffer,
not CUDA-graph capturable). q_lens / out_lens / cache_lens: host-side per-sequence T_b, T_out_b and
P_b + T_b. window w >= 1 keys including the current token; scale defaults to 1/sqrt(D). stream: a
cudaStream_t handle value (0: the legacy default stream); arrays are not synchronized across
streams (they must be ready on `stream`). Every array is a CUDA array on the current device,
C-contiguous, 16-byte aligned. Raises orthros.Error naming the argument on bad input (before any
CUDA call), RuntimeError when a CUDA call fails.)doc");

  m.def(
      "attention_backward_workspace_bytes",
      [](const std::string& dtype, int num_q_heads, int num_kv_heads, int head_dim, std::int64_t window,
         bool deterministic, nb::handle q_lens, nb::handle out_lens, nb::handle cache_lens) {
        const cuda::BatchLayout layout = parse_layout(q_lens, out_lens, cache_lens);
        const auto cfg = config_of(dtype, num_q_heads, num_kv_heads, head_dim, window, deterministic, 0, "automatic");
        return cuda::attention_backward_workspace_bytes(cfg, layout);
      },
      nb::kw_only(), arg("dtype"), arg("num_q_heads"), arg("num_kv_heads"), arg("head_dim"), arg("window"),
      arg("deterministic") = false, arg("q_lens").none(), arg("out_lens").none(), arg("cache_lens").none(),
      "Bytes of scratch attention_backward needs: 8 * (sum T_b + sum T_out_b) * H_q. Raises orthros.Error "
      "on invalid arguments.");

  m.def("attention_backward", &attention_backward, nb::kw_only(), arg("q").none(), arg("q_out").none() = nb::none(),
        arg("k_cache").none(), arg("v_cache").none(), arg("o").none(), arg("o_out").none() = nb::none(),
        arg("lse").none(), arg("lse_out").none() = nb::none(), arg("d_o").none(), arg("d_o_out").none() = nb::none(),
        arg("dq").none(), arg("dq_out").none() = nb::none(), arg("dk").none(), arg("dv").none(),
        arg("workspace").none() = nb::none(), arg("q_lens").none(), arg("out_lens").none(), arg("cache_lens").none(),
        arg("window"), arg("scale").none() = nb::none(), arg("deterministic") = false, arg("stream") = 0,
        R"doc(Gradients of the Orthros attention operator (SPEC §9) for training sequences (P = 0:
cache_lens == q_lens; PT T_out = T, SFT 0 < T_out < T), asynchronous on `stream`.

Inputs as attention_forward took / wrote them (q, q_out, k_cache, v_cache, o, o_out, lse, lse_out)
and the upstream gradients d_o [sum T_b, H_q, D], d_o_out [sum T_out_b, H_q, D]; outputs dq, dq_out
(q's shapes) and dk, dv [sum T_b, H_kv, D] PACKED like the projections' outputs (row q_off_b + j =
cache row j of sequence b), not the cache layout. Out-stream arrays may be None when sum T_out_b =
0. workspace: attention_backward_workspace_bytes() bytes or None (then allocated on the stream).
dk and dv are bitwise reproducible in both modes; dq and dq_out in the deterministic mode (the
Hopper fast mode adds dq in float32 in no fixed order: docs/cuda.md). Raises orthros.Error naming the argument on bad input (P > 0
included), RuntimeError when a CUDA call fails.)doc");

  m.def("rope_append_kv", &rope_append_kv, nb::kw_only(), arg("k_new").none(), arg("v_new").none(),
        arg("k_cache").none(), arg("v_cache").none(), arg("q").none() = nb::none(), arg("q_out").none() = nb::none(),
        arg("q_lens").none(), arg("out_lens").none(), arg("cache_lens").none(), arg("theta"),
        arg("position_offset") = 0, arg("num_q_heads"), arg("stream") = 0,
        R"doc(KV-cache append fused with RoPE (rotate-half, SPEC §2), asynchronous on `stream`.

Copies k_new / v_new [sum T_b, H_kv, D] into cache rows cache_lens[b] - q_lens[b] .. cache_lens[b] - 1
of k_cache / v_cache [B, capacity, H_kv, D] (mutated); with theta > 0 the keys are rotated with
position = cache row + position_offset (0-based), and q [sum T_b, H_q, D] / q_out
[sum T_out_b, H_q, D] (when given; H_q = num_q_heads) are rotated in place with the same positions
(q_out: the last T_out_b positions of each sequence). theta = 0: plain append, nothing rotated;
theta < 0 or non-finite is an error.
Raises orthros.Error naming the argument on bad input, RuntimeError when a CUDA call fails.)doc");
}

}  // namespace orthros::pycuda
