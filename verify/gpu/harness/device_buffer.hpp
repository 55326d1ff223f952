/// \file device_buffer.hpp
/// \brief The GPU harness's device buffer: a named, owning cudaMalloc allocation with canary
/// guards before and after the payload (canary.hpp) and NaN poisoning; checked CUDA calls; the
/// seeded device-side fill of benchmark inputs. Used by the GPU tests, the benchmarks and
/// `orthros verify --device cuda`.
#pragma once

#include "canary.hpp"

#include "orthros/cuda/attention.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace orthros::gpu_harness {

/// Throws orthros::cuda::CudaError "<what> failed: <CUDA error string>" unless e is cudaSuccess.
void check_cuda(cudaError_t e, const std::string& what);

/// Element size of a dtype in bytes (4 f32, 2 f16/bf16).
int element_bytes(cuda::DType dtype);

/// Fills `n` elements of `dtype` at device pointer `p` with seeded pseudo-random values in
/// [-1, 1) (splitmix64 of the element index and the seed; 24 random bits each, so never all
/// zeros). Asynchronous on `stream`; throws CudaError when the launch fails.
void fill_uniform(void* p, std::uint64_t n, cuda::DType dtype, std::uint64_t seed, cudaStream_t stream = nullptr);

/// Byte written by poison(): 0xFF in every byte is a NaN in f32, f16 and bf16, so an output
/// element a kernel leaves unwritten reads back as NaN.
constexpr unsigned char kPoisonByte = 0xFF;

/// Owning device allocation of `bytes()` bytes (0 allowed: data() is still a valid, distinct
/// pointer) named for error messages. Layout: [kGuardBytes front guard | payload | kGuardBytes
/// back guard]; both guards hold the canary pattern from construction on, and the payload is
/// poisoned with NaN on construction. Movable, not copyable. Every CUDA call is checked
/// (CudaError naming the buffer); the destructor frees without throwing.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  /// Allocates and guards `bytes` bytes named `name`; throws CudaError when cudaMalloc fails.
  DeviceBuffer(std::string name, std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  /// A device copy of a contiguous host object `m` (Eigen matrix or vector, row-major as the
  /// oracle stores them): m.size() elements of M::Scalar.
  template <typename M>
  static DeviceBuffer of(std::string name, const M& m) {
    DeviceBuffer d(std::move(name), static_cast<std::size_t>(m.size()) * sizeof(typename M::Scalar));
    if (m.size()) d.upload(m.data(), d.bytes());
    return d;
  }

  void* data() const { return payload_; }  ///< first payload byte (nullptr when default-constructed)
  template <typename T>
  T* as(std::size_t elem_offset = 0) const {  ///< the payload as T*, `elem_offset` elements in
    return static_cast<T*>(payload_) + elem_offset;
  }
  std::size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }

  /// Sets every payload byte to kPoisonByte (NaN in f32/f16/bf16); asynchronous on `stream`.
  void poison(cudaStream_t stream = nullptr);
  /// Fills the payload with fill_uniform() values of `dtype` (bytes() / element size elements).
  void fill_uniform(cuda::DType dtype, std::uint64_t seed, cudaStream_t stream = nullptr);
  /// Copies n bytes from host `src` to payload byte `offset`. Throws std::out_of_range when
  /// [offset, offset + n) is not inside the payload (message names the buffer).
  void upload(const void* src, std::size_t n, std::size_t offset = 0);
  /// Copies n bytes from device pointer `src` to payload byte `offset` (device to device);
  /// range checked like upload().
  void copy_from_device(const void* src, std::size_t n, std::size_t offset = 0);
  /// Copies n bytes from payload byte `offset` to host `dst`; range checked like upload().
  void download(void* dst, std::size_t n, std::size_t offset = 0) const;
  /// Downloads the first m.size() elements at element `elem_offset` into the host object m
  /// (its size already set).
  template <typename M>
  void download_into(M& m, std::size_t elem_offset = 0) const {
    const std::size_t es = sizeof(typename M::Scalar);
    if (m.size()) download(m.data(), static_cast<std::size_t>(m.size()) * es, elem_offset * es);
  }

  /// Downloads both guards and compares them byte for byte with the canary pattern. Throws
  /// std::runtime_error "canary of device buffer '<name>' overwritten: ..." naming the side,
  /// the first changed byte and how many changed. Synchronizes the device first.
  void check_canaries() const;

 private:
  void check_range(std::size_t n, std::size_t offset, const char* what) const;
  std::string name_;
  void* base_ = nullptr;     // cudaMalloc result: front guard
  void* payload_ = nullptr;  // base_ + kGuardBytes
  std::size_t bytes_ = 0;
};

/// check_canaries() of every buffer in the list (null entries skipped).
void check_canaries(std::initializer_list<const DeviceBuffer*> buffers);

}  // namespace orthros::gpu_harness
