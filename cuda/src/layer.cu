// The Orthros attention layer on the GPU (SPEC §2, paper Algorithm 1): cuBLAS projections, the
// QK RMSNorm + scale-offset kernel, RoPE fused with the KV-cache append, attention_forward.
#include "orthros/cuda/layer.hpp"

#include "common.cuh"

#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>

namespace orthros::cuda {
namespace {
using namespace detail;

void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw CublasError(std::string(what) + " failed: " + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) +
                      ")");
}
#define ORTHROS_CUBLAS_CHECK(call) cublas_check((call), #call)

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
  float inv = 1.f;
  if (nw) {
    float ss = 0.f;
    for (int i = lane; i < D; i += 32) {
      const float v = Elem<T>::to_f(p[i]);
      ss = __fadd_rn(ss, __fmul_rn(v, v));
    }
    for (int off = 16; off > 0; off >>= 1) ss = __fadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, off));
    inv = __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, static_cast<float>(D)), eps)));
  }
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

void qk_prep(DType dt, void* x, long long rows, int H, int D, const void* nw, float eps, const void* alpha,
             const void* beta, cudaStream_t stream) {
  switch (dt) {
    case DType::f32: launch_qk_prep<float>(x, rows, H, D, nw, eps, alpha, beta, stream); break;
    case DType::f16: launch_qk_prep<__half>(x, rows, H, D, nw, eps, alpha, beta, stream); break;
    case DType::bf16: launch_qk_prep<__nv_bfloat16>(x, rows, H, D, nw, eps, alpha, beta, stream); break;
  }
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

// Row-major Y[N, n] = X[N, k] W[k, n] as the column-major product Y^T = W^T X^T.
void gemm_rm(cublasHandle_t h, DType dt, long long N, long long k, long long n, const void* X, const void* W, void* Y,
             const char* what) {
  if (N == 0) return;
  const float one = 1.f, zero = 0.f;
  const cudaDataType_t t = cuda_type(dt);
  const cublasComputeType_t ct = dt == DType::f32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
  const cublasStatus_t s =
      cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(N), static_cast<int>(k), &one,
                   W, t, static_cast<int>(n), X, t, static_cast<int>(k), &zero, Y, t, static_cast<int>(n), ct,
                   CUBLAS_GEMM_DEFAULT);
  cublas_check(s, what);
}

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

struct Carve {
  size_t q, qo, k, v, o, oo, attn, total;
};

Carve carve(const LayerConfig& c, const BatchLayout& l, size_t attn_bytes) {
  const size_t es = static_cast<size_t>(dtype_size(c.dtype));
  const size_t d = static_cast<size_t>(c.num_q_heads) * c.head_dim, dkv = static_cast<size_t>(c.num_kv_heads) * c.head_dim;
  const size_t tq = static_cast<size_t>(l.total_q()), to = static_cast<size_t>(l.total_out());
  Carve cv{};
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += align256(bytes);
    return at;
  };
  cv.q = take(tq * d * es);
  cv.qo = take(to * d * es);
  cv.k = take(tq * dkv * es);
  cv.v = take(tq * dkv * es);
  cv.o = take(tq * d * es);
  cv.oo = take(to * d * es);
  cv.attn = take(attn_bytes);
  cv.total = off;
  return cv;
}

void validate(const LayerConfig& c, const BatchLayout& l) {
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
  validate(cfg, layout);
  return carve(cfg, layout, attention_workspace_bytes(cfg.attention(), layout)).total;
}

