// Deterministic mode's chunk merge: a 16-row block's chunk state (m, l, o) merged into its running
// state with merge_coeffs/merge_val, wherever the running output lives (registers or shared memory).
#pragma once

#include "forward/online_softmax.cuh"

#include <cstdint>

namespace orthros::cuda::detail {


/// Deterministic mode: the running output of one thread's accumulator elements (j, e), read with
/// get() and written with set(). RegAcc: registers (the mma.sync kernel; the Hopper kernel keeps
/// it in shared memory to save 64 registers per thread at D = 128). EmptyUntil: reads +0, the
/// empty running output, until `filled` (a row block's first merge), then `acc`.
template <int DT>
struct RegAcc {
  float (&a)[DT][4];
  __device__ float get(int j, int e) const { return a[j][e]; }
  __device__ void set(int j, int e, float v) const { a[j][e] = v; }
};
template <typename Acc>
struct EmptyUntil {
  const Acc& acc;
  bool filled;
  __device__ float get(int j, int e) const { return filled ? acc.get(j, e) : 0.f; }
};

/// One accumulator row h (elements (j, 2h), (j, 2h+1)) of merge_chunk_state: the chunk's max m
/// and quad-summed sum lf merged into (rm, rl), the output read from `src`, written to `dst`.
template <int DT, typename Src, typename Dst>
__device__ __forceinline__ void merge_chunk_row(int h, float m, float lf, const float (&o)[DT][4], float& rm,
                                                float& rl, const Src& src, const Dst& dst) {
  const MergeCoeffs cf = merge_coeffs(rm, m);
  rl = merge_val(rl, lf, cf);
#pragma unroll
  for (int j = 0; j < DT; ++j) {
    const float v0 = merge_val(src.get(j, 2 * h), o[j][2 * h], cf);
    const float v1 = merge_val(src.get(j, 2 * h + 1), o[j][2 * h + 1], cf);
    dst.set(j, 2 * h, v0);
    dst.set(j, 2 * h + 1, v1);
  }
  rm = cf.m;
}
/// The empty running output (+0), as a merge source.
struct ZeroAcc {
  __device__ float get(int, int) const { return 0.f; }
};

/// Deterministic mode: merges one 16-row block's chunk state (m, l, o; l is this thread's partial
/// row sum) into its running state (rm, rl and the running output read from `src`) with
/// merge_coeffs/merge_val, and writes the merged running output to `dst` (which may be the
/// chunk's own registers: the last chunk of a row block merges in place). Every kernel's chunk
/// merge is this code, so the bits are the same wherever it runs.
template <int DT, typename Src, typename Dst>
__device__ __forceinline__ void merge_chunk_state(const float (&m)[2], const float (&l)[2], const float (&o)[DT][4],
                                                  float (&rm)[2], float (&rl)[2], const Src& src, const Dst& dst) {
#pragma unroll
  for (int h = 0; h < 2; ++h) merge_chunk_row(h, m[h], quad_sum(l[h]), o, rm[h], rl[h], src, dst);
}

/// merge_chunk_state of a row block's first (or only) chunk into the empty running state
/// (rm = -inf, rl = 0, output +0), in place: the same bits with fewer operations. For a finite
/// chunk max m, merge_coeffs(-inf, m) gives fa = 2^-inf = +0 and fb = 2^0 = 1 exactly, so every
/// merged value 0 * fa + x * fb is +0 + x; any other m (an empty chunk, an overflowed score) takes
/// the general path (merge_chunk_row from the empty state).
template <int DT>
__device__ __forceinline__ void merge_first_chunk(const float (&m)[2], const float (&l)[2], float (&o)[DT][4],
                                                  float (&rm)[2], float (&rl)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float lf = quad_sum(l[h]);
    if (fabsf(m[h]) < INFINITY) {
      rl[h] = __fadd_rn(0.f, lf);
#pragma unroll
      for (int j = 0; j < DT; ++j) {
        o[j][2 * h] = __fadd_rn(0.f, o[j][2 * h]);
        o[j][2 * h + 1] = __fadd_rn(0.f, o[j][2 * h + 1]);
      }
      rm[h] = m[h];
    } else {
      rm[h] = kNegInf;
      rl[h] = 0.f;
      merge_chunk_row(h, m[h], lf, o, rm[h], rl[h], ZeroAcc{}, RegAcc<DT>{o});
    }
  }
}

/// merge_chunk_state (running output read from `src`, written to `dst`), then resets the chunk
/// state (m = -inf, l = 0, o = 0) for the next chunk.
template <int DT, typename Src, typename Dst>
__device__ __forceinline__ void flush_chunk_tile(float (&m)[2], float (&l)[2], float (&o)[DT][4], float (&rm)[2],
                                                 float (&rl)[2], const Src& src, const Dst& dst) {
  merge_chunk_state(m, l, o, rm, rl, src, dst);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m[h] = kNegInf;
    l[h] = 0.f;
#pragma unroll
    for (int j = 0; j < DT; ++j) {
      o[j][2 * h] = 0.f;
      o[j][2 * h + 1] = 0.f;
    }
  }
}
/// flush_chunk_tile with the running output `ro` read and written in place.
template <int DT, typename Acc>
__device__ __forceinline__ void flush_chunk_tile(float (&m)[2], float (&l)[2], float (&o)[DT][4], float (&rm)[2],
                                                 float (&rl)[2], const Acc& ro) {
  flush_chunk_tile(m, l, o, rm, rl, ro, ro);
}

}  // namespace orthros::cuda::detail
