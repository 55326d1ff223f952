// The online softmax of one 16-row block over a KV tile (log2 domain), shared by the mma.sync and
// the wgmma kernels so their per-row arithmetic is the same source.
#pragma once

#include "common/device.cuh"

#include <cstdint>

namespace orthros::cuda::detail {


/// One 16-row block's step of the online softmax over a KV tile (log2 domain), shared by the
/// mma.sync and the wgmma kernels so their per-row arithmetic is the same source. In: the scores
/// s = q.k (m16n8 C layout, NT 8-key groups; this thread's rows g and g+8 are h = 0, 1), each row's
/// key range [lo[h], hi[h]], `kbase` the key index of column 2c of group 0, `full` true when every
/// row of the warp sees the whole tile, scale_log2 = scale * log2(e). Updates the running max m
/// (log2 domain) and sum l, leaves P = exp2(s scale_log2 - m) in s (0 outside the row's range), and
/// returns in `alpha` the factor the output accumulator must be scaled by (rescale_rows) before
/// P V is added. A tile outside a row's range is an exact no-op on that row's state (alpha = 1,
/// p = 0).
/// With a positive scale, where every key of a row that this thread holds is in the row's range
/// (always where the row sees the whole tile), the exponent is one rounding, fma(s, scale_log2, -m)
/// (FlashAttention's form: one FFMA per score). Elsewhere the score is scaled and rounded first,
/// then m subtracted (the same FFMA with the multiplier 1, exact), so the row's largest score gets
/// exp2(0) = 1 exactly: a row that sees one key (w = 1; never all of a thread's 2 NT keys of the
/// tile) has P = 1 and o = v exactly (SPEC §4). The form is a function of the row's range and the
/// key's place in the tile, not of the warp's other rows: a row gets the same bits in every kernel
/// family and regime. The row max is the same float in both forms: rounding is monotone, so
/// max_j fl(s_j c) = fl(c max_j s_j) for c > 0.
/// Row h's 2 NT values of this thread (s[j][2h], s[j][2h + 1]) reduced by `op` as a pairwise tree
/// in a fixed order: pairs first, then halves (dependency depth log2(2 NT) instead of 2 NT).
template <int NT, typename Op>
__device__ __forceinline__ float row_tree(const float (&s)[NT][4], int h, Op op) {
  static_assert((NT & (NT - 1)) == 0, "the pairwise tree needs a power-of-two number of 8-key groups");
  float t[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) t[j] = op(s[j][2 * h], s[j][2 * h + 1]);
#pragma unroll
  for (int w = NT / 2; w >= 1; w /= 2)
#pragma unroll
    for (int j = 0; j < w; ++j) t[j] = op(t[j], t[j + w]);
  return t[0];
}

template <int NT>
__device__ __forceinline__ void online_softmax_scores(float (&s)[NT][4], float (&m)[2], float (&l)[2],
                                                      const int (&lo)[2], const int (&hi)[2], int kbase, bool full,
                                                      float scale_log2, float (&alpha)[2]) {
  float mult[2] = {scale_log2, scale_log2};  // per row: scale_log2 on raw scores, 1 on scaled ones
  if (!full || !(scale_log2 > 0.f)) {
    // Key kbase + j*8 + (e&1) is in [lo, hi] iff its column j*8 + (e&1) (a constant) is in
    // [lo - kbase, hi - kbase]: the same test, one compare per bound.
    const int lor[2] = {lo[0] - kbase, lo[1] - kbase}, hir[2] = {hi[0] - kbase, hi[1] - kbase};
    bool raw[2];  // every key of row h that this thread holds (columns 0 .. (NT - 1) * 8 + 1) is in range
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      raw[h] = scale_log2 > 0.f && lor[h] <= 0 && hir[h] >= (NT - 1) * 8 + 1;
      if (!raw[h]) mult[h] = 1.f;
    }
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1, col = j * 8 + (e & 1);
        const float v = __fmul_rn(s[j][e], scale_log2);
        if (!raw[h]) s[j][e] = (col < lor[h] || col > hir[h]) ? kNegInf : v;
      }
  }
  // Row maxima as a pairwise tree (max is exact and order-free: the same value as a running max),
  // a raw row's scaled once.
  const auto max_op = [](float x, float y) { return fmaxf(x, y); };
  float mx[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) mx[h] = __fmul_rn(row_tree(s, h, max_op), mult[h]);
  float muse[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    const float mn = fmaxf(m[h], mx[h]);
    muse[h] = mn == kNegInf ? 0.f : mn;
    alpha[h] = fast_exp2(__fsub_rn(m[h], muse[h]));
    m[h] = mn;
  }
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = fast_exp2(__fmaf_rn(s[j][e], mult[e >> 1], -muse[e >> 1]));
  // This thread's part of each row sum, a pairwise tree in a fixed order; the quad's parts are
  // added when the row is finished.
  const auto add_op = [](float x, float y) { return __fadd_rn(x, y); };
#pragma unroll
  for (int h = 0; h < 2; ++h) l[h] = __fadd_rn(__fmul_rn(l[h], alpha[h]), row_tree(s, h, add_op));
}

/// o[j][e] *= alpha[row of e] (the accumulator layout of online_softmax_scores). Skipped when
/// every alpha of the warp is exactly 1 (no row's running max moved: most tiles of a long causal
/// row): x * 1 = x exactly, so the skip changes no bit. Warp-uniform branch (called by all lanes).
template <int DT>
__device__ __forceinline__ void rescale_rows(float (&o)[DT][4], const float (&alpha)[2]) {
  if (!__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) return;
#pragma unroll
  for (int j = 0; j < DT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[j][e] = __fmul_rn(o[j][e], alpha[e >> 1]);
}

/// online_softmax_scores followed by rescale_rows.
template <int NT, int DT>
__device__ __forceinline__ void online_softmax_tile(float (&s)[NT][4], float (&m)[2], float (&l)[2], float (&o)[DT][4],
                                                    const int (&lo)[2], const int (&hi)[2], int kbase, bool full,
                                                    float scale_log2) {
  float alpha[2];
  online_softmax_scores(s, m, l, lo, hi, kbase, full, scale_log2, alpha);
  rescale_rows(o, alpha);
}

/// Sum over the 4 threads of a quad (the columns of one accumulator row), fixed order.
__device__ __forceinline__ float quad_sum(float x) {
  x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return x;
}

}  // namespace orthros::cuda::detail
