/// \file timing.hpp
/// \brief Timing of the GPU benchmarks: CUDA-event medians with the L2 cache flushed before
/// every timed sample.
///
/// Peers' harnesses (triton.testing.do_bench, which FlashAttention's benchmarks use, and nvbench)
/// clear the L2 between repetitions by writing a buffer larger than it, so that each timed call
/// reads its inputs from HBM as it would in a model where other layers ran in between. L2Flush
/// does the same with a memset of max(256 MiB, 4 x L2) bytes (H200: L2 50 MiB, so 256 MiB),
/// issued and finished before the sample's first event, so the memset itself is never timed.
#pragma once

#include "device_buffer.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <string>

namespace orthros::gpu_harness {

/// A device buffer larger than the L2 cache; flush() overwrites it, evicting what the previous
/// call left in L2.
class L2Flush {
 public:
  /// Sizes the buffer from the current device's L2 (cudaDevAttrL2CacheSize); throws CudaError.
  L2Flush();
  /// Enqueues the memset of the whole buffer on `stream` (asynchronous).
  void flush(cudaStream_t stream = nullptr);
  std::size_t bytes() const { return buf_.bytes(); }
  std::size_t l2_bytes() const { return l2_bytes_; }
  /// One line for a benchmark's header: "L2 (50 MiB) flushed before every timed sample by a
  /// memset of 256 MiB".
  std::string describe() const;

 private:
  static std::size_t flush_bytes(std::size_t l2);
  std::size_t l2_bytes_ = 0;
  DeviceBuffer buf_;
};

/// How median_ms() samples a call.
struct Timing {
  int runs = 25;              ///< timed samples (the median of these is reported)
  int warmup = 3;             ///< untimed calls before the first sample
  int calls_per_sample = 1;   ///< 1: each call alone, host work included; N: N calls back to back, time / N
  L2Flush* flush = nullptr;   ///< when set, the L2 is flushed before every sample
};

/// Median over t.runs samples of the CUDA-event time of t.calls_per_sample calls of `call` on
/// the default stream, in milliseconds per call. Before each sample: the L2 flush (when
/// t.flush) and a device synchronization, so the first call's host work is inside the timed
/// interval as in a synchronous use. After each sample: `after_sample` (the callers' canary
/// checks), outside the timed interval. Throws CudaError when a CUDA call fails and
/// std::invalid_argument when runs or calls_per_sample < 1.
double median_ms(const std::function<void()>& call, const Timing& t, const std::function<void()>& after_sample = {});

}  // namespace orthros::gpu_harness
