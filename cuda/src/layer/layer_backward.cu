// Backward of the Orthros attention layer on the GPU (SPEC §9; the CPU oracle is
// reference/include/orthros/layer_backward.hpp): the recomputed forward (layer_stages.cuh),
// cuBLAS for every projection gradient, attention_backward() for the operator, and two kernels:
// the per-(row, head) backward of RoPE + scale-offset + QK RMSNorm, and a two-stage fixed-order
// column sum for the parameter reductions (dα, dβ, the QK-norm gains).
#include "layer/layer_stages.cuh"
#include "orthros/cuda/attention_backward.hpp"
#include "orthros/cuda/layer_backward.hpp"

#include <algorithm>

namespace orthros::cuda {
namespace {
using namespace detail;

constexpr int kStageWarps = 4;  // warps per block of stage_backward_kernel (one token row per block)
constexpr int kMaxHeadDim = 256;

struct StageBwdParams {
  const void* lin;     // [rows, H*D] x W before the norm (the forward's q_lin / k_lin)
  void* grad;          // [rows, H*D] in: dL/d(post-RoPE); out: dL/d(x W)
  const void* norm_w;  // [D] QK-norm gain, null when the norm is off
  const void* alpha;   // [H*D] scale of the query stream, null for keys
  void* dqhat;         // [rows, H*D] out: RoPE⁻¹(grad) (dβ, dα), or null
  void* normed;        // [rows, H*D] out: the recomputed norm output n (dα), or null
  float* gain_part;    // [rows, H*D] out: dn ⊙ x ⊙ r per element (the gain's gradient), or null
  int H, D;
  float eps;
  double theta;
  int out_stream;  // 0: base rows (position i), 1: output rows (position T - T_out + j)
  int nseq;
  SeqDesc seq[kMaxSeqPerLaunch];
};

// One block per token row, one warp per head (heads strided over the block's warps). For one
// head with x = lin, g = grad, r = 1/sqrt(mean(x²) + eps) (the forward's qk_prep arithmetic):
//   dq̂ = RoPE⁻¹(g)                       (rope_pair at -pos; kept in float32, stored rounded)
//   n   = x r w (rounded; = x without the norm),  dn = α ⊙ dq̂ (float32; = dq̂ for keys)
//   dx  = r w dn − x r³/D · Σ dn w x,    gain_part = dn x r     (the reference's
//   rms_norm_groups_backward term by term, float32, no contraction)
// dq̂ and dn stay in float32 between the steps (the reference at the dtype rounds both): two
// fewer roundings on the path into the QK-norm gain's gradient, whose few terms per element (D =
// 16, one row) otherwise carried the bf16 error of dk to the edge of SPEC §6's relative bound.
template <typename T>
__global__ void __launch_bounds__(kStageWarps * 32) stage_backward_kernel(const __grid_constant__ StageBwdParams p) {
  __shared__ float s_g[kStageWarps][kMaxHeadDim];
  const SeqDesc& sd = p.seq[blockIdx.z];
  const int i = blockIdx.x;
  if (i >= (p.out_stream ? sd.T_out : sd.T)) return;
  const long long row = p.out_stream ? sd.out_off + i : sd.q_off + i;
  const double pos = p.out_stream ? static_cast<double>(sd.T - sd.T_out + i) : static_cast<double>(i);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int D = p.D, half = D / 2;
  const T* nw = static_cast<const T*>(p.norm_w);
  const T* alpha = static_cast<const T*>(p.alpha);
  float* sg = s_g[warp];
  for (int h = warp; h < p.H; h += kStageWarps) {
    const size_t base = (static_cast<size_t>(row) * p.H + h) * D;
    T* g = static_cast<T*>(p.grad) + base;
    const T* x = static_cast<const T*>(p.lin) + base;
    for (int d = lane; d < half; d += 32) rope_pair(g, sg, d, D, -pos, p.theta);
    __syncwarp();
    if (p.dqhat)
      for (int d = lane; d < D; d += 32) static_cast<T*>(p.dqhat)[base + d] = Elem<T>::from_f(sg[d]);
    const float inv = nw ? warp_rms_inv(x, D, p.eps, lane) : 1.f;
    float dot = 0.f;
    for (int d = lane; d < D; d += 32) {
      const float xv = Elem<T>::to_f(x[d]);
      if (p.normed)
        static_cast<T*>(p.normed)[base + d] =
            nw ? Elem<T>::from_f(__fmul_rn(__fmul_rn(xv, inv), Elem<T>::to_f(nw[d]))) : x[d];
      if (alpha) sg[d] = __fmul_rn(Elem<T>::to_f(alpha[h * D + d]), sg[d]);
      if (nw) dot = __fadd_rn(dot, __fmul_rn(__fmul_rn(sg[d], Elem<T>::to_f(nw[d])), xv));
    }
    if (nw) {
      for (int off = 16; off > 0; off >>= 1) dot = __fadd_rn(dot, __shfl_xor_sync(0xffffffffu, dot, off));
      const float coef = __fdiv_rn(__fmul_rn(__fmul_rn(__fmul_rn(inv, inv), inv), dot), static_cast<float>(D));
      for (int d = lane; d < D; d += 32) {
        const float xv = Elem<T>::to_f(x[d]), dn = sg[d], w = Elem<T>::to_f(nw[d]);
        g[d] = Elem<T>::from_f(__fsub_rn(__fmul_rn(__fmul_rn(inv, w), dn), __fmul_rn(xv, coef)));
        if (p.gain_part) p.gain_part[base + d] = __fmul_rn(__fmul_rn(dn, xv), inv);
      }
    } else {
      for (int d = lane; d < D; d += 32) g[d] = Elem<T>::from_f(sg[d]);
    }
    __syncwarp();  // sg is reused by the next head
  }
}

// Column sums for the parameter reductions, in two fixed-order stages so that any number of rows
// spreads over the GPU and the result does not depend on it:
//   colsum_partial_kernel  block (column tile of 32, chunk of kColsumChunk rows): thread row y
//                          sums rows y, y+32, ... of the chunk ascending, then the 32 partial
//                          sums are added in order of y -> part[chunk, c] (float32);
//   colsum_final_kernel    out[c] = round(init + Σ_chunks part[chunk, c]), chunks ascending;
//                          init = out[c] when accumulating, else 0.
// The summands are a[r, c] (· b[r, c] when b is given), products in float32.
constexpr int kColsumChunk = 1024;

template <typename A, typename B>
__global__ void __launch_bounds__(1024) colsum_partial_kernel(const A* a, const B* b, long long rows, int cols,
                                                              float* part) {
  __shared__ float s[32][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const long long r0 = static_cast<long long>(blockIdx.y) * kColsumChunk;
  const long long r1 = min(rows, r0 + kColsumChunk);
  float acc = 0.f;
  if (c < cols)
    for (long long r = r0 + threadIdx.y; r < r1; r += 32) {
      float v = Elem<A>::to_f(a[r * cols + c]);
      if (b) v = __fmul_rn(v, Elem<B>::to_f(b[r * cols + c]));
      acc = __fadd_rn(acc, v);
    }
  s[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float t = 0.f;
    for (int y = 0; y < 32; ++y) t = __fadd_rn(t, s[y][threadIdx.x]);
    part[static_cast<long long>(blockIdx.y) * cols + c] = t;
  }
}

template <typename O>
__global__ void colsum_final_kernel(const float* part, int chunks, int cols, O* out, int accumulate) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float t = accumulate ? Elem<O>::to_f(out[c]) : 0.f;
  for (int k = 0; k < chunks; ++k) t = __fadd_rn(t, part[static_cast<long long>(k) * cols + c]);
  out[c] = Elem<O>::from_f(t);
}

/// Floats of colsum scratch for `rows` x `cols`.
size_t colsum_scratch(long long rows, long long cols) {
  return static_cast<size_t>((rows + kColsumChunk - 1) / kColsumChunk) * static_cast<size_t>(cols);
}

template <typename T>
struct Kernels {
  static void stage_backward(StageBwdParams p, const BatchLayout& b, cudaStream_t stream) {
    int q_off = 0, out_off = 0;
    for (int s0 = 0; s0 < b.batch(); s0 += kMaxSeqPerLaunch) {
      p.nseq = fill_seq_group(b, s0, 0, p.seq, q_off, out_off);
      int max_rows = 0;
      for (int j = 0; j < p.nseq; ++j) max_rows = std::max(max_rows, p.out_stream ? p.seq[j].T_out : p.seq[j].T);
      if (max_rows == 0) continue;
      stage_backward_kernel<T><<<dim3(static_cast<unsigned>(max_rows), 1, p.nseq), kStageWarps * 32, 0, stream>>>(p);
      ORTHROS_CUDA_LAUNCH_CHECK("stage_backward_kernel");
    }
  }
  template <typename A, typename B>
  static void colsum(const A* a, const B* bb, long long rows, int cols, void* out, bool accumulate, float* scratch,
                     cudaStream_t stream) {
    const long long chunks = (rows + kColsumChunk - 1) / kColsumChunk;
    require(chunks < 65536, "internal: colsum over ", rows, " rows exceeds the grid");
    colsum_partial_kernel<A, B><<<dim3(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>(chunks)),
                                  dim3(32, 32), 0, stream>>>(a, bb, rows, cols, scratch);
    ORTHROS_CUDA_LAUNCH_CHECK("colsum_partial_kernel");
    colsum_final_kernel<T><<<static_cast<unsigned>((cols + 255) / 256), 256, 0, stream>>>(
        scratch, static_cast<int>(chunks), cols, static_cast<T*>(out), accumulate ? 1 : 0);
    ORTHROS_CUDA_LAUNCH_CHECK("colsum_final_kernel");
  }
};

// dα, dβ and the stage backward of one query stream (base or output rows).
template <typename T>
void query_stream_backward(const LayerConfig& cfg, const BatchLayout& layout, int out_stream, long long rows,
                           const void* lin, void* grad, const void* qn, const void* alpha, void* dqhat, void* normed,
                           float* gain, float* scratch, void* dalpha, void* dbeta, void* dq_norm,
                           cudaStream_t stream) {
  const int H = cfg.num_q_heads, D = cfg.head_dim, d = H * D;
  StageBwdParams p{};
  p.lin = lin;
  p.grad = grad;
  p.norm_w = qn;
  p.alpha = alpha;
  p.dqhat = dqhat;
  p.normed = normed;
  p.gain_part = qn ? gain : nullptr;
  p.H = H;
  p.D = D;
  p.eps = static_cast<float>(cfg.rms_eps);
  p.theta = cfg.rope_theta;
  p.out_stream = out_stream;
  Kernels<T>::stage_backward(p, layout, stream);
  Kernels<T>::colsum(static_cast<const T*>(dqhat), static_cast<const T*>(normed), rows, d, dalpha, false, scratch,
                     stream);
  Kernels<T>::colsum(static_cast<const T*>(dqhat), static_cast<const T*>(nullptr), rows, d, dbeta, false, scratch,
                     stream);
  if (qn)  // the q-norm gain sums both streams: base rows first, then the output rows
    Kernels<T>::colsum(gain, static_cast<const float*>(nullptr), rows * H, D, dq_norm, out_stream == 1, scratch,
                       stream);
}

template <typename T>
void key_backward(const LayerConfig& cfg, const BatchLayout& layout, long long rows, const void* lin, void* grad,
                  const void* kn, float* gain, float* scratch, void* dk_norm, cudaStream_t stream) {
  StageBwdParams p{};
  p.lin = lin;
  p.grad = grad;
  p.norm_w = kn;
  p.gain_part = kn ? gain : nullptr;
  p.H = cfg.num_kv_heads;
  p.D = cfg.head_dim;
  p.eps = static_cast<float>(cfg.rms_eps);
  p.theta = cfg.rope_theta;
  p.out_stream = 0;
  Kernels<T>::stage_backward(p, layout, stream);
  if (kn)
    Kernels<T>::colsum(gain, static_cast<const float*>(nullptr), rows * cfg.num_kv_heads, cfg.head_dim, dk_norm,
                       false, scratch, stream);
}

struct BwdCarve {
  size_t q_lin, q, qo_lin, qo, k_lin, k, v, kc, vc, o, oo, lse, lse_out, attn_fwd, d_o, d_oo, dq, dqo, dk, dv, attn_bwd,
      dqhat, normed, gain, colsum, total;
  std::int64_t capacity;
  size_t fwd_bytes, bwd_bytes;  // the attention forward's / backward's own workspace sizes
};

BwdCarve carve_backward(const LayerConfig& c, const BatchLayout& l, size_t fwd_bytes, size_t bwd_bytes) {
  const size_t es = static_cast<size_t>(dtype_size(c.dtype));
  const size_t d = static_cast<size_t>(c.num_q_heads) * c.head_dim, dkv = static_cast<size_t>(c.num_kv_heads) * c.head_dim;
  const size_t tq = static_cast<size_t>(l.total_q()), to = static_cast<size_t>(l.total_out()), tm = std::max(tq, to);
  std::int64_t cap = 1;
  for (int t : l.q_lens) cap = std::max<std::int64_t>(cap, t);
  const size_t cache = static_cast<size_t>(l.batch()) * static_cast<size_t>(cap) * dkv * es;
  Carver cr;
  BwdCarve cv{};
  cv.capacity = cap;
  cv.fwd_bytes = fwd_bytes;
  cv.bwd_bytes = bwd_bytes;
  cv.q_lin = cr.take(tq * d * es);
  cv.q = cr.take(tq * d * es);
  cv.qo_lin = cr.take(to * d * es);
  cv.qo = cr.take(to * d * es);
  cv.k_lin = cr.take(tq * dkv * es);
  cv.k = cr.take(tq * dkv * es);
  cv.v = cr.take(tq * dkv * es);
  cv.kc = cr.take(cache);
  cv.vc = cr.take(cache);
  cv.o = cr.take(tq * d * es);
  cv.oo = cr.take(to * d * es);
  cv.lse = cr.take(tq * c.num_q_heads * sizeof(float));
  cv.lse_out = cr.take(to * c.num_q_heads * sizeof(float));
  cv.attn_fwd = cr.take(fwd_bytes);
  cv.d_o = cr.take(tq * d * es);
  cv.d_oo = cr.take(to * d * es);
  cv.dq = cr.take(tq * d * es);
  cv.dqo = cr.take(to * d * es);
  cv.dk = cr.take(tq * dkv * es);
  cv.dv = cr.take(tq * dkv * es);
  cv.attn_bwd = cr.take(bwd_bytes);
  cv.dqhat = cr.take(tm * d * es);   // reused by the base and the output stream (stream-ordered)
  cv.normed = cr.take(tm * d * es);
  cv.gain = cr.take(tm * d * sizeof(float));  // also the keys' (tq * d_kv <= tq * d)
  // colsum partials: the largest of [tm, d] (dα, dβ) and [tm * H, D] (gains; the keys' is smaller)
  cv.colsum = cr.take(std::max(colsum_scratch(static_cast<long long>(tm), static_cast<long long>(d)),
                               colsum_scratch(static_cast<long long>(tm) * c.num_q_heads, c.head_dim)) *
                      sizeof(float));
  cv.total = cr.total();
  return cv;
}

void validate_layer_backward(const LayerConfig& cfg, const BatchLayout& layout) {
  validate_layer(cfg, layout);
  validate_batch(layout);
  for (size_t i = 0; i < layout.q_lens.size(); ++i)
    require(layout.cache_lens[i] == layout.q_lens[i],
            "attention_layer_backward supports training sequences only (P = 0): cache_lens[", i, "] must equal q_lens[",
            i, "] (got cache_lens = ", layout.cache_lens[i], ", q_lens = ", layout.q_lens[i], ")");
  require(cfg.head_dim <= kMaxHeadDim, "head_dim must be <= ", kMaxHeadDim, " (got ", cfg.head_dim, ")");
}

BwdCarve plan(const LayerConfig& cfg, const BatchLayout& layout) {
  validate_layer_backward(cfg, layout);
  const AttentionConfig acfg = cfg.attention();
  return carve_backward(cfg, layout, attention_workspace_bytes(acfg, layout),
                        attention_backward_workspace_bytes(acfg, layout));
}

template <typename T>
void run_layer_backward(const LayerConfig& cfg, const BatchLayout& layout, const LayerWeightsDevice& w,
                        const LayerBackwardBuffers& b, const BwdCarve& cv, cublasHandle_t handle,
                        cudaStream_t stream) {
  const int H = cfg.num_q_heads, Hkv = cfg.num_kv_heads, D = cfg.head_dim;
  const long long tq = layout.total_q(), to = layout.total_out();
  const long long dm = cfg.d_model, d = static_cast<long long>(H) * D, dkv = static_cast<long long>(Hkv) * D;
  const DType dt = cfg.dtype;
  const AttentionConfig acfg = cfg.attention();
  char* ws = static_cast<char*>(b.workspace);
  auto at = [&](size_t off) { return static_cast<void*>(ws + off); };
  const LayerGradsDevice& g = b.grads;
  const CublasScope scope(handle, stream);

  // 1. The forward again, keeping x W_Q, x' W_Q, x W_K and the LSEs.
  LayerStages st;
  st.q_lin = at(cv.q_lin);
  st.q = at(cv.q);
  st.qo_lin = at(cv.qo_lin);
  st.qo = at(cv.qo);
  st.k_lin = at(cv.k_lin);
  st.k = at(cv.k);
  st.v = at(cv.v);
  st.k_cache = at(cv.kc);
  st.v_cache = at(cv.vc);
  st.capacity = cv.capacity;
  st.o = at(cv.o);
  st.oo = at(cv.oo);
  st.lse = reinterpret_cast<float*>(at(cv.lse));
  st.lse_out = reinterpret_cast<float*>(at(cv.lse_out));
  st.attn_workspace = at(cv.attn_fwd);
  st.attn_workspace_bytes = cv.fwd_bytes;
  layer_forward_stages(cfg, layout, w, b.x, b.x_out, st, handle, stream);

  // 2. y = o W_O, y' = o' W_O: dW_O = oᵀdy + o'ᵀdy', do = dy W_Oᵀ, do' = dy' W_Oᵀ.
  gemm_rm(handle, dt, true, false, d, dm, tq, st.o, b.dy, 0.f, g.w_o, "cublasGemmEx(dW_O = o^T dy)", stream);
  gemm_rm(handle, dt, true, false, d, dm, to, st.oo, b.dy_out, 1.f, g.w_o, "cublasGemmEx(dW_O += o'^T dy')", stream);
  gemm_rm(handle, dt, false, true, tq, d, dm, b.dy, w.w_o, 0.f, at(cv.d_o), "cublasGemmEx(do = dy W_O^T)", stream);
  gemm_rm(handle, dt, false, true, to, d, dm, b.dy_out, w.w_o, 0.f, at(cv.d_oo), "cublasGemmEx(do' = dy' W_O^T)",
          stream);

  // 3. The attention operator.
  AttentionBackwardBuffers ab;
  ab.q = st.q;
  ab.q_out = to > 0 ? st.qo : nullptr;
  ab.k_cache = st.k_cache;
  ab.v_cache = st.v_cache;
  ab.capacity = cv.capacity;
  ab.o = st.o;
  ab.o_out = to > 0 ? st.oo : nullptr;
  ab.lse = st.lse;
  ab.lse_out = to > 0 ? st.lse_out : nullptr;
  ab.d_o = at(cv.d_o);
  ab.d_o_out = to > 0 ? at(cv.d_oo) : nullptr;
  ab.dq = at(cv.dq);
  ab.dq_out = to > 0 ? at(cv.dqo) : nullptr;
  ab.dk = at(cv.dk);
  ab.dv = at(cv.dv);
  ab.workspace = at(cv.attn_bwd);
  ab.workspace_bytes = cv.bwd_bytes;
  attention_backward(acfg, layout, ab, stream);

  // 4. RoPE, scale-offset and QK-norm backward: dq -> d(x W_Q), dq' -> d(x' W_Q), dk -> d(x W_K).
  const void* qn = cfg.qk_norm ? w.q_norm : nullptr;
  const void* kn = cfg.qk_norm ? w.k_norm : nullptr;
  float* gain = reinterpret_cast<float*>(at(cv.gain));
  float* scratch = reinterpret_cast<float*>(at(cv.colsum));
  query_stream_backward<T>(cfg, layout, 0, tq, st.q_lin, at(cv.dq), qn, w.alpha, at(cv.dqhat), at(cv.normed), gain,
                           scratch, g.alpha, g.beta, g.q_norm, stream);
  if (to > 0) {
    query_stream_backward<T>(cfg, layout, 1, to, st.qo_lin, at(cv.dqo), qn, w.alpha_out, at(cv.dqhat), at(cv.normed),
                             gain, scratch, g.alpha_out, g.beta_out, g.q_norm, stream);
  } else {
    ORTHROS_CUDA_CHECK(cudaMemsetAsync(g.alpha_out, 0, static_cast<size_t>(d) * dtype_size(dt), stream));
    ORTHROS_CUDA_CHECK(cudaMemsetAsync(g.beta_out, 0, static_cast<size_t>(d) * dtype_size(dt), stream));
  }
  key_backward<T>(cfg, layout, tq, st.k_lin, at(cv.dk), kn, gain, scratch, g.k_norm, stream);
  if (!cfg.qk_norm)
    for (void* p : {g.q_norm, g.k_norm})
      if (p) ORTHROS_CUDA_CHECK(cudaMemsetAsync(p, 0, static_cast<size_t>(D) * dtype_size(dt), stream));

  // 5. The shared projections: dW = xᵀ d(x W) (W_Q: base rows, then the output rows), dx.
  gemm_rm(handle, dt, true, false, dm, d, tq, b.x, at(cv.dq), 0.f, g.w_q, "cublasGemmEx(dW_Q = x^T dq_lin)", stream);
  gemm_rm(handle, dt, true, false, dm, d, to, b.x_out, at(cv.dqo), 1.f, g.w_q, "cublasGemmEx(dW_Q += x'^T dq'_lin)",
          stream);
  gemm_rm(handle, dt, true, false, dm, dkv, tq, b.x, at(cv.dk), 0.f, g.w_k, "cublasGemmEx(dW_K = x^T dk_lin)", stream);
  gemm_rm(handle, dt, true, false, dm, dkv, tq, b.x, at(cv.dv), 0.f, g.w_v, "cublasGemmEx(dW_V = x^T dv)", stream);
  gemm_rm(handle, dt, false, true, tq, dm, d, at(cv.dq), w.w_q, 0.f, g.dx, "cublasGemmEx(dx = dq_lin W_Q^T)", stream);
  gemm_rm(handle, dt, false, true, tq, dm, dkv, at(cv.dk), w.w_k, 1.f, g.dx, "cublasGemmEx(dx += dk_lin W_K^T)",
          stream);
  gemm_rm(handle, dt, false, true, tq, dm, dkv, at(cv.dv), w.w_v, 1.f, g.dx, "cublasGemmEx(dx += dv W_V^T)", stream);
  gemm_rm(handle, dt, false, true, to, dm, d, at(cv.dqo), w.w_q, 0.f, g.dx_out, "cublasGemmEx(dx' = dq'_lin W_Q^T)",
          stream);
}

}  // namespace

std::size_t attention_layer_backward_workspace_bytes(const LayerConfig& cfg, const BatchLayout& layout) {
  return plan(cfg, layout).total;
}

void attention_layer_backward(const LayerConfig& cfg, const BatchLayout& layout, const LayerWeightsDevice& w,
                              const LayerBackwardBuffers& b, cublasHandle_t handle, cudaStream_t stream) {
  // ---- validation: everything before the first launch ----
  const BwdCarve cv = plan(cfg, layout);
  const long long tq = layout.total_q(), to = layout.total_out();
  check_layer_weights(cfg, w, tq, to);
  auto need = [](const void* p, const char* name) { require(p != nullptr, name, " must not be null"); };
  const LayerGradsDevice& g = b.grads;
  for (auto [p, name] : {std::pair{g.w_q, "grads.w_q"}, {g.w_k, "grads.w_k"}, {g.w_v, "grads.w_v"},
                         {g.w_o, "grads.w_o"}, {g.alpha, "grads.alpha"}, {g.beta, "grads.beta"},
                         {g.alpha_out, "grads.alpha_out"}, {g.beta_out, "grads.beta_out"}})
    need(p, name);
  if (cfg.qk_norm) {
    need(g.q_norm, "grads.q_norm (qk_norm is on)");
    need(g.k_norm, "grads.k_norm (qk_norm is on)");
  }
  const size_t es = static_cast<size_t>(dtype_size(cfg.dtype));
  const size_t d = static_cast<size_t>(cfg.num_q_heads) * cfg.head_dim;
  const size_t dkv = static_cast<size_t>(cfg.num_kv_heads) * cfg.head_dim, dm = static_cast<size_t>(cfg.d_model);
  if (tq == 0) {  // no rows: every weight gradient is an empty sum
    for (auto [p, n] : {std::pair{g.w_q, dm * d}, {g.w_k, dm * dkv}, {g.w_v, dm * dkv}, {g.w_o, d * dm},
                        {g.alpha, d}, {g.beta, d}, {g.alpha_out, d}, {g.beta_out, d},
                        {g.q_norm, size_t(cfg.head_dim)}, {g.k_norm, size_t(cfg.head_dim)}})
      if (p) ORTHROS_CUDA_CHECK(cudaMemsetAsync(p, 0, n * es, stream));
    return;
  }
  need(b.x, "buffers.x");
  need(b.dy, "buffers.dy");
  need(g.dx, "grads.dx");
  if (to > 0) {
    need(b.x_out, "buffers.x_out");
    need(b.dy_out, "buffers.dy_out");
    need(g.dx_out, "grads.dx_out");
  }
  require(b.workspace != nullptr && b.workspace_bytes >= cv.total, "workspace must hold ", cv.total,
          " bytes (attention_layer_backward_workspace_bytes; got ", b.workspace_bytes, " at ", b.workspace, ")");
  require(reinterpret_cast<std::uintptr_t>(b.workspace) % 256 == 0, "workspace must be 256-byte aligned (got ",
          b.workspace, ")");
  require(handle != nullptr, "cuBLAS handle must not be null");
  switch (cfg.dtype) {
    case DType::f32: run_layer_backward<float>(cfg, layout, w, b, cv, handle, stream); break;
    case DType::f16: run_layer_backward<__half>(cfg, layout, w, b, cv, handle, stream); break;
    case DType::bf16: run_layer_backward<__nv_bfloat16>(cfg, layout, w, b, cv, handle, stream); break;
  }
}

}  // namespace orthros::cuda
