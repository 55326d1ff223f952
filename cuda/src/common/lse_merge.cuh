// The merges of softmax states that run after the attention kernels: one output element's chain
// of unnormalized split states (the split-KV merge and context parallelism's state path), and the
// merge of normalized (o, lse) pairs (context parallelism's per-rank partials). The in-kernel
// chunk merges of deterministic mode use the same merge_coeffs/merge_val (forward/chunk_merge.cuh).
#pragma once

#include "common/device.cuh"

namespace orthros::cuda::detail {

/// One output element (row, head, dim d) of a chain of unnormalized states (m, l, acc[d]) in the
/// log2 domain (the layout [.., D+2] = (m, l, acc[D]) of the split-KV workspace), folded in the
/// order add() is called, from the empty state (-inf, 0, 0), with merge_coeffs/merge_val: the
/// operations of the in-kernel chunk merges, so a chain whose states are a row's deterministic
/// chunks gives the bits of the single-launch path. output() = acc / l, lse() = state_lse(m, l).
struct StateChain {
  float M = kNegInf, L = 0.f, acc = 0.f;
  __device__ __forceinline__ void add(float m, float l, float a) {
    const MergeCoeffs cf = merge_coeffs(M, m);
    L = merge_val(L, l, cf);
    acc = merge_val(acc, a, cf);
    M = cf.m;
  }
  template <typename T>
  __device__ __forceinline__ T output() const {
    return Elem<T>::from_f(__fmul_rn(acc, __frcp_rn(L)));
  }
  __device__ __forceinline__ float lse() const { return state_lse(M, L); }
};

/// The merge of R normalized partial results (o_r, lse_r) of one (row, head), natural log, ranks
/// ascending (merge_partial_states, reference/include/orthros/context_parallel.hpp), in float32
/// with explicit round-to-nearest operations: M = max lse_r, L = sum exp(lse_r - M),
/// o = sum (exp(lse_r - M) / L) o_r, lse = M + log L. Empty partials (lse_r = -inf) take no part,
/// so one non-empty partial passes through unchanged; M = -inf (no partial holds keys; not a
/// valid layout) gives NaN. lse_r(r) reads partial r's LSE, o_r(r) its output element.
struct PairMerge {
  float M = kNegInf, L = 0.f;
  template <typename Lse>
  __device__ __forceinline__ PairMerge(int R, const Lse& lse_r) {
    for (int r = 0; r < R; ++r) M = fmaxf(M, lse_r(r));
    for (int r = 0; r < R; ++r) {
      const float l = lse_r(r);
      if (l != kNegInf) L = __fadd_rn(L, expf(__fsub_rn(l, M)));
    }
  }
  /// One output element: sum over the non-empty partials of (exp(lse_r - M) / L) o_r.
  template <typename O, typename Lse>
  __device__ __forceinline__ float output(int R, const O& o_r, const Lse& lse_r) const {
    float acc = 0.f;
    for (int r = 0; r < R; ++r) {
      const float l = lse_r(r);
      if (l == kNegInf) continue;
      const float w = __fdiv_rn(expf(__fsub_rn(l, M)), L);
      acc = __fadd_rn(acc, __fmul_rn(w, o_r(r)));
    }
    return M == kNegInf ? NAN : acc;
  }
  /// M + log L in float64, rounded once (as state_lse: no extra float32 rounding of log L).
  __device__ __forceinline__ float lse() const {
    return M == kNegInf ? NAN : __double2float_rn(__dadd_rn(double(M), log(double(L))));
  }
};

}  // namespace orthros::cuda::detail
