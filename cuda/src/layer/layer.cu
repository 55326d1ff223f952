// The Orthros attention layer on the GPU (SPEC §2, paper Algorithm 1): cuBLAS projections, the
// QK RMSNorm + scale-offset kernel, RoPE fused with the KV-cache append, attention_forward.
#include "layer/layer_stages.cuh"

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>

namespace orthros::cuda {
namespace detail {

void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw CublasError(std::string(what) + " failed: " + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) +
                      ")");
}
#define ORTHROS_CUBLAS_CHECK(call) ::orthros::cuda::detail::cublas_check((call), #call)

namespace {

// One warp per (row, head): optional RMSNorm over the D values (weight nw), rounded to T, then
// optional scale-offset alpha ⊙ x + beta (per column of the row), rounded to T. The order of
// operations is the reference's (layer.hpp: rms_norm_groups, query_stages): inv = 1/sqrt(ss/D +
// eps), x*inv*w; then alpha*x + beta, all in float32 without contraction (--fmad=false).
template <typename T>
__global__ void qk_prep_kernel(T* x, long long rows, int H, int D, const T* nw, float eps, const T* alpha,
                               const T* beta) {
  const long long warp = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= rows * H) return;
  const long long r = warp / H;
  const int h = static_cast<int>(warp % H);
  T* p = x + (r * H + h) * D;
  const float inv = nw ? warp_rms_inv(p, D, eps, lane) : 1.f;
  for (int i = lane; i < D; i += 32) {
    T v = p[i];
    if (nw) v = Elem<T>::from_f(__fmul_rn(__fmul_rn(Elem<T>::to_f(v), inv), Elem<T>::to_f(nw[i])));
    if (alpha) {
      const int c = h * D + i;
      v = Elem<T>::from_f(__fadd_rn(__fmul_rn(Elem<T>::to_f(alpha[c]), Elem<T>::to_f(v)), Elem<T>::to_f(beta[c])));
    }
    p[i] = v;
  }
}

template <typename T>
void launch_qk_prep(void* x, long long rows, int H, int D, const void* nw, float eps, const void* alpha,
                    const void* beta, cudaStream_t stream) {
  if (rows == 0 || (!nw && !alpha)) return;
  const long long warps = rows * H;
  const int threads = 256;
  const long long blocks = (warps * 32 + threads - 1) / threads;
  qk_prep_kernel<T><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
      static_cast<T*>(x), rows, H, D, static_cast<const T*>(nw), eps, static_cast<const T*>(alpha),
      static_cast<const T*>(beta));
  ORTHROS_CUDA_LAUNCH_CHECK("qk_prep_kernel");
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

}  // namespace

void qk_prep(DType dt, void* x, long long rows, int H, int D, const void* nw, float eps, const void* alpha,
             const void* beta, cudaStream_t stream) {
  switch (dt) {
    case DType::f32: launch_qk_prep<float>(x, rows, H, D, nw, eps, alpha, beta, stream); break;
    case DType::f16: launch_qk_prep<__half>(x, rows, H, D, nw, eps, alpha, beta, stream); break;
    case DType::bf16: launch_qk_prep<__nv_bfloat16>(x, rows, H, D, nw, eps, alpha, beta, stream); break;
  }
}

void gemm_rm(cublasHandle_t h, DType dt, bool trans_a, bool trans_b, long long M, long long N, long long K,
             const void* A, const void* B, float beta, void* C, const char* what, cudaStream_t stream) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an empty sum: C = beta C
    if (beta == 0.f) ORTHROS_CUDA_CHECK(cudaMemsetAsync(C, 0, static_cast<size_t>(M * N) * dtype_size(dt), stream));
    return;
  }
  // Row-major C = op(A) op(B) is column-major Cᵀ = op(B)ᵀ op(A)ᵀ: B is cuBLAS's first operand.
  // A row-major matrix stored [r, c] is the column-major [c, r] (its transpose, leading dim c).
  const float one = 1.f;
  const cudaDataType_t t = cuda_type(dt);
  const cublasComputeType_t ct = dt == DType::f32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
  const int ldb = static_cast<int>(trans_b ? K : N), lda = static_cast<int>(trans_a ? M : K);
  cublas_check(cublasGemmEx(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                            static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &one, B, t, ldb, A, t, lda,
                            &beta, C, t, static_cast<int>(N), ct, CUBLAS_GEMM_DEFAULT),
               what);
}

