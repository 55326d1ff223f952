// The cooperative cp.async loads of the tensor-core kernels' shared-memory tiles: the GQA Q tile
// of a row block and the zero-filled K/V tile. Every kernel (mma.sync and wgmma forward, both
// backward kernels) loads through these; the caller gives its threads and its swizzle.
#pragma once

#include "common/device.cuh"
#include "common/mma_tiles.cuh"

#include <cstddef>

namespace orthros::cuda::detail {

/// Division of a row index by the GQA group as the plain integer division (the forward kernels);
/// FastDiv (common/device.cuh) divides the same way by multiply-high and shift.
struct PlainDiv {
  int d;
  __device__ __forceinline__ int div(int n) const { return n / d; }
};

/// The GQA Q tile of a row block: rows r0 .. r0 + ROWS - 1 of KV head kvh, 16-byte chunks. Row r
/// is query token i = r / group (div), query head kvh * group + (r - i * group), at element
/// offset ((qoff + i) * H_q + head) * D of the stream. copy(dst, off, ok) issues one chunk: dst is
/// swz(row, ch) (the kernel's swizzled element offset), off the source element offset, ok false
/// for rows past r1 (off = 0 then: the chunk is zero-filled, its source never read). Thread t of
/// nthreads takes chunks t, t + nthreads, ...
template <int ROWS, int D, typename Div, typename Swz, typename Copy>
__device__ __forceinline__ void load_q_tile(const KernelParams& p, const Div& div, int qoff, int kvh, int r0, int r1,
                                            int t, int nthreads, const Swz& swz, const Copy& copy) {
  constexpr int CH = D / 8;
  for (int idx = t; idx < ROWS * CH; idx += nthreads) {
    const int row = idx / CH, ch = idx % CH, r = r0 + row;
    const bool ok = r <= r1;
    const int i = div.div(r);
    const size_t off = ok ? ((size_t)(qoff + i) * p.Hq + kvh * p.group + (r - i * p.group)) * D + ch * 8 : 0;
    copy(swz(row, ch), off, ok);
  }
}

/// The K and V tile of keys n0 .. n0 + ROWS - 1 (cache rows of one sequence, kg/vg: its row 0 at
/// this KV head, kv_row elements per cache row) into dk/dv at swz(row, ch); keys at or past n_end
/// are zero-filled (the cache slack past cache_len may hold anything, even NaN, and P = 0 times
/// NaN would poison O). Thread t of nthreads takes chunks t, t + nthreads, ...
template <int ROWS, int D, typename T, typename Swz>
__device__ __forceinline__ void load_kv_tile(T* dk, T* dv, const T* kg, const T* vg, long long n0, long long n_end,
                                             size_t kv_row, int t, int nthreads, const Swz& swz) {
  constexpr int CH = D / 8;
  for (int idx = t; idx < ROWS * CH; idx += nthreads) {
    const int row = idx / CH, ch = idx % CH;
    const long long n = n0 + row;
    const bool ok = n < n_end;
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
