// Seeded device-side fill of benchmark inputs (device_buffer.hpp fill_uniform): values in [-1, 1)
// written on the GPU, so multi-GiB inputs cost milliseconds instead of host copies.
#include "device_buffer.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

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

namespace orthros::gpu_harness {

void fill_uniform(void* p, std::uint64_t n, cuda::DType dtype, std::uint64_t seed, cudaStream_t stream) {
  if (n == 0) return;
  const int threads = 256;
  const unsigned blocks = static_cast<unsigned>(n / threads + 1 < 65536 ? n / threads + 1 : 65536);
  switch (dtype) {
    case cuda::DType::f32: fill_kernel<float><<<blocks, threads, 0, stream>>>(static_cast<float*>(p), n, seed); break;
    case cuda::DType::bf16:
      fill_kernel<__nv_bfloat16><<<blocks, threads, 0, stream>>>(static_cast<__nv_bfloat16*>(p), n, seed);
      break;
    case cuda::DType::f16: fill_kernel<__half><<<blocks, threads, 0, stream>>>(static_cast<__half*>(p), n, seed); break;
  }
  check_cuda(cudaGetLastError(), "fill_uniform launch");
}

}  // namespace orthros::gpu_harness
