// DeviceBuffer: guarded, NaN-poisoned device allocations (device_buffer.hpp).
#include "device_buffer.hpp"

#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

namespace orthros::gpu_harness {

void check_cuda(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw cuda::CudaError(what + " failed: " + cudaGetErrorString(e));
}

int element_bytes(cuda::DType dtype) { return dtype == cuda::DType::f32 ? 4 : 2; }

DeviceBuffer::DeviceBuffer(std::string name, std::size_t bytes) : name_(std::move(name)), bytes_(bytes) {
  check_cuda(cudaMalloc(&base_, bytes + 2 * kGuardBytes), "cudaMalloc of device buffer '" + name_ + "' (" +
                                                              std::to_string(bytes) + " bytes)");
  payload_ = static_cast<char*>(base_) + kGuardBytes;
  std::uint8_t front[kGuardBytes], back[kGuardBytes];
  fill_canary(front, GuardSide::front);
  fill_canary(back, GuardSide::back);
  try {
    check_cuda(cudaMemcpy(base_, front, kGuardBytes, cudaMemcpyHostToDevice), "front canary of '" + name_ + "'");
    check_cuda(cudaMemcpy(static_cast<char*>(payload_) + bytes_, back, kGuardBytes, cudaMemcpyHostToDevice),
               "back canary of '" + name_ + "'");
    poison();
    check_cuda(cudaDeviceSynchronize(), "poison of '" + name_ + "'");
  } catch (...) {
    cudaFree(base_);
    throw;
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (base_) cudaFree(base_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : name_(std::move(o.name_)), base_(std::exchange(o.base_, nullptr)), payload_(std::exchange(o.payload_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (base_) cudaFree(base_);
    name_ = std::move(o.name_);
    base_ = std::exchange(o.base_, nullptr);
    payload_ = std::exchange(o.payload_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::poison(cudaStream_t stream) {
  if (bytes_) check_cuda(cudaMemsetAsync(payload_, kPoisonByte, bytes_, stream), "NaN poison of '" + name_ + "'");
}

void DeviceBuffer::fill_uniform(cuda::DType dtype, std::uint64_t seed, cudaStream_t stream) {
  gpu_harness::fill_uniform(payload_, bytes_ / element_bytes(dtype), dtype, seed, stream);
}

void DeviceBuffer::check_range(std::size_t n, std::size_t offset, const char* what) const {
  if (offset > bytes_ || n > bytes_ - offset)
    throw std::out_of_range(std::string(what) + " of device buffer '" + name_ + "': bytes [" + std::to_string(offset) +
                            ", " + std::to_string(offset + n) + ") outside its " + std::to_string(bytes_) + " bytes");
}

void DeviceBuffer::upload(const void* src, std::size_t n, std::size_t offset) {
  check_range(n, offset, "upload");
  if (n)
    check_cuda(cudaMemcpy(static_cast<char*>(payload_) + offset, src, n, cudaMemcpyHostToDevice),
               "cudaMemcpy to '" + name_ + "'");
}

void DeviceBuffer::copy_from_device(const void* src, std::size_t n, std::size_t offset) {
  check_range(n, offset, "device copy");
  if (n)
    check_cuda(cudaMemcpy(static_cast<char*>(payload_) + offset, src, n, cudaMemcpyDeviceToDevice),
               "cudaMemcpy (device to device) to '" + name_ + "'");
}

void DeviceBuffer::download(void* dst, std::size_t n, std::size_t offset) const {
  check_range(n, offset, "download");
  if (n)
    check_cuda(cudaMemcpy(dst, static_cast<const char*>(payload_) + offset, n, cudaMemcpyDeviceToHost),
               "cudaMemcpy from '" + name_ + "'");
}

void DeviceBuffer::check_canaries() const {
  if (!base_) return;
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize before the canary check of '" + name_ + "'");
  std::uint8_t front[kGuardBytes], back[kGuardBytes];
  check_cuda(cudaMemcpy(front, base_, kGuardBytes, cudaMemcpyDeviceToHost), "front canary of '" + name_ + "'");
  check_cuda(cudaMemcpy(back, static_cast<const char*>(payload_) + bytes_, kGuardBytes, cudaMemcpyDeviceToHost),
             "back canary of '" + name_ + "'");
  for (GuardSide side : {GuardSide::front, GuardSide::back}) {
    const std::uint8_t* g = side == GuardSide::front ? front : back;
    const long first = first_overwritten(g, side);
    if (first < 0) continue;
    const bool is_front = side == GuardSide::front;
    throw std::runtime_error(
        "canary of device buffer '" + name_ + "' (" + std::to_string(bytes_) + " bytes) overwritten: " +
        std::to_string(overwritten_count(g, side)) + " of the " + std::to_string(kGuardBytes) + " guard bytes " +
        (is_front ? "before" : "after") + " the payload changed, the first at payload offset " +
        (is_front ? "-" + std::to_string(kGuardBytes - static_cast<std::size_t>(first))
                  : std::to_string(bytes_ + static_cast<std::size_t>(first))) +
        " (a kernel wrote out of bounds)");
  }
}

void check_canaries(std::initializer_list<const DeviceBuffer*> buffers) {
  for (const DeviceBuffer* b : buffers)
    if (b) b->check_canaries();
}

}  // namespace orthros::gpu_harness
