// The split-KV merge kernel: the output stream's split states merged into o_out and lse_out.
#pragma once

#include "common/lse_merge.cuh"

#include <cstdint>

namespace orthros::cuda::detail {

// One block per (output row, query head), one thread per output dim d. Every thread runs the
// same sequential merge of the nsplit states in ascending split order (StateChain); the loads of
// a batch of kMergeBatch states are issued before the batch is merged, so the chain waits on
// memory once per batch instead of once per split.
constexpr int kMergeBatch = 16;

template <typename T>
__global__ void merge_kernel(const float* __restrict__ partial, T* __restrict__ o_out, float* __restrict__ lse_out,
                             long long rows, int nsplit, int D) {
  const long long row = blockIdx.x;
  const int d = threadIdx.x;
  if (row >= rows) return;
  const float* base = partial + (size_t)row * nsplit * (D + 2);
  StateChain chain;
  for (int sp0 = 0; sp0 < nsplit; sp0 += kMergeBatch) {
    float mb[kMergeBatch], lb[kMergeBatch], ab[kMergeBatch];
#pragma unroll
    for (int j = 0; j < kMergeBatch; ++j) {
      const bool ok = sp0 + j < nsplit;
      const float* st = base + (size_t)(ok ? sp0 + j : 0) * (D + 2);
      mb[j] = ok ? __ldg(st) : kNegInf;
      lb[j] = ok ? __ldg(st + 1) : 0.f;
      ab[j] = ok ? __ldg(st + 2 + d) : 0.f;
    }
#pragma unroll
    for (int j = 0; j < kMergeBatch; ++j) {
      if (sp0 + j >= nsplit) break;
      chain.add(mb[j], lb[j], ab[j]);
    }
  }
  o_out[(size_t)row * D + d] = chain.output<T>();
  if (d == 0 && lse_out) lse_out[row] = chain.lse();
}

}  // namespace orthros::cuda::detail
