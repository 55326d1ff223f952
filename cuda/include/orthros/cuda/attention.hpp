/// \file attention.hpp
/// \brief CUDA (sm_90) forward kernels of the Orthros attention operator (paper Eq. 2,
/// Algorithm 1; SPEC §2, §4, §5), plus RoPE and KV-cache append.
///
/// This header is plain C++17: it can be included from a .cpp compiled by g++ (only the CUDA
/// runtime API header is pulled in, for `cudaStream_t`). All pointers are DEVICE pointers;
/// every call is asynchronous on the given stream, except that argument validation happens on
/// the host before any launch.
///
/// Layouts (row-major, C-contiguous, the same as SPEC §5 and the CPU oracle):
///   - base queries   `q`     `[sum_b T_b,     H_q, D]`  sequences concatenated (cu_seqlens style)
///   - output queries `q_out` `[sum_b T_out_b, H_q, D]`  queries of the LAST T_out_b base positions
///   - KV cache `k_cache`, `v_cache` `[B, capacity, H_kv, D]`: sequence b's key of cache row j
///     (absolute position j+1, SPEC §2) is at `k_cache + ((b*capacity + j)*H_kv + h)*D`.
///     Rows `0 .. cache_len_b-1` must hold keys/values: the P_b cached ones AND this call's
///     T_b tokens (append them first, e.g. with rope_append_kv()).
///   - outputs `o` `[sum T_b, H_q, D]`, `o_out` `[sum T_out_b, H_q, D]` (input dtype; o_out in
///     float32 with AttentionBuffers::o_out_float32), `lse` `[sum T_b, H_q]`, `lse_out`
///     `[sum T_out_b, H_q]` (float32, natural log of the sum of exp of the scaled scores).
///
/// Errors: invalid arguments throw orthros::Error (message names the parameter and values)
/// before anything is launched; a failing CUDA call throws orthros::cuda::CudaError naming
/// the call and the CUDA error string. Input VALUES are not inspected (non-finite inputs give
/// unspecified outputs; the CPU oracle rejects them).
#pragma once

#include "orthros/error.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace orthros::cuda {

/// A CUDA runtime call or kernel launch failed. what() names the call and the CUDA error.
class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Element type of q, k, v, q_out, o, o_out. Accumulation is always float32.
enum class DType { f32, f16, bf16 };

/// Name of a dtype ("f32", "f16", "bf16"), as orthros::dtype_name().
const char* dtype_name(DType t);
/// Size of one element in bytes (4 or 2).
int dtype_size(DType t);

/// Which kernel family runs a call, forward (attention_forward) and backward (attention_backward)
/// alike (docs/cuda.md, "Kernels" and "Backward").
enum class KernelPath {
  automatic,  ///< the Hopper wgmma kernels where they apply (sm_90, bf16/f16, D 64/128), else generic
  hopper,     ///< the Hopper wgmma kernels; orthros::Error if the device or config has none
  generic,    ///< the mma.sync / SIMT kernels (any sm_80+ GPU, every dtype and D); for A/B tests
};

