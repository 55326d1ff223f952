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
  /// A device copy of a row-major host matrix.
  template <typename S>
  static Dev of(const Mat<S>& m) {
    Dev d(size_t(m.size()) * sizeof(S));
    if (m.size()) ck(cudaMemcpy(d.p, m.data(), size_t(m.size()) * sizeof(S), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
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
  /// Copies the first m.size() elements into m (rows x cols already set).
  template <typename S>
  void download(Mat<S>& m) const {
    if (m.size()) ck(cudaMemcpy(m.data(), p, size_t(m.size()) * sizeof(S), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  }
};

}  // namespace orthros::cli
