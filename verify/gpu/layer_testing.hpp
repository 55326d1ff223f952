/// \file layer_testing.hpp
/// \brief Helpers of the GPU layer suites (test_layer_gpu, test_layer_backward_gpu): random
/// layer weights, float64 copies, device uploads, a cuBLAS handle, SPEC §6 verdicts.
#pragma once

#include "gpu_testing.hpp"
#include "orthros/check.hpp"
#include "orthros/layer.hpp"
#include "orthros_testing.hpp"

#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

namespace orthros::gputest {

using orthros::testing::nonzero_uniform;
using orthros::testing::random_mat;
using orthros::testing::Rng;

// Vector of `n` values 1 + 0.5*u (u in ±[0.05, 1]): scales never zero, never all one.
template <typename S>
Vec<S> scale_vec(Eigen::Index n, Rng& rng) {
  Vec<S> v(n);
  for (Eigen::Index i = 0; i < n; ++i) v[i] = static_cast<S>(1.0 + 0.5 * nonzero_uniform(rng));
  return v;
}
template <typename S>
Vec<S> offset_vec(Eigen::Index n, Rng& rng) {
  Vec<S> v(n);
  for (Eigen::Index i = 0; i < n; ++i) v[i] = static_cast<S>(nonzero_uniform(rng, 0.3));
  return v;
}

/// Random layer weights: projections ~ 2/sqrt(fan_in), scales 1 ± [0.025, 0.5], offsets ±[0.015,
/// 0.3], QK-norm gains like the scales (never zero, never the identity).
template <typename S>
AttentionWeights<S> random_layer_weights(int Hq, int Hkv, int D, std::int64_t d_model, Rng& rng) {
  const Eigen::Index d = Eigen::Index(Hq) * D, dkv = Eigen::Index(Hkv) * D;
  AttentionWeights<S> w;
  // Amplitude ~2/sqrt(fan_in): projections of O(1) inputs stay O(1).
  w.w_q = random_mat<S>(d_model, d, rng, 2.0 / std::sqrt(double(d_model)));
  w.w_k = random_mat<S>(d_model, dkv, rng, 2.0 / std::sqrt(double(d_model)));
  w.w_v = random_mat<S>(d_model, dkv, rng, 2.0 / std::sqrt(double(d_model)));
  w.w_o = random_mat<S>(d, d_model, rng, 2.0 / std::sqrt(double(d)));
  w.alpha = scale_vec<S>(d, rng);
  w.beta = offset_vec<S>(d, rng);
  w.alpha_out = scale_vec<S>(d, rng);
  w.beta_out = offset_vec<S>(d, rng);
  w.q_norm = scale_vec<S>(D, rng);
  w.k_norm = scale_vec<S>(D, rng);
  return w;
}

/// A guarded device copy of host matrix or vector `m` (elements of S), named for canary errors.
template <typename S, typename M>
std::unique_ptr<DeviceBuffer> to_dev(const std::string& name, const M& m) {
  static_assert(sizeof(typename M::Scalar) == sizeof(S), "to_dev: element size mismatch");
  return std::make_unique<DeviceBuffer>(DeviceBuffer::of(name, m));
}

struct Cublas {
  cublasHandle_t h = nullptr;
  Cublas() {
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasCreate failed");
  }
  ~Cublas() {
    if (h) cublasDestroy(h);
  }
};

// Accumulates SPEC §6 reports of one case.
struct Verdict {
  bool pass = true;
  std::string report;
  double worst_ratio = 0;  // max over tensors of max_abs / abs_tol
  double worst_rel = 0;    // max over tensors of rel_fro / rel_tol
  template <typename A>
  void add(const std::string& name, const Mat<A>& got, const Mat<double>& ref, const Mat<A>& at_dtype, int heads,
           int inner, const std::string& dt) {
    if (ref.rows() == 0) return;
    const double ex = check::max_abs_diff(at_dtype, ref);
    const auto r = check::compare(name, got, ref, heads, inner, dt, ex);
    worst_ratio = std::max(worst_ratio, r.max_abs / r.abs_tol);
    worst_rel = std::max(worst_rel, r.rel_fro / r.rel_tol);
    std::ostringstream os;
    os << "  " << name << ": rel_fro=" << r.rel_fro << " (tol " << r.rel_tol << ") max_abs=" << r.max_abs
       << " (tol " << r.abs_tol << " = 2*" << ex << "+1e-6) nan=" << r.nan_count << " inf=" << r.inf_count
       << (r.pass ? "" : "  FAIL") << "\n";
    if (!r.pass) pass = false;
    report += os.str();
  }
};


}  // namespace orthros::gputest
