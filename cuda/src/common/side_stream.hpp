// A second stream beside the caller's, for the kernels of one call that may run at the same time
// (the backward's dq and dk/dv kernels: backward/attention_backward.cu). Host code.
#pragma once

#include "common/device.cuh"

#include <map>

namespace orthros::cuda::detail {

/// Runs part of a call on a second stream of the current device, beside the caller's stream
/// `main`. The constructor makes the side stream wait for everything queued on `main` so far (the
/// fork); join() makes `main` wait for everything queued on the side stream since (the join), and
/// the destructor joins when an exception skipped join() (errors ignored there). Both are event
/// record/wait pairs, so the pattern can be captured into a CUDA graph. The side stream has the
/// device's greatest priority: while its kernel still has CTAs to start, the block scheduler
/// starts them before those of kernels on `main` (of default priority), which then fill the SMs
/// the side kernel's last wave leaves. One non-blocking stream and two events per host thread and
/// device, created on first use (outside a capture: a first use on a capturing stream runs
/// everything on `main`) and kept for the thread's life.
/// \throws CudaError from the CUDA calls.
class SideStream {
 public:
  explicit SideStream(cudaStream_t main) : main_(main), side_(main) {
    Resources* rp = resources(main);
    if (!rp) return;  // `main` is being captured and this thread has no side stream yet: run on `main`
    Resources& r = *rp;
    side_ = r.stream;
    joined_ = r.joined;
    check(cudaEventRecord(r.forked, main_), "cudaEventRecord(fork)");
    check(cudaStreamWaitEvent(side_, r.forked, 0), "cudaStreamWaitEvent(fork)");
    pending_ = true;
  }
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  ~SideStream() {
    if (pending_) {
      cudaEventRecord(joined_, side_);
      cudaStreamWaitEvent(main_, joined_, 0);
    }
  }
  cudaStream_t get() const { return side_; }
  void join() {
    if (!pending_) return;
    pending_ = false;
    check(cudaEventRecord(joined_, side_), "cudaEventRecord(join)");
    check(cudaStreamWaitEvent(main_, joined_, 0), "cudaStreamWaitEvent(join)");
  }

 private:
  struct Resources {
    cudaStream_t stream = nullptr;
    cudaEvent_t forked = nullptr, joined = nullptr;
  };
  struct Cache {
    std::map<int, Resources> by_device;
    ~Cache() {
      for (auto& [dev, r] : by_device) {
        cudaEventDestroy(r.forked);
        cudaEventDestroy(r.joined);
        cudaStreamDestroy(r.stream);
      }
    }
  };
  /// This thread's resources on the current device, created on first use; null when they do not
  /// exist yet and `main` is being captured (creating a stream there may invalidate the capture).
  static Resources* resources(cudaStream_t main) {
    thread_local Cache cache;
    int dev = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    auto it = cache.by_device.find(dev);
    if (it != cache.by_device.end()) return &it->second;
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(main, &capturing), "cudaStreamIsCapturing");
    if (capturing != cudaStreamCaptureStatusNone) return nullptr;
    Resources r;
    int least = 0, greatest = 0;
    check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
    check(cudaStreamCreateWithPriority(&r.stream, cudaStreamNonBlocking, greatest), "cudaStreamCreateWithPriority");
    const cudaError_t e1 = cudaEventCreateWithFlags(&r.forked, cudaEventDisableTiming);
    const cudaError_t e2 = e1 == cudaSuccess ? cudaEventCreateWithFlags(&r.joined, cudaEventDisableTiming) : e1;
    if (e2 != cudaSuccess) {
      if (r.forked) cudaEventDestroy(r.forked);
      cudaStreamDestroy(r.stream);
      check(e2, "cudaEventCreateWithFlags");
    }
    return &cache.by_device.emplace(dev, r).first->second;
  }

  cudaStream_t main_, side_;
  cudaEvent_t joined_ = nullptr;
  bool pending_ = false;  // forked and not joined yet
};

}  // namespace orthros::cuda::detail
