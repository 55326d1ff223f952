// Shared pieces of the GPU benchmark programs (bench_attention_gpu, bench_attention_backward_gpu,
// bench_context_parallel): a fatal CUDA check, a device buffer filled with seeded pseudo-random
// bf16 in [-1, 1) (timings never run on zeros), and the CUDA-event median.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

namespace orthros::bench {

/// Prints `what` and the CUDA error and exits with status 1 unless `e` is cudaSuccess.
inline void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

/// p[i] = a hash of (i, seed) mapped to [-1, 1), as bf16.
__global__ void fill_kernel(__nv_bfloat16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)(i * 2654435761u) ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] = __float2bfloat16(((h & 0xffff) / 32768.0f - 1.0f));
  }
}

/// Owning device allocation of `bytes` (at least 16), filled by fill_kernel with `seed`
/// (default: the size, so buffers of different sizes differ).
struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Dev(size_t n) : Dev(n, static_cast<unsigned>(n)) {}
  Dev(size_t n, unsigned seed) : bytes(n) {
    const size_t alloc = std::max<size_t>(n, 16);
    ck(cudaMalloc(&p, alloc), "cudaMalloc");
    fill_kernel<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), alloc / 2, seed);
    ck(cudaGetLastError(), "fill_kernel");
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};

/// Median over `runs` CUDA-event-timed calls of fn (default stream), after `warm` untimed ones.
/// Calls per timed sample (--b2b N): 1 times each call alone, host work included (what one
/// synchronous call costs); N > 1 enqueues N calls back to back between the events and divides,
/// so host work overlaps the GPU (throughput of a stream of calls).
inline int& calls_per_sample() {
  static int n = 1;
  return n;
}

inline double median_ms(const std::function<void()>& fn, int runs, int warm = 3) {
  for (int i = 0; i < warm; ++i) fn();
  ck(cudaDeviceSynchronize(), "warm-up sync");
  const int per = calls_per_sample();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    cudaEventRecord(a);
    for (int k = 0; k < per; ++k) fn();
    cudaEventRecord(b);
    ck(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms / per);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace orthros::bench
