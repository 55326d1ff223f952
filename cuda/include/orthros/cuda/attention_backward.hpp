/// \file attention_backward.hpp
/// \brief CUDA (sm_90) backward of the Orthros attention operator for training sequences (PT and
/// SFT: P = 0), SPEC §9. The CPU oracle is orthros_attention_backward
/// (reference/include/orthros/attention_backward.hpp).
///
/// Plain C++17 like attention.hpp; all pointers are DEVICE pointers; the call is asynchronous on
/// the given stream, arguments are validated on the host before any launch.
///
/// Layouts (row-major; `[sum T_b, ...]` = sequences concatenated, cu_seqlens style):
///   - inputs as attention_forward() took / wrote them: `q` `[sum T_b, H_q, D]`, `q_out`
///     `[sum T_out_b, H_q, D]`, `k_cache`/`v_cache` `[B, capacity, H_kv, D]` (rows 0..T_b-1 of
///     sequence b hold its keys/values: cache_lens[b] = T_b), `o`, `o_out` (dtype), `lse`,
///     `lse_out` (float32, natural log; the forward's, which define P = exp(s q·k - lse));
///   - upstream gradients `d_o` `[sum T_b, H_q, D]`, `d_o_out` `[sum T_out_b, H_q, D]` (dtype);
///   - outputs (dtype): `dq` `[sum T_b, H_q, D]`, `dq_out` `[sum T_out_b, H_q, D]`, and `dk`, `dv`
///     `[sum T_b, H_kv, D]` PACKED like the projections' outputs k_new/v_new that
///     rope_append_kv() took (row q_off_b + j = cache row j of sequence b), NOT the cache layout:
///     what a training step back-propagates into W_K/W_V. dk/dv sum both streams (base queries
///     through the window, output queries through full causal attention) and every query head
///     of the GQA group (SPEC §9).
#pragma once

#include "orthros/cuda/attention.hpp"

