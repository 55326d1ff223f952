/// \file layer.hpp
/// \brief A full Orthros attention layer on the GPU (paper Algorithm 1; SPEC §2): cuBLAS for the
/// projections, small kernels for the per-head QK RMSNorm and the scale-offset, RoPE fused with
/// the KV-cache append (rope_append_kv()), and the attention operator (attention_forward()).
///
/// It mirrors the CPU reference `orthros::orthros_attention_layer_batch` (reference/include/
/// orthros/layer.hpp) step by step, with the same roundings to the dtype:
///   q  = RoPE(alpha  ⊙ norm_q(x  W_Q) + beta , pos)      (rounded after the GEMM, the norm,
///   q' = RoPE(alpha' ⊙ norm_q(x' W_Q) + beta', pos)       the scale-offset and the RoPE)
///   k  = RoPE(norm_k(x W_K), pos) -> appended to the cache;  v = x W_V -> appended
///   [o; o'] = Orthros attention;   y = o W_O,  y' = o' W_O
/// with 0-based RoPE position pos = (absolute position) - 1 = cache row; an output token uses
/// its base token's position. GEMMs accumulate in float32 (cublasGemmEx, CUBLAS_COMPUTE_32F;
/// f32 uses CUBLAS_COMPUTE_32F_PEDANTIC, i.e. no TF32) and round once to the dtype.
///
/// Plain C++17 header (includes only the CUDA runtime API and cuBLAS handle type).
#pragma once

#include "orthros/cuda/attention.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>

struct cublasContext;
/// cuBLAS handle type, declared as in cublas_api.h so this header needs no cuBLAS include.
typedef struct cublasContext* cublasHandle_t;

namespace orthros::cuda {

/// A cuBLAS call failed; what() names the call and the cuBLAS status.
class CublasError : public CudaError {
 public:
  using CudaError::CudaError;
};

/// Configuration of one attention layer (the CUDA counterpart of orthros::AttentionConfig).
struct LayerConfig {
  DType dtype = DType::bf16;    ///< element type of activations, weights and the KV cache
  std::int64_t d_model = 0;     ///< hidden size (rows of W_Q/W_K/W_V, columns of W_O)
  int num_q_heads = 0;          ///< H_q
  int num_kv_heads = 0;         ///< H_kv (divides H_q: GQA)
  int head_dim = 0;             ///< D: a multiple of 16 in [16, 256] (attention_forward's set)
  std::int64_t window = 128;    ///< sliding window w >= 1, current token included
  double rope_theta = 1e4;      ///< RoPE base, finite and > 0
  bool qk_norm = true;          ///< per-head RMSNorm of q and k (Qwen3); identity when false
  double rms_eps = 1e-6;        ///< epsilon of the QK RMSNorm (finite, >= 0)
  std::optional<double> scale;  ///< softmax scale; default 1/sqrt(D)
  bool deterministic = false;   ///< forwarded to AttentionConfig::deterministic
  int num_splits = 0;           ///< forwarded to AttentionConfig::num_splits
  /// The AttentionConfig of the attention step.
  AttentionConfig attention() const;
};

/// Device weights of one layer, all in cfg.dtype, row-major (the reference's AttentionWeights).
/// d = H_q*D, d_kv = H_kv*D.
struct LayerWeightsDevice {
  const void* w_q = nullptr;        ///< [d_model, d]
  const void* w_k = nullptr;        ///< [d_model, d_kv]
  const void* w_v = nullptr;        ///< [d_model, d_kv]
  const void* w_o = nullptr;        ///< [d, d_model]
  const void* alpha = nullptr;      ///< [d] scale of the base query
  const void* beta = nullptr;       ///< [d] offset of the base query
  const void* alpha_out = nullptr;  ///< [d] scale of the output-specific query
  const void* beta_out = nullptr;   ///< [d] offset of the output-specific query
  const void* q_norm = nullptr;     ///< [D] RMSNorm weight (needed when qk_norm)
  const void* k_norm = nullptr;     ///< [D] RMSNorm weight (needed when qk_norm)
};

/// Activations, KV cache and scratch of one call (device pointers, cfg.dtype).
struct LayerBuffers {
  const void* x = nullptr;      ///< [sum T_b, d_model] normed hidden states of the base tokens
  const void* x_out = nullptr;  ///< [sum T_out_b, d_model] output-specific tokens (null if none)
  /// [B, capacity, H_kv, D] (AttentionBuffers layout). Rows 0 .. P_b-1 hold the cached post-RoPE
  /// keys / values; this call writes rows P_b .. P_b+T_b-1 (P_b = cache_lens[b] - T_b).
  void* k_cache = nullptr;      ///< [B, capacity, H_kv, D] post-RoPE keys
  void* v_cache = nullptr;      ///< [B, capacity, H_kv, D] values
  std::int64_t capacity = 0;    ///< cache rows per sequence
  void* y = nullptr;            ///< [sum T_b, d_model] = o W_O
  void* y_out = nullptr;        ///< [sum T_out_b, d_model] = o' W_O (null if none)
  void* workspace = nullptr;    ///< attention_layer_workspace_bytes() bytes, 256-byte aligned
  std::size_t workspace_bytes = 0;  ///< size of `workspace` in bytes
};

/// Scratch bytes attention_layer_forward() needs: q, q', k, v, o, o' and the attention's
/// split-KV workspace. \throws orthros::Error on invalid cfg/layout (as attention_layer_forward).
std::size_t attention_layer_workspace_bytes(const LayerConfig& cfg, const BatchLayout& layout);

/// One Orthros attention layer over a ragged batch (paper Algorithm 1; SPEC §2), asynchronous
/// on `stream`. `layout` is attention_forward()'s: T_b base tokens at absolute positions
/// P_b+1 .. P_b+T_b with cache_lens[b] = P_b + T_b, the last T_out_b of them with output tokens.
/// The handle's stream and math mode are set for the call and restored afterwards (the handle
/// must not be used concurrently from another thread).
///
/// \throws orthros::Error before any launch on: d_model < 1, invalid attention dims/window/scale
///   (as attention_forward), odd D, rope_theta not finite or <= 0, rms_eps not finite or < 0,
///   an invalid layout, cache_lens[b] > capacity, sizes beyond int range of cuBLAS, a null
///   pointer that is needed (names it), a workspace that is null/too small/not 256-byte aligned,
///   a null cuBLAS handle.
/// \throws CudaError / CublasError naming the failing call.
void attention_layer_forward(const LayerConfig& cfg, const BatchLayout& layout, const LayerWeightsDevice& weights,
                             const LayerBuffers& buffers, cublasHandle_t handle, cudaStream_t stream = nullptr);

}  // namespace orthros::cuda
