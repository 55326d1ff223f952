// Backward kernels of the Orthros attention operator (SPEC §9; host side attention_backward.cu).
// FlashAttention-2 structure without atomics:
//   delta_kernel          Δ = rowsum(dO ⊙ O) and lse·log2(e), float32, one warp per (row, head)
//   *_bwd_dq_kernel       query-block-outer: dq / dq_out. Same work decomposition as the forward
//                         (make_work: rows = (token, query head of the group) pairs, KV tiles of
//                         the row block's band only); P recomputed from the saved LSE.
//   *_bwd_dkdv_kernel     KV-block-outer: dk / dv of one block of keys and one KV head; visits the
//                         base row blocks whose window covers the block, then the output row
//                         blocks at or after it; every query head of the group is a row, so the
//                         group's sum is part of one fixed accumulation order.
// Every output element is produced by one thread through a fixed sequence of operations that
// depends only on its own sequence (row blocks and key tiles are aligned to the sequence start),
// so results are bitwise reproducible and independent of the batch composition.
#pragma once

#include "common/device.cuh"
#include "forward/work.cuh"

#include <type_traits>

namespace orthros::cuda::detail {

struct BwdParams {
  KernelParams f;  // q, q_out, k, v (cache layout), o, o_out, lse, lse_out (inputs), seq table, dims
  const void* dO;
  const void* dO_out;
  void* dq;
  void* dq_out;
  void* dk;  // [sum T_b, H_kv, D] packed
  void* dv;
  float* delta;  // [total_q + total_out, H_q]: base rows first, then output rows
  float* lse2;   // same layout: lse * log2(e) (bf16/f16), lse itself (f32; see bwd_prob)
  long long total_q;
  float scale;  // softmax scale s
  FastDiv group_div;  // division by f.group
};

/// P = exp(s·dot − lse) of the SIMT kernels from the value the pre-pass stored. bf16/f16: the
/// forward's log2 domain (ex2.approx, like the tensor-core kernels). f32: the forward's own score
/// fl(dot · s·log2e) (the SIMT forward computes dot in the same order, so it is the same float)
/// minus lse·log2e formed in float64, then the accurate exp2f. The f32 shortcuts lose accuracy:
/// lse·log2e rounded to float costs |lse2|·2^-24 in the exponent (several ulps of P), and the
/// natural-log form fma(dot, s, −lse) mixes the forward's s·log2e with s, a relative mismatch of
/// ~1e-7 that at |scores| ~ 200 is a 2e-5 relative error of P, above the f32 tolerance (1e-5).
template <typename T>
__device__ __forceinline__ float bwd_prob(float dot, const KernelParams& f, float scale, float l) {
  if constexpr (std::is_same_v<T, float>) {
    (void)scale;
    const double x = __dsub_rn(static_cast<double>(__fmul_rn(dot, f.scale_log2)),
                               __dmul_rn(static_cast<double>(l), 1.4426950408889634074));
    return exp2f(static_cast<float>(x));
  } else {
    return fast_exp2(__fmaf_rn(dot, f.scale_log2, -l));
  }
}

__device__ __forceinline__ long long bwd_row_index(const BwdParams& p, const SeqDesc& sd, bool is_out, int i,
                                                   int head) {
  const long long row = is_out ? p.total_q + sd.out_off + i : (long long)sd.q_off + i;
  return row * p.f.Hq + head;
}

/// What a dq kernel needs of row r of work item w (KV head kvh; rows past r1 do not exist): its
/// key range [lo, hi] (row_lo / row_hi; lo = 1 > hi = 0 for a row that does not exist, so it sees
/// no key) and the pre-pass's lse2 and Δ (0 for such a row).
struct DqRow {
  int lo, hi;
  float lse2, delta;
};
__device__ __forceinline__ DqRow dq_row(const BwdParams& p, const SeqDesc& sd, const Work& w, int kvh, int r, int r1) {
  DqRow d{1, 0, 0.f, 0.f};
  if (r > r1) return d;
  d.lo = row_lo(p.f, w, r);
  d.hi = row_hi(p.f, w, r);
  const int tok = p.group_div.div(r);
  const long long ridx = bwd_row_index(p, sd, w.is_out, tok, kvh * p.f.group + (r - tok * p.f.group));
  d.lse2 = p.lse2[ridx];
  d.delta = p.delta[ridx];
  return d;
}

}  // namespace orthros::cuda::detail
