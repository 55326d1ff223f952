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
/// record/wait pairs, so the pattern can be captured into a CUDA graph.
///
/// The side stream has the device's greatest priority, a hint to the block scheduler to start its
/// kernel's CTAs before those of kernels of lower priority (the caller's stream at the default
/// priority), which then fill the SMs the side kernel's last wave leaves. A captured graph keeps
/// the priorities only when instantiated with cudaGraphInstantiateFlagUseNodePriority; without it
/// both kernels run at the launch stream's priority (the same bits, the dealing of two equal
/// grids). The side kernel also outranks other default-priority work of the process while it runs
/// (e.g. NCCL streams).
///
/// One non-blocking stream and two events per host thread and device, created on first use and
/// kept for the thread's life (so the side kernels of one thread's calls on different streams
/// queue behind each other; cudaDeviceReset invalidates them). Everything runs on `main` instead
/// when the fork could break a capture: a first use while `main` is being captured (the resources
/// are created outside captures only), or a side stream still in another capture (it stays in a
/// capture it joined until that capture ends).
/// \throws CudaError from the CUDA calls.
class SideStream {
 public:
  explicit SideStream(cudaStream_t main) : main_(main), side_(main) {
    Resources* rp = resources(main);
    if (!rp || !same_capture(rp->stream, main)) return;  // run on `main`
    side_ = rp->stream;
    joined_ = rp->joined;
    check(cudaEventRecord(rp->forked, main_), "cudaEventRecord(fork)");
    check(cudaStreamWaitEvent(side_, rp->forked, 0), "cudaStreamWaitEvent(fork)");
    pending_ = true;
  }
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  ~SideStream() {
    if (pending_) {
      cudaEventRecord(joined_, side_);
      cudaStreamWaitEvent(main_, joined_, 0);
      cudaGetLastError();  // an ignored failure must not surface in the next call's launch check
    }
  }
  cudaStream_t get() const { return side_; }
  void join() {
    if (!pending_) return;
    check(cudaEventRecord(joined_, side_), "cudaEventRecord(join)");
    check(cudaStreamWaitEvent(main_, joined_, 0), "cudaStreamWaitEvent(join)");
    pending_ = false;
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
      cudaGetLastError();
    }
  };

  /// Whether `side` may fork from `main`: both outside any capture, or both in the same one.
  static bool same_capture(cudaStream_t side, cudaStream_t main) {
    cudaStreamCaptureStatus side_status = cudaStreamCaptureStatusNone, main_status = cudaStreamCaptureStatusNone;
    unsigned long long side_id = 0, main_id = 0;
    check(cudaStreamGetCaptureInfo(side, &side_status, &side_id), "cudaStreamGetCaptureInfo");
    if (side_status == cudaStreamCaptureStatusNone) return true;  // a fork makes it join main's capture, if any
    check(cudaStreamGetCaptureInfo(main, &main_status, &main_id), "cudaStreamGetCaptureInfo");
    return main_status == cudaStreamCaptureStatusActive && side_status == cudaStreamCaptureStatusActive &&
           side_id == main_id;
  }

  /// This thread's resources on the current device, created on first use; null when they do not
  /// exist yet and `main` is being captured. They are created in the relaxed capture mode, so a
  /// capture that another thread runs in the global mode is not invalidated by it.
  static Resources* resources(cudaStream_t main) {
    thread_local Cache cache;
    int dev = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    auto it = cache.by_device.find(dev);
    if (it != cache.by_device.end()) return &it->second;
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(main, &capturing), "cudaStreamIsCapturing");
    if (capturing != cudaStreamCaptureStatusNone) return nullptr;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    check(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode");
    Resources r;
    int least = 0, greatest = 0;
    cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (e == cudaSuccess) e = cudaStreamCreateWithPriority(&r.stream, cudaStreamNonBlocking, greatest);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&r.forked, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&r.joined, cudaEventDisableTiming);
    cudaThreadExchangeStreamCaptureMode(&mode);  // the caller's mode back
    if (e != cudaSuccess) {
      if (r.forked) cudaEventDestroy(r.forked);
      if (r.stream) cudaStreamDestroy(r.stream);
      check(e, "creating the side stream and its events");
    }
    return &cache.by_device.emplace(dev, r).first->second;
  }

  cudaStream_t main_, side_;
  cudaEvent_t joined_ = nullptr;
  bool pending_ = false;  // forked and not joined yet
};

}  // namespace orthros::cuda::detail
