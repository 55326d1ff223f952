/// \file fill.hpp
/// \brief Device-side seeded fill for the GPU complexity benchmarks (bench/gpu_complexity).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace orthros::bench {

/// Fills `n` elements at device pointer `p` with seeded pseudo-random values in [-1, 1)
/// (splitmix64 of the index; never all zeros). `elem_bytes` 4 = float32; 2 = bf16 when `bf16`,
/// else fp16. Asynchronous on `stream`; returns the launch status.
cudaError_t fill_uniform(void* p, std::uint64_t n, int elem_bytes, bool bf16, std::uint64_t seed,
                         cudaStream_t stream);

}  // namespace orthros::bench
