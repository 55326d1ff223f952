// Device-side fill of benchmark inputs: seeded pseudo-random values in [-1, 1) (never zeros),
// written directly on the GPU so multi-GiB inputs cost milliseconds, not host copies.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "fill.hpp"

namespace {

__device__ __forceinline__ float hash_uniform(std::uint64_t i, std::uint64_t seed) {
  std::uint64_t z = i + seed * 0x9E3779B97F4A7C15ull;  // splitmix64
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;  // 24 random bits -> [-1, 1)
}

template <typename T>
__global__ void fill_kernel(T* p, std::uint64_t n, std::uint64_t seed) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::uint64_t(gridDim.x) * blockDim.x) {
    const float u = hash_uniform(i, seed);
    if constexpr (sizeof(T) == 4) p[i] = u;
    else p[i] = T(u);
  }
}

}  // namespace

namespace orthros::bench {

cudaError_t fill_uniform(void* p, std::uint64_t n, int elem_bytes, bool bf16, std::uint64_t seed,
                         cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  const unsigned blocks = static_cast<unsigned>(n / threads + 1 < 65536 ? n / threads + 1 : 65536);
  if (elem_bytes == 4) fill_kernel<float><<<blocks, threads, 0, stream>>>(static_cast<float*>(p), n, seed);
  else if (bf16) fill_kernel<__nv_bfloat16><<<blocks, threads, 0, stream>>>(static_cast<__nv_bfloat16*>(p), n, seed);
  else fill_kernel<__half><<<blocks, threads, 0, stream>>>(static_cast<__half*>(p), n, seed);
  return cudaGetLastError();
}

}  // namespace orthros::bench