void attention_layer_forward(const LayerConfig& cfg, const BatchLayout& layout, const LayerWeightsDevice& w,
                             const LayerBuffers& b, cublasHandle_t handle, cudaStream_t stream) {
  // ---- validation: everything before the first launch ----
  validate(cfg, layout);
  const AttentionConfig acfg = cfg.attention();
  const size_t attn_bytes = attention_workspace_bytes(acfg, layout);  // validates dims, window, layout
  const Carve cv = carve(cfg, layout, attn_bytes);
  for (int i = 0; i < layout.batch(); ++i)
    require(layout.cache_lens[i] <= b.capacity, "cache_lens[", i, "] must be <= capacity (got ", layout.cache_lens[i],
            ", capacity = ", b.capacity, ")");
  const long long tq = layout.total_q(), to = layout.total_out();
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
    need(b.x, "buffers.x");
    need(b.y, "buffers.y");
    need(b.k_cache, "buffers.k_cache");
    need(b.v_cache, "buffers.v_cache");
  }
  if (to > 0) {
    need(w.alpha_out, "weights.alpha_out");
    need(w.beta_out, "weights.beta_out");
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
  void *q = ws + cv.q, *qo = ws + cv.qo, *k = ws + cv.k, *v = ws + cv.v, *o = ws + cv.o, *oo = ws + cv.oo;
  const int H = cfg.num_q_heads, Hkv = cfg.num_kv_heads, D = cfg.head_dim;
  const long long dm = cfg.d_model, d = static_cast<long long>(H) * D, dkv = static_cast<long long>(Hkv) * D;
  const float eps = static_cast<float>(cfg.rms_eps);  // the reference's static_cast<Acc>(eps)

  // cuBLAS state for this call: our stream, no TF32, reductions in the fp32 compute type; restored after.
  cudaStream_t old_stream = nullptr;
  cublasMath_t old_mode = CUBLAS_DEFAULT_MATH;
  ORTHROS_CUBLAS_CHECK(cublasGetStream(handle, &old_stream));
  ORTHROS_CUBLAS_CHECK(cublasGetMathMode(handle, &old_mode));
  struct Restore {
    cublasHandle_t h;
    cudaStream_t s;
    cublasMath_t m;
    ~Restore() {
      cublasSetStream(h, s);
      cublasSetMathMode(h, m);
    }
  } restore{handle, old_stream, old_mode};
  ORTHROS_CUBLAS_CHECK(cublasSetStream(handle, stream));
  ORTHROS_CUBLAS_CHECK(cublasSetMathMode(
      handle, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));

  // Projections (rounded to the dtype, as the reference's project()).
  gemm_rm(handle, cfg.dtype, tq, dm, d, b.x, w.w_q, q, "cublasGemmEx(q = x W_Q)");
  gemm_rm(handle, cfg.dtype, to, dm, d, b.x_out, w.w_q, qo, "cublasGemmEx(q' = x' W_Q)");
  gemm_rm(handle, cfg.dtype, tq, dm, dkv, b.x, w.w_k, k, "cublasGemmEx(k = x W_K)");
  gemm_rm(handle, cfg.dtype, tq, dm, dkv, b.x, w.w_v, v, "cublasGemmEx(v = x W_V)");
  // QK-norm and scale-offset (each rounded to the dtype).
  const void* qn = cfg.qk_norm ? w.q_norm : nullptr;
  const void* kn = cfg.qk_norm ? w.k_norm : nullptr;
  qk_prep(cfg.dtype, q, tq, H, D, qn, eps, w.alpha, w.beta, stream);
  qk_prep(cfg.dtype, qo, to, H, D, qn, eps, w.alpha_out, w.beta_out, stream);
  qk_prep(cfg.dtype, k, tq, Hkv, D, kn, eps, nullptr, nullptr, stream);
  // RoPE on k (while appending k, v to the cache), q and q' in place; position = cache row.
  rope_append_kv(cfg.dtype, layout, H, Hkv, D, k, v, b.k_cache, b.v_cache, b.capacity, cfg.rope_theta, 0, q,
                 to > 0 ? qo : nullptr, stream);
  // Attention over the cache (both streams, one launch).
  AttentionBuffers ab;
  ab.q = q;
  ab.q_out = to > 0 ? qo : nullptr;
  ab.k_cache = b.k_cache;
  ab.v_cache = b.v_cache;
  ab.capacity = b.capacity;
  ab.o = o;
  ab.o_out = to > 0 ? oo : nullptr;
  ab.workspace = attn_bytes ? ws + cv.attn : nullptr;
  ab.workspace_bytes = attn_bytes;
  attention_forward(acfg, layout, ab, stream);
  // y = [o; o'] W_O
  gemm_rm(handle, cfg.dtype, tq, d, dm, o, w.w_o, b.y, "cublasGemmEx(y = o W_O)");
  gemm_rm(handle, cfg.dtype, to, d, dm, oo, w.w_o, b.y_out, "cublasGemmEx(y' = o' W_O)");
}

}  // namespace orthros::cuda