CublasScope::CublasScope(cublasHandle_t h, cudaStream_t stream) : h_(h) {
  ORTHROS_CUBLAS_CHECK(cublasGetStream(h_, &old_stream_));
  ORTHROS_CUBLAS_CHECK(cublasGetMathMode(h_, &old_mode_));
  ORTHROS_CUBLAS_CHECK(cublasSetStream(h_, stream));
  ORTHROS_CUBLAS_CHECK(cublasSetMathMode(
      h_, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
}
CublasScope::~CublasScope() {
  cublasSetStream(h_, old_stream_);
  cublasSetMathMode(h_, old_mode_);
}

void validate_layer(const LayerConfig& c, const BatchLayout& l) {
  require(c.d_model >= 1, "d_model must be >= 1 (got ", c.d_model, ")");
  require(c.num_q_heads >= 1 && c.num_kv_heads >= 1, "num_q_heads and num_kv_heads must be >= 1 (got ", c.num_q_heads,
          ", ", c.num_kv_heads, ")");
  require(c.head_dim >= 2 && c.head_dim % 2 == 0, "head_dim (D) must be even for rotate-half RoPE (got ", c.head_dim,
          ")");
  require(std::isfinite(c.rope_theta) && c.rope_theta > 0, "rope_theta must be finite and > 0 (got ", c.rope_theta,
          ")");
  require(std::isfinite(c.rms_eps) && c.rms_eps >= 0, "rms_eps must be finite and >= 0 (got ", c.rms_eps, ")");
  const long long d = static_cast<long long>(c.num_q_heads) * c.head_dim;
  require(c.d_model <= INT_MAX && d <= INT_MAX, "d_model and H_q*D must fit cuBLAS's int (got ", c.d_model, ", ", d,
          ")");
  require(l.total_q() <= INT_MAX && l.total_out() <= INT_MAX, "sum T and sum T_out must fit cuBLAS's int (got ",
          l.total_q(), ", ", l.total_out(), ")");
}

void check_layer_weights(const LayerConfig& cfg, const LayerWeightsDevice& w, long long tq, long long to) {
  auto need = [](const void* p, const char* name) { require(p != nullptr, name, " must not be null"); };
  if (tq > 0) {
    need(w.w_q, "weights.w_q");
    need(w.w_k, "weights.w_k");
    need(w.w_v, "weights.w_v");
    need(w.w_o, "weights.w_o");
    need(w.alpha, "weights.alpha");
    need(w.beta, "weights.beta");
    if (cfg.qk_norm) {
      need(w.q_norm, "weights.q_norm (qk_norm is on)");
      need(w.k_norm, "weights.k_norm (qk_norm is on)");
    }
  }
  if (to > 0) {
    need(w.alpha_out, "weights.alpha_out");
    need(w.beta_out, "weights.beta_out");
  }
}

void layer_forward_stages(const LayerConfig& cfg, const BatchLayout& layout, const LayerWeightsDevice& w,
                          const void* x, const void* x_out, const LayerStages& st, cublasHandle_t handle,
                          cudaStream_t stream) {
  const int H = cfg.num_q_heads, Hkv = cfg.num_kv_heads, D = cfg.head_dim;
  const long long tq = layout.total_q(), to = layout.total_out();
  const long long dm = cfg.d_model, d = static_cast<long long>(H) * D, dkv = static_cast<long long>(Hkv) * D;
  const size_t es = static_cast<size_t>(dtype_size(cfg.dtype));
  const float eps = static_cast<float>(cfg.rms_eps);  // the reference's static_cast<Acc>(eps)
  // Projections, rounded to the dtype (the reference's project()); kept before the norm if asked.
  auto project = [&](long long rows, long long n, const void* X, const void* W, void* lin, void* out, const char* what) {
    gemm_rm(handle, cfg.dtype, false, false, rows, n, dm, X, W, 0.f, lin ? lin : out, what, stream);
    if (lin && rows > 0)
      ORTHROS_CUDA_CHECK(cudaMemcpyAsync(out, lin, static_cast<size_t>(rows * n) * es, cudaMemcpyDeviceToDevice, stream));
  };
  project(tq, d, x, w.w_q, st.q_lin, st.q, "cublasGemmEx(q = x W_Q)");
  project(to, d, x_out, w.w_q, st.qo_lin, st.qo, "cublasGemmEx(q' = x' W_Q)");
  project(tq, dkv, x, w.w_k, st.k_lin, st.k, "cublasGemmEx(k = x W_K)");
  project(tq, dkv, x, w.w_v, nullptr, st.v, "cublasGemmEx(v = x W_V)");
  // QK-norm and scale-offset (each rounded to the dtype).
  const void* qn = cfg.qk_norm ? w.q_norm : nullptr;
  const void* kn = cfg.qk_norm ? w.k_norm : nullptr;
  qk_prep(cfg.dtype, st.q, tq, H, D, qn, eps, w.alpha, w.beta, stream);
  qk_prep(cfg.dtype, st.qo, to, H, D, qn, eps, w.alpha_out, w.beta_out, stream);
  qk_prep(cfg.dtype, st.k, tq, Hkv, D, kn, eps, nullptr, nullptr, stream);
  // RoPE on k (while appending k, v to the cache), q and q' in place; position = cache row.
  rope_append_kv(cfg.dtype, layout, H, Hkv, D, st.k, st.v, st.k_cache, st.v_cache, st.capacity, cfg.rope_theta, 0,
                 st.q, to > 0 ? st.qo : nullptr, stream);
  // Attention over the cache (both streams, one launch).
  AttentionBuffers ab;
  ab.q = st.q;
  ab.q_out = to > 0 ? st.qo : nullptr;
  ab.k_cache = st.k_cache;
  ab.v_cache = st.v_cache;
  ab.capacity = st.capacity;
  ab.o = st.o;
  ab.o_out = to > 0 ? st.oo : nullptr;
  ab.lse = st.lse;
  ab.lse_out = to > 0 ? st.lse_out : nullptr;
  ab.workspace = st.attn_workspace_bytes ? st.attn_workspace : nullptr;
  ab.workspace_bytes = st.attn_workspace_bytes;
  attention_forward(cfg.attention(), layout, ab, stream);
}

}  // namespace detail

namespace {
using namespace detail;

struct Carve {
  size_t q, qo, k, v, o, oo, attn, total;
};

Carve carve(const LayerConfig& c, const BatchLayout& l, size_t attn_bytes) {
  const size_t es = static_cast<size_t>(dtype_size(c.dtype));
  const size_t d = static_cast<size_t>(c.num_q_heads) * c.head_dim, dkv = static_cast<size_t>(c.num_kv_heads) * c.head_dim;
  const size_t tq = static_cast<size_t>(l.total_q()), to = static_cast<size_t>(l.total_out());
  Carver cr;
  Carve cv{};
  cv.q = cr.take(tq * d * es);
  cv.qo = cr.take(to * d * es);
  cv.k = cr.take(tq * dkv * es);
  cv.v = cr.take(tq * dkv * es);
  cv.o = cr.take(tq * d * es);
  cv.oo = cr.take(to * d * es);
  cv.attn = cr.take(attn_bytes);
  cv.total = cr.total();
  return cv;
}

}  // namespace

AttentionConfig LayerConfig::attention() const {
  AttentionConfig a;
  a.dtype = dtype;
  a.num_q_heads = num_q_heads;
  a.num_kv_heads = num_kv_heads;
  a.head_dim = head_dim;
  a.window = window;
  a.scale = scale;
  a.deterministic = deterministic;
  a.num_splits = num_splits;
  return a;
}

std::size_t attention_layer_workspace_bytes(const LayerConfig& cfg, const BatchLayout& layout) {
  validate_layer(cfg, layout);
  return carve(cfg, layout, attention_workspace_bytes(cfg.attention(), layout)).total;
}

void attention_layer_forward(const LayerConfig& cfg, const BatchLayout& layout, const LayerWeightsDevice& w,
                             const LayerBuffers& b, cublasHandle_t handle, cudaStream_t stream) {
  // ---- validation: everything before the first launch ----
  validate_layer(cfg, layout);
  const AttentionConfig acfg = cfg.attention();
  const size_t attn_bytes = attention_workspace_bytes(acfg, layout);  // validates dims, window, layout
  const Carve cv = carve(cfg, layout, attn_bytes);
  for (int i = 0; i < layout.batch(); ++i)
    require(layout.cache_lens[i] <= b.capacity, "cache_lens[", i, "] must be <= capacity (got ", layout.cache_lens[i],
            ", capacity = ", b.capacity, ")");
  const long long tq = layout.total_q(), to = layout.total_out();
  check_layer_weights(cfg, w, tq, to);
  auto need = [](const void* p, const char* name) { require(p != nullptr, name, " must not be null"); };
  if (tq > 0) {
    need(b.x, "buffers.x");
    need(b.y, "buffers.y");
    need(b.k_cache, "buffers.k_cache");
    need(b.v_cache, "buffers.v_cache");
  }
  if (to > 0) {
    need(b.x_out, "buffers.x_out");
    need(b.y_out, "buffers.y_out");
  }
  if (tq == 0) return;
  require(b.workspace != nullptr && b.workspace_bytes >= cv.total, "workspace must hold ", cv.total,
          " bytes (attention_layer_workspace_bytes; got ", b.workspace_bytes, " at ", b.workspace, ")");
  require(reinterpret_cast<std::uintptr_t>(b.workspace) % 256 == 0, "workspace must be 256-byte aligned (got ",
          b.workspace, ")");
  require(handle != nullptr, "cuBLAS handle must not be null");

  char* ws = static_cast<char*>(b.workspace);
  const CublasScope scope(handle, stream);
  LayerStages st;
  st.q = ws + cv.q;
  st.qo = ws + cv.qo;
  st.k = ws + cv.k;
  st.v = ws + cv.v;
  st.k_cache = b.k_cache;
  st.v_cache = b.v_cache;
  st.capacity = b.capacity;
  st.o = ws + cv.o;
  st.oo = ws + cv.oo;
  st.attn_workspace = ws + cv.attn;
  st.attn_workspace_bytes = attn_bytes;
  layer_forward_stages(cfg, layout, w, b.x, b.x_out, st, handle, stream);
  // y = [o; o'] W_O
  const long long d = static_cast<long long>(cfg.num_q_heads) * cfg.head_dim;
  gemm_rm(handle, cfg.dtype, false, false, tq, cfg.d_model, d, st.o, w.w_o, 0.f, b.y, "cublasGemmEx(y = o W_O)", stream);
  gemm_rm(handle, cfg.dtype, false, false, to, cfg.d_model, d, st.oo, w.w_o, 0.f, b.y_out, "cublasGemmEx(y' = o' W_O)",
          stream);
}

}  // namespace orthros::cuda
