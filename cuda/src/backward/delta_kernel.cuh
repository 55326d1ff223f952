// The backward's pre-pass: delta = rowsum(dO * O) and the LSE in the kernels' units.
#pragma once

#include "backward/params.cuh"

#include <cstdint>
#include <type_traits>

namespace orthros::cuda::detail {

// ---- pre-pass -------------------------------------------------------------------------------
// One warp per (row, head) of both streams; lane sums d = lane, lane+32, ... then a fixed
// butterfly, so Δ is the same bits whichever launch computes it.
template <typename T>
__global__ void __launch_bounds__(256) delta_kernel(const T* __restrict__ o, const T* __restrict__ o_out,
                                                    const T* __restrict__ dO, const T* __restrict__ dO_out,
                                                    const float* __restrict__ lse, const float* __restrict__ lse_out,
                                                    float* __restrict__ delta, float* __restrict__ lse2,
                                                    long long total_q, long long total_rows, int Hq, int D) {
  const long long idx = blockIdx.x * 8LL + (threadIdx.x >> 5);  // (row, head) flat
  const int lane = threadIdx.x & 31;
  if (idx >= total_rows * Hq) return;
  const long long row = idx / Hq;
  const bool out = row >= total_q;
  const long long local = out ? idx - total_q * Hq : idx;  // (row, head) in its stream
  const T* a = (out ? o_out : o) + local * D;
  const T* b = (out ? dO_out : dO) + local * D;
  float s = 0.f;
  for (int d = lane; d < D; d += 32) s = __fadd_rn(s, __fmul_rn(Elem<T>::to_f(a[d]), Elem<T>::to_f(b[d])));
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, off));
  if (lane == 0) {
    delta[idx] = s;
    const float l = (out ? lse_out : lse)[local];
    lse2[idx] = std::is_same_v<T, float> ? l : __fmul_rn(l, kLog2e);  // see bwd_prob
  }
}


}  // namespace orthros::cuda::detail
