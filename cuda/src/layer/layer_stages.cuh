// Internal pieces shared by the layer forward (layer.cu) and its backward (layer_backward.cu):
// cuBLAS helpers, argument checks, the QK-norm + scale-offset kernel and the forward's stages up
// to the attention outputs (so the backward recomputes exactly the forward's bits).
#pragma once

#include "common/device.cuh"
#include "orthros/cuda/layer.hpp"

#include <cublas_v2.h>

namespace orthros::cuda::detail {

/// Throws CublasError naming `what` and the status unless `s` is CUBLAS_STATUS_SUCCESS.
void cublas_check(cublasStatus_t s, const char* what);

/// Row-major C[M, N] = op(A) op(B) + beta C on the handle's stream, fp32 accumulation
/// (CUBLAS_COMPUTE_32F; f32 uses CUBLAS_COMPUTE_32F_PEDANTIC: no TF32), rounded once to `dt`.
/// op(A) is [M, K]: A is stored [M, K] row-major, or [K, M] when trans_a (then op(A) = Aᵀ);
/// op(B) is [K, N]: B is stored [K, N], or [N, K] when trans_b. beta is 0 or 1; K = 0 gives
/// C = beta C. Sizes must fit int (validate_layer checks).
void gemm_rm(cublasHandle_t h, DType dt, bool trans_a, bool trans_b, long long M, long long N, long long K,
             const void* A, const void* B, float beta, void* C, const char* what, cudaStream_t stream);

/// Sets the handle's stream and math mode (no TF32, fp32 reductions) for one call and restores
/// the caller's on destruction.
class CublasScope {
 public:
  CublasScope(cublasHandle_t h, cudaStream_t stream);
  ~CublasScope();
  CublasScope(const CublasScope&) = delete;
  CublasScope& operator=(const CublasScope&) = delete;

 private:
  cublasHandle_t h_;
  cudaStream_t old_stream_ = nullptr;
  cublasMath_t old_mode_ = CUBLAS_DEFAULT_MATH;
};

/// Checks of a layer configuration and layout shared by forward and backward (orthros::Error).
void validate_layer(const LayerConfig& c, const BatchLayout& l);

/// r = 1/sqrt(mean(x²) + eps) of one head's D values, by one warp: lane-strided float32 sums, then
/// a fixed butterfly (every lane gets the same bits). The QK-norm's forward (qk_prep) and its
/// backward (layer_backward.cu) both use it, so the backward recomputes the forward's r exactly.
template <typename T>
__device__ __forceinline__ float warp_rms_inv(const T* x, int D, float eps, int lane) {
  float ss = 0.f;
  for (int i = lane; i < D; i += 32) {
    const float v = Elem<T>::to_f(x[i]);
    ss = __fadd_rn(ss, __fmul_rn(v, v));
  }
  for (int off = 16; off > 0; off >>= 1) ss = __fadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, off));
  return __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, static_cast<float>(D)), eps)));
}

/// Null checks of the weights a call with tq base and to output rows needs (names the weight).
void check_layer_weights(const LayerConfig& cfg, const LayerWeightsDevice& w, long long tq, long long to);

/// In place on x [rows, H, D]: optional RMSNorm with gain nw (null: none), then optional
/// alpha ⊙ x + beta (null: none), each rounded to the dtype (the reference's query_stages).
void qk_prep(DType dt, void* x, long long rows, int H, int D, const void* nw, float eps, const void* alpha,
             const void* beta, cudaStream_t stream);

/// Where layer_forward_stages() writes the forward's intermediates (device, cfg.dtype unless
/// noted). The *_lin pointers may be null (not kept); the others are needed.
struct LayerStages {
  void* q_lin = nullptr;   ///< [sum T, d] x W_Q (before the QK-norm), kept for the backward
  void* q = nullptr;       ///< [sum T, d] post-RoPE base queries
  void* qo_lin = nullptr;  ///< [sum T_out, d] x' W_Q
  void* qo = nullptr;      ///< [sum T_out, d] post-RoPE output queries
  void* k_lin = nullptr;   ///< [sum T, d_kv] x W_K
  void* k = nullptr;       ///< [sum T, d_kv] normed keys before RoPE (the append's input)
  void* v = nullptr;       ///< [sum T, d_kv] values
  void* k_cache = nullptr; ///< [B, capacity, H_kv, D]: this call's rows are written
  void* v_cache = nullptr;
  std::int64_t capacity = 0;
  void* o = nullptr;       ///< [sum T, d]
  void* oo = nullptr;      ///< [sum T_out, d]
  float* lse = nullptr;    ///< [sum T, H_q] or null
  float* lse_out = nullptr;  ///< [sum T_out, H_q] or null
  void* attn_workspace = nullptr;
  std::size_t attn_workspace_bytes = 0;
};

/// The layer forward up to the attention outputs (SPEC §2): projections, QK-norm and
/// scale-offset, RoPE with the cache append, attention_forward. The handle must be set up by a
/// CublasScope on `stream`; arguments are validated by the caller.
void layer_forward_stages(const LayerConfig& cfg, const BatchLayout& layout, const LayerWeightsDevice& w,
                          const void* x, const void* x_out, const LayerStages& st, cublasHandle_t handle,
                          cudaStream_t stream);

/// 256-byte aligned carving of one workspace.
class Carver {
 public:
  /// Reserves `bytes` (rounded up to 256) and returns its offset.
  std::size_t take(std::size_t bytes) {
    const std::size_t at = off_;
    off_ += (bytes + 255) / 256 * 256;
    return at;
  }
  std::size_t total() const { return off_; }

 private:
  std::size_t off_ = 0;
};

}  // namespace orthros::cuda::detail
