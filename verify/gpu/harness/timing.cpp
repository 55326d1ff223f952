// CUDA-event medians with L2 flushes (timing.hpp).
#include "timing.hpp"

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace orthros::gpu_harness {

std::size_t L2Flush::flush_bytes(std::size_t l2) { return std::max<std::size_t>(std::size_t(256) << 20, 4 * l2); }

L2Flush::L2Flush() {
  int dev = 0, l2 = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev), "cudaDeviceGetAttribute(L2 size)");
  l2_bytes_ = static_cast<std::size_t>(std::max(l2, 0));
  buf_ = DeviceBuffer("L2 flush", flush_bytes(l2_bytes_));
}

void L2Flush::flush(cudaStream_t stream) {
  check_cuda(cudaMemsetAsync(buf_.data(), 0, buf_.bytes(), stream), "cudaMemsetAsync (L2 flush)");
}

std::string L2Flush::describe() const {
  return "L2 (" + std::to_string(l2_bytes_ >> 20) + " MiB) flushed before every timed sample by a memset of " +
         std::to_string(buf_.bytes() >> 20) + " MiB";
}

namespace {
struct Events {
  cudaEvent_t a = nullptr, b = nullptr;
  Events() {
    check_cuda(cudaEventCreate(&a), "cudaEventCreate");
    check_cuda(cudaEventCreate(&b), "cudaEventCreate");
  }
  ~Events() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
};
}  // namespace

double median_ms(const std::function<void()>& call, const Timing& t, const std::function<void()>& after_sample) {
  if (t.runs < 1 || t.calls_per_sample < 1)
    throw std::invalid_argument("median_ms: runs and calls_per_sample must be >= 1 (got " + std::to_string(t.runs) +
                                ", " + std::to_string(t.calls_per_sample) + ")");
  for (int i = 0; i < t.warmup; ++i) call();
  check_cuda(cudaDeviceSynchronize(), "warm-up");
  if (after_sample) after_sample();
  Events ev;
  std::vector<double> ms_per_call;
  for (int i = 0; i < t.runs; ++i) {
    if (t.flush) t.flush->flush();
    check_cuda(cudaDeviceSynchronize(), "synchronize before a timed sample");
    check_cuda(cudaEventRecord(ev.a), "cudaEventRecord");
    for (int k = 0; k < t.calls_per_sample; ++k) call();
    check_cuda(cudaEventRecord(ev.b), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(ev.b), "cudaEventSynchronize");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, ev.a, ev.b), "cudaEventElapsedTime");
    ms_per_call.push_back(static_cast<double>(ms) / t.calls_per_sample);
    if (after_sample) after_sample();
  }
  std::sort(ms_per_call.begin(), ms_per_call.end());
  return ms_per_call[ms_per_call.size() / 2];
}

}  // namespace orthros::gpu_harness
