/// \file layer_backward.hpp
/// \brief Backward of the Orthros attention layer on the GPU for training calls (PT and SFT:
/// P = 0), SPEC §9. The CPU oracle is orthros::orthros_attention_layer_backward
/// (reference/include/orthros/layer_backward.hpp); the stages and their derivatives are listed
/// there, and this file applies them in the same order:
/// \code{.unparsed}
///   dW_O = oᵀdy + o'ᵀdy'            do = dy W_Oᵀ, do' = dy' W_Oᵀ              (cuBLAS)
///   dq, dq', dk, dv                                       (attention_backward())
///   dq̂ = RoPE⁻¹(dq); dα = Σ dq̂ ⊙ n, dβ = Σ dq̂; dn = α ⊙ dq̂; QK-norm backward (a kernel)
///   dW_Q = xᵀd(xW_Q) + x'ᵀd(x'W_Q), dW_K = xᵀd(xW_K), dW_V = xᵀdv               (cuBLAS)
///   dx = d(xW_Q) W_Qᵀ + d(xW_K) W_Kᵀ + dv W_Vᵀ,  dx' = d(x'W_Q) W_Qᵀ             (cuBLAS)
/// \endcode
/// The forward's intermediates are recomputed from x and x' inside the call (activation
/// recomputation: the same kernels as attention_layer_forward(), so the same bits), which costs
/// about one layer forward and keeps the API to what a training step holds anyway.
///
/// Plain C++17 header; all pointers are DEVICE pointers; asynchronous on `stream`.
#pragma once

#include "orthros/cuda/layer.hpp"

namespace orthros::cuda {

/// Gradients of one call (cfg.dtype, row-major, the shapes of LayerWeightsDevice for the
/// weights; d = H_q*D, d_kv = H_kv*D). Every buffer is OVERWRITTEN (not accumulated into); the
/// weight gradients are summed over all sequences of the batch.
struct LayerGradsDevice {
  void* dx = nullptr;          ///< [sum T_b, d_model] dL/dx
  void* dx_out = nullptr;      ///< [sum T_out_b, d_model] dL/dx' (may be null when sum T_out_b = 0)
  void* w_q = nullptr;         ///< [d_model, d] dL/dW_Q (both query streams)
  void* w_k = nullptr;         ///< [d_model, d_kv]
  void* w_v = nullptr;         ///< [d_model, d_kv]
  void* w_o = nullptr;         ///< [d, d_model] (both streams)
  void* alpha = nullptr;       ///< [d]
  void* beta = nullptr;        ///< [d]
  void* alpha_out = nullptr;   ///< [d] (zeros when sum T_out_b = 0)
  void* beta_out = nullptr;    ///< [d]
  void* q_norm = nullptr;      ///< [D] (both query streams); may be null when qk_norm is off, else zeros
  void* k_norm = nullptr;      ///< [D]; may be null when qk_norm is off, else zeros
};

/// Inputs, outputs and scratch of one backward call.
struct LayerBackwardBuffers {
  const void* x = nullptr;       ///< [sum T_b, d_model] the forward's base rows
  const void* x_out = nullptr;   ///< [sum T_out_b, d_model] the forward's output rows
  const void* dy = nullptr;      ///< [sum T_b, d_model] dL/dy
  const void* dy_out = nullptr;  ///< [sum T_out_b, d_model] dL/dy'
  LayerGradsDevice grads;        ///< outputs
  void* workspace = nullptr;     ///< attention_layer_backward_workspace_bytes() bytes, 256-byte aligned
  std::size_t workspace_bytes = 0;  ///< size of `workspace` in bytes
};

/// Scratch bytes attention_layer_backward() needs: the recomputed forward (q, q', k, v before
/// and after their norms, a KV cache of max_b T_b rows, o, o', LSEs), the upstream gradients of
/// the attention operator and its outputs, and float32 partial products of the parameter
/// reductions; O((sum T_b + sum T_out_b) · (H_q + H_kv) · D) bytes.
/// \throws orthros::Error as attention_layer_backward() (before any launch).
std::size_t attention_layer_backward_workspace_bytes(const LayerConfig& cfg, const BatchLayout& layout);

/// Gradients of the Orthros attention layer (paper Algorithm 1, SPEC §9) for a ragged batch of
/// training sequences: `layout` as attention_layer_forward() took it with P = 0
/// (cache_lens[b] == q_lens[b]; PT T_out = T, SFT 0 < T_out < T, T_out = 0 allowed). Base row i
/// of sequence b has RoPE position i, its output row j position T_b - T_out_b + j.
/// Every reduction of the layer's own kernels (over rows for dα, dβ, the QK-norm gains; cuBLAS
/// GEMMs) runs in a fixed order. cfg.deterministic selects the deterministic mode of the
/// recomputed forward and of attention_backward(): with it the gradients are bitwise reproducible
/// run to run; without it they are too unless attention_backward_is_reproducible(cfg.attention(),
/// layout)
/// is false (the Hopper fast mode adds dq in float32 in no fixed order, and dq reaches dx and the weights).
///
/// \throws orthros::Error before any launch on everything attention_layer_forward() rejects, on
///   cache_lens[b] != q_lens[b], on a null pointer that is needed (names it), a workspace that
///   is null/too small/not 256-byte aligned, a null cuBLAS handle.
/// \throws CudaError / CublasError naming the failing call.
void attention_layer_backward(const LayerConfig& cfg, const BatchLayout& layout, const LayerWeightsDevice& weights,
                              const LayerBackwardBuffers& buffers, cublasHandle_t handle, cudaStream_t stream = nullptr);

}  // namespace orthros::cuda
