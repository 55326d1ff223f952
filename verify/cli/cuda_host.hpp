/// \file cuda_host.hpp
/// \brief Host-side helpers of the `orthros verify --device cuda` commands (CUDA builds only):
/// checked CUDA calls and a NaN-poisoned device buffer with typed uploads and downloads.
#pragma once

#include "orthros/cuda/attention.hpp"
#include "orthros/tensor.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

namespace orthros::cli {

/// Throws orthros::cuda::CudaError naming `what` when `e` is not cudaSuccess.
inline void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw orthros::cuda::CudaError(std::string(what) + " failed: " + cudaGetErrorString(e));
}

/// Owning device allocation of at least 16 bytes, filled with 0xFF (NaN in f32/f16/bf16) so
/// anything a kernel leaves unwritten shows up.
struct Dev {
  void* p = nullptr;
  explicit Dev(size_t n) {
    ck(cudaMalloc(&p, std::max<size_t>(n, 16)), "cudaMalloc");
    ck(cudaMemset(p, 0xFF, std::max<size_t>(n, 16)), "cudaMemset(poison)");
  }
  /// A device copy of a row-major host matrix or a vector (any contiguous Eigen object).
  template <typename M>
  static Dev of(const M& m) {
    const size_t bytes = size_t(m.size()) * sizeof(typename M::Scalar);
    Dev d(bytes);
    if (m.size()) ck(cudaMemcpy(d.p, m.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    return d;
  }
  ~Dev() {
    if (p) cudaFree(p);
  }
  Dev(Dev&& o) noexcept : p(o.p) { o.p = nullptr; }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <typename T>
  T* at(size_t elem_off) const {
    return static_cast<T*>(p) + elem_off;
  }
  /// Copies the first m.size() elements into m (a matrix or vector, its size already set).
  template <typename M>
  void download(M& m) const {
    if (m.size())
      ck(cudaMemcpy(m.data(), p, size_t(m.size()) * sizeof(typename M::Scalar), cudaMemcpyDeviceToHost),
         "cudaMemcpy D2H");
  }
};

}  // namespace orthros::cli
