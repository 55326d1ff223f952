// The backward's post-pass of the Hopper fast mode: dq = s * (the float32 sums the KV-block-outer
// kernel accumulated), rounded once to the dtype (as the query-outer dq kernel rounds s * acc).
#pragma once

#include "backward/params.cuh"
#include "common/mma_tiles.cuh"

namespace orthros::cuda::detail {

/// acc: [total_q + total_out][H_q][D] float32 (base rows first); writes n_base = total_q * H_q * D
/// elements of dq and the remaining n_all - n_base of dq_out. Four elements per thread (D is a
/// multiple of 4, so no group of four straddles the two tensors), grid-stride.
template <typename T>
__global__ void __launch_bounds__(256) dq_convert_kernel(const float4* __restrict__ acc, T* __restrict__ dq,
                                                         T* __restrict__ dq_out, long long n_base, long long n_all,
                                                         float scale) {
  for (long long i = (blockIdx.x * 256LL + threadIdx.x) * 4; i < n_all; i += gridDim.x * 256LL * 4) {
    const float4 v = acc[i / 4];
    T* dst = i < n_base ? dq + i : dq_out + (i - n_base);
    uint2 w;
    w.x = Mma<T>::pack(__fmul_rn(v.x, scale), __fmul_rn(v.y, scale));
    w.y = Mma<T>::pack(__fmul_rn(v.z, scale), __fmul_rn(v.w, scale));
    *reinterpret_cast<uint2*>(dst) = w;
  }
}

}  // namespace orthros::cuda::detail
