// The cooperative cp.async loads of the tensor-core kernels' shared-memory tiles: the GQA Q tile
// of a row block and the zero-filled K/V tile. Every kernel (mma.sync and wgmma forward, both
// backward kernels) loads through these; the caller gives its threads and its swizzle.
#pragma once

#include "common/device.cuh"
#include "common/mma_tiles.cuh"

#include <cstddef>

namespace orthros::cuda::detail {

/// Row -> (query token, head within the group) of the GQA rows, by plain integer division (the
/// forward kernels and the backward dq kernel).
struct GroupDiv {
  const int& group;  // the kernel parameter itself (read where used, as the kernels' own expressions)
  __device__ __forceinline__ int token(int r) const { return r / group; }
  __device__ __forceinline__ int head(int r, int) const { return r % group; }
};
/// The same by FastDiv's multiply-high and shift (the backward dk/dv kernel's per-block loads).
struct GroupFastDiv {
  FastDiv div;
  int group;
  __device__ __forceinline__ int token(int r) const { return div.div(r); }
  __device__ __forceinline__ int head(int r, int tok) const { return r - tok * group; }
};

/// The GQA Q tile of a row block: rows r0 .. r0 + ROWS - 1 of KV head kvh, 16-byte chunks. Row r
/// is query token i = gd.token(r), query head kvh * group + gd.head(r, i), at element offset
/// ((qoff + i) * H_q + head) * D of the stream. copy(dst, ok, off) issues one chunk: dst is
/// swz(row, ch) (the kernel's swizzled element offset), off() the source element offset (a
/// callable: a row past r1 needs none, and the division is not computed for it), ok false for
/// rows past r1 (the chunk is zero-filled, its source not read). Thread t of nthreads takes
/// chunks t, t + nthreads, ...
template <int ROWS, int D, typename GD, typename Swz, typename Copy>
__device__ __forceinline__ void load_q_tile(const KernelParams& p, const GD& gd, int qoff, int kvh, int r0, int r1,
                                            int t, int nthreads, const Swz& swz, const Copy& copy) {
  constexpr int CH = D / 8;
  for (int idx = t; idx < ROWS * CH; idx += nthreads) {
    const int row = idx / CH, ch = idx % CH, r = r0 + row;
    const bool ok = r <= r1;
    copy(swz(row, ch), ok, [&] {
      const int i = gd.token(r);
      return ((size_t)(qoff + i) * p.Hq + kvh * p.group + gd.head(r, i)) * D + ch * 8;
    });
  }
}

/// The K and V tile of keys n0 .. n0 + ROWS - 1 (cache rows of one sequence; kg/vg: its row 0 at
/// this KV head, kv_row elements per cache row) into dk/dv at swz(row, ch); keys n with
/// !in_range(n) (past the sequence's keys) are zero-filled: the cache slack may hold anything,
/// even NaN, and P = 0 times NaN would poison O. Thread t of nthreads takes chunks t,
/// t + nthreads, ...; I is the key index type.
template <int ROWS, int D, typename I, typename T, typename Swz, typename InRange>
__device__ __forceinline__ void load_kv_tile(T* dk, T* dv, const T* kg, const T* vg, I n0, const InRange& in_range,
                                             size_t kv_row, int t, int nthreads, const Swz& swz) {
  constexpr int CH = D / 8;
  for (int idx = t; idx < ROWS * CH; idx += nthreads) {
    const int row = idx / CH, ch = idx % CH;
    const I n = n0 + row;
    const bool ok = in_range(n);
    const size_t off = ok ? (size_t)n * kv_row + ch * 8 : 0;
    cp_async16(dk + swz(row, ch), kg + off, ok);
    cp_async16(dv + swz(row, ch), vg + off, ok);
  }
}

/// swz<D> (common/mma_tiles.cuh) as a callable.
template <int D>
struct Swizzle {
  __device__ __forceinline__ int operator()(int row, int ch) const { return swz<D>(row, ch); }
};

}  // namespace orthros::cuda::detail