namespace orthros::cuda {

/// Device buffers of one backward call. q_out/o_out/lse_out/d_o_out/dq_out may be null when
/// sum T_out_b == 0.
struct AttentionBackwardBuffers {
  const void* q = nullptr;         ///< [sum T_b, H_q, D]
  const void* q_out = nullptr;     ///< [sum T_out_b, H_q, D]
  const void* k_cache = nullptr;   ///< [B, capacity, H_kv, D]
  const void* v_cache = nullptr;   ///< [B, capacity, H_kv, D]
  std::int64_t capacity = 0;       ///< cache rows per sequence, >= max_b T_b
  const void* o = nullptr;         ///< forward output [sum T_b, H_q, D]
  const void* o_out = nullptr;     ///< forward output [sum T_out_b, H_q, D]
  const float* lse = nullptr;      ///< forward LSE [sum T_b, H_q]
  const float* lse_out = nullptr;  ///< forward LSE [sum T_out_b, H_q]
  const void* d_o = nullptr;       ///< dL/do [sum T_b, H_q, D]
  const void* d_o_out = nullptr;   ///< dL/do_out [sum T_out_b, H_q, D]
  void* dq = nullptr;              ///< [sum T_b, H_q, D]
  void* dq_out = nullptr;          ///< [sum T_out_b, H_q, D]
  void* dk = nullptr;              ///< [sum T_b, H_kv, D] (packed, see the file comment)
  void* dv = nullptr;              ///< [sum T_b, H_kv, D]
  /// Scratch for the pre-pass (Δ = rowsum(dO ⊙ O) and the LSE in log2 units, float32 per row and
  /// head) and, on the Hopper fast path, the float32 dq accumulator:
  /// attention_backward_workspace_bytes(). When null, the call allocates it on the stream
  /// (cudaMallocAsync / cudaFreeAsync).
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;  ///< size of `workspace` in bytes
};

/// Bytes of scratch attention_backward() needs on the current device: 8 * (sum T_b + sum T_out_b)
/// * H_q (the pre-pass) or, when the dk/dv kernel computes dq (the fused dq of
/// attention_backward), that rounded up to 256 plus the float32 dq accumulator: 4 * D * H_kv * 64 per 64-row block of each
/// sequence's rows (T_b * G and T_out_b * G rows, G = H_q / H_kv), (sum T_b * G / 64 + B + 1) +
/// (sum T_out_b * G / 64 + B + 1) blocks (about 4 * D * H_q bytes per row of both streams).
/// \throws orthros::Error on invalid arguments (as attention_backward).
std::size_t attention_backward_workspace_bytes(const AttentionConfig& cfg, const BatchLayout& batch);

/// True when attention_backward(cfg, batch, ...) on the current device gives bitwise the same
/// gradients run to run: always in the deterministic mode and on the generic path; in the Hopper
/// fast mode unless the call folds dq into the dk/dv kernel (the fused dq: a sequence of >= 12288
/// tokens with T_out >= T/4, or one with >= 24576 output rows; see attention_backward). dk and dv are reproducible in every case, and batch-invariant
/// whenever the call is reproducible.
/// \throws orthros::Error on invalid arguments (as attention_backward).
bool attention_backward_is_reproducible(const AttentionConfig& cfg, const BatchLayout& batch);

/// Gradients of the Orthros attention operator (SPEC §9) for a ragged batch of training
/// sequences (P = 0: cache_lens[b] == q_lens[b]; PT T_out = T, SFT 0 < T_out < T; T_out = 0 is
/// allowed), P recomputed from the saved LSE (FlashAttention-2's structure). A pre-pass computes
/// Δ = rowsum(dO ⊙ O) in float32 per (row, head) of both streams; then
///   - a KV-block-outer kernel: dk and dv of a block of keys, visiting the base rows whose window
///     covers it and the output rows at or after it, all heads of the GQA group in one fixed order;
///   - dq and dq_out: from a query-outer kernel (base rows visit only the KV tiles of their window
///     band: O(T·w); output rows the causal prefix), in a fixed order; or, in the Hopper fast mode
///     when a sequence has >= 12288 tokens and T_out >= T/4, or >= 24576 output rows (where it
///     was measured faster), from the same KV-block-outer
///     kernel (the fused dq, FlashAttention-3's structure: each CTA adds its partial dq of every
///     row block it visits to a float32 accumulator in the workspace, in no fixed order; a
///     post-pass scales and rounds it).
/// Kernel paths (cfg.kernel, docs/cuda.md): Hopper (sm_90, bf16/f16, D = 64/128; automatic or
/// hopper): warp-specialized wgmma + TMA kernels (128-key dk/dv blocks, 192-row dq blocks);
/// generic (any sm_80+ GPU, every dtype and D): bf16/f16 with D = 64/128 on mma.sync m16n8k16
/// (fp32 accumulate), f32 and other D on SIMT kernels (fp32 arithmetic).
/// Reproducibility: dk and dv are written by one thread each after a fixed sequence of operations
/// that depends only on their own sequence, in both modes on every path. dq and dq_out are too in
/// the deterministic mode (`cfg.deterministic`), on the generic path and without the fused dq; the
/// fused dq's float32 additions run in the order the CTAs finish, so its dq may differ in the last
/// bits from run to run (attention_backward_is_reproducible). ORTHROS_BWD_FUSED_DQ=1 / 0 in the
/// environment forces the fused dq on / off for every Hopper fast-mode call. Every path and mode is within SPEC §6 of
/// the float64 oracle. `cfg.num_splits` is ignored.
/// Streams: when the dq and dk/dv kernels are separate, the dk/dv kernel runs on a second,
/// greatest-priority stream of this host thread and device, forked from `stream` and joined back
/// into it by events (ORTHROS_BWD_CONCURRENT=0 keeps everything on `stream`). Work queued on
/// `stream` afterwards sees every gradient. The call can be captured into a CUDA graph (the
/// priority survives only with cudaGraphInstantiateFlagUseNodePriority; a thread whose first
/// backward is captured runs it on `stream` alone). The bits do not depend on any of this.
///
/// \throws orthros::Error before any launch on everything attention_forward() rejects, on
///   cfg.kernel = hopper without a compute capability 9.0 GPU, on
///   cache_lens[b] != q_lens[b] (P > 0: not a training sequence), on a null pointer that is
///   needed, a pointer not 16-byte aligned, or a workspace too small / misaligned.
/// \throws CudaError when a CUDA call or launch fails (message names the call).
void attention_backward(const AttentionConfig& cfg, const BatchLayout& batch, const AttentionBackwardBuffers& buf,
                        cudaStream_t stream = nullptr);

}  // namespace orthros::cuda