/// Operator configuration (SPEC §2). Supported: H_q % H_kv == 0; head_dim a multiple of 16 in
/// [16, 256]. bf16/f16 with D = 64 or 128 run on tensor cores with fp32 accumulation (wgmma on
/// sm_90 for launches with > 16 rows per sequence, mma.sync m16n8k16 otherwise); every other
/// supported case (f32, other D) runs on a SIMT kernel with fp32 arithmetic.
struct AttentionConfig {
  DType dtype = DType::bf16;    ///< element type of q, k, v, q_out, o, o_out
  int num_q_heads = 0;          ///< H_q
  int num_kv_heads = 0;         ///< H_kv (query head h reads KV head h / (H_q/H_kv): GQA)
  int head_dim = 0;             ///< D
  std::int64_t window = 128;    ///< w >= 1 keys, the current token included (SPEC §2)
  std::optional<double> scale;  ///< softmax scale s (finite); default 1/sqrt(D)
  /// Deterministic (batch-invariant) mode: every query row is computed from fixed KV chunks of
  /// kDeterministicChunk keys aligned to absolute positions, each chunk's tiles in ascending
  /// order, chunk states merged in ascending order; so o/o_out/lse of position t are bitwise
  /// identical in PT, SFT, prefill, chunked prefill and decode (SPEC §4.3). Costs an extra
  /// merge per chunk and fixes the split-KV granularity.
  bool deterministic = false;
  /// Split-KV count for the output stream in the fast mode: 0 = automatic (split only when the
  /// unsplit grid would leave the GPU idle), n >= 1 = exactly n splits. Ignored when
  /// deterministic (splits are then the fixed chunks).
  int num_splits = 0;
  /// Kernel family (the result is within SPEC §6 on every path; see docs/cuda.md for when the
  /// paths agree bitwise).
  KernelPath kernel = KernelPath::automatic;
};

/// Keys per chunk of the deterministic mode (a multiple of every kernel's KV tile).
constexpr int kDeterministicChunk = 1024;

/// Per-sequence lengths of a (ragged) batch, host side. All three vectors have B entries.
struct BatchLayout {
  std::vector<int> q_lens;              ///< T_b >= 0 base tokens of this call (0: sequence idle)
  std::vector<int> out_lens;            ///< T_out_b, 0 <= T_out_b <= T_b
  std::vector<std::int64_t> cache_lens; ///< P_b + T_b: valid cache rows, this call's tokens included
  /// One sequence: T base tokens after P cached ones, the last T_out with output queries.
  static BatchLayout single(int T, std::int64_t P, int T_out) { return BatchLayout{{T}, {T_out}, {P + T}}; }
  int batch() const { return static_cast<int>(q_lens.size()); }  ///< number of sequences B
  std::int64_t total_q() const;    ///< sum_b T_b
  std::int64_t total_out() const;  ///< sum_b T_out_b
};

/// Device buffers of one call. q_out/o_out/lse_out may be null when sum T_out_b == 0.
struct AttentionBuffers {
  const void* q = nullptr;         ///< [sum T_b, H_q, D]
  const void* q_out = nullptr;     ///< [sum T_out_b, H_q, D]
  const void* k_cache = nullptr;   ///< [B, capacity, H_kv, D]
  const void* v_cache = nullptr;   ///< [B, capacity, H_kv, D]
  std::int64_t capacity = 0;       ///< cache rows per sequence, >= max_b cache_lens[b]
  void* o = nullptr;               ///< [sum T_b, H_q, D]
  void* o_out = nullptr;           ///< [sum T_out_b, H_q, D] (dtype, or float32 with o_out_float32)
  /// Write o_out as float32 (the normalized output before its rounding to the dtype) instead of
  /// the dtype: for callers that merge output-stream partial states themselves (context
  /// parallelism, cp_output_partials), where a rounding per partial would add to the merge's.
  bool o_out_float32 = false;
  float* lse = nullptr;            ///< [sum T_b, H_q]; may be null (not written)
  float* lse_out = nullptr;        ///< [sum T_out_b, H_q]; may be null (not written)
  /// Optional scratch for split-KV partial states (attention_workspace_bytes()); when null the
  /// library uses an internal buffer per device (grown on demand, guarded by a mutex).
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;  ///< size of `workspace` in bytes
};

/// Bytes of split-KV scratch attention_forward() needs for this call (0 if it does not split).
/// \throws orthros::Error on invalid arguments (as attention_forward).
std::size_t attention_workspace_bytes(const AttentionConfig& cfg, const BatchLayout& batch);

/// The Orthros attention operator on the GPU (SPEC §2 and §5, paper Eq. 2), any regime:
///   - base query i of sequence b (cache row t = cache_len_b - T_b + i) attends to cache rows
///     [max(0, t-w+1), t] (sliding window, w keys at most): O(T*w), only the KV tiles inside the
///     window are read;
///   - output query j of sequence b (cache row t = cache_len_b - T_out_b + j) attends to cache
///     rows [0, t] (full causal), split over the KV length when few output queries exist
///     (split-KV with an LSE merge).
/// Regimes: PT (T_out = T, P = 0), SFT (0 < T_out < T), prefill (T_out = 1), chunked prefill
/// (P > 0, T_out >= 0), decode (T = T_out = 1, P = t-1); ragged batches mix them.
///
/// \throws orthros::Error before any launch on: dims <= 0, H_q % H_kv != 0, head_dim not a
///   multiple of 16 in [16, 256], window < 1, non-finite scale, num_splits < 0, layout vectors of
///   different sizes, T_b < 0, T_out_b > T_b or < 0, cache_len_b < T_b, cache_len_b > capacity,
///   a null pointer that is needed, a pointer not 16-byte aligned, a workspace that is too small.
/// \throws CudaError when a CUDA call or launch fails (message names the call).
void attention_forward(const AttentionConfig& cfg, const BatchLayout& batch, const AttentionBuffers& buf,
                       cudaStream_t stream = nullptr);

/// RoPE (rotate-half convention, Llama/Qwen; SPEC §2) applied in place to `x` `[N, H, D]`
/// (dtype of cfg; D even). Row n uses position `positions[n]` (device int64 array of N):
///   for d < D/2, f_d = theta^(-2d/D), a = pos * f_d:
///   x[d] <- x[d] cos a - x[d+D/2] sin a;   x[d+D/2] <- x[d+D/2] cos a + x[d] sin a
/// computed as the CPU reference (orthros::apply_rope, rope.hpp): angle, cos and sin in float64,
/// cos/sin rounded to float32, rotation in float32 (no FMA), rounded once to the dtype. The CUDA
/// libm's pow/cos/sin may differ from the host's in the last float64 bit, so results agree with
/// the reference to within one unit in the last place of the dtype (tested), usually bitwise.
/// \throws orthros::Error on N < 0, H < 1, odd or non-positive D, theta <= 0, null pointers.
/// \throws CudaError on a failed launch.
void apply_rope(DType dtype, void* x, const std::int64_t* positions, std::int64_t N, int H, int D, double theta,
                cudaStream_t stream = nullptr);

/// KV-cache append for a (ragged) batch, optionally fused with RoPE on the keys:
/// copies `k_new`/`v_new` `[sum T_b, H_kv, D]` into cache rows `cache_len_b - T_b .. cache_len_b - 1`
/// of sequence b (layout as AttentionBuffers). If `theta > 0`, keys are rotated (apply_rope
/// formula) with position = cache row + `position_offset` while being written; values are copied.
/// If `q` (`[sum T_b, H_q, D]`) is non-null it is rotated in place with the same positions, and
/// so is `q_out` (`[sum T_out_b, H_q, D]`, the last T_out_b positions of each sequence).
/// \throws orthros::Error on invalid layout/dims/pointers; CudaError on a failed launch.
void rope_append_kv(DType dtype, const BatchLayout& batch, int num_q_heads, int num_kv_heads, int head_dim,
                    const void* k_new, const void* v_new, void* k_cache, void* v_cache, std::int64_t capacity,
                    double theta, std::int64_t position_offset, void* q, void* q_out, cudaStream_t stream = nullptr);

/// Number of streaming multiprocessors of the current device (cached), for split heuristics.
int device_sm_count();

/// True when the current device runs the Hopper wgmma kernels (compute capability 9.0: the code is
/// built for sm_90a), i.e. when KernelPath::automatic picks them for bf16/f16 with D = 64/128.
/// False, never an exception, when no device is usable (no GPU, no driver, a driver too old for
/// the CUDA runtime, or a failing query of the device's compute capability).
bool hopper_kernels_available();

}  // namespace orthros::cuda
