/// \file expected_cases.hpp
/// \brief Seeded cases shared by the tests of portkit.hpp (test_expected*.cpp): a gradient case of
/// the operator and a small layer case, inputs never zero (orthros::testing::random_mat).
#pragma once

#include "orthros/layer_suite.hpp"
#include "orthros/portkit.hpp"

#include "orthros_testing.hpp"

#include <cstdint>

namespace orthros::portkit_testing {

using orthros::testing::random_mat;
using orthros::testing::Rng;
namespace pk = orthros::portkit;

inline const orthros::AttentionDims kDims{4, 2, 8};  // H_q = 4, H_kv = 2, D = 8

/// A gradient case: random q, k, v, q_out and upstream gradients do, do_out, all stored in `dt`.
/// T = 9, P = 3, T_out = 4, w = 3, H_q = 4, H_kv = 2, D = 8 (so dk/dv have P+T = 12 rows and the
/// first cache rows are seen only by the output stream).
inline orthros::st::File grad_case(std::uint64_t seed, orthros::st::DType dt, double do_amp = 1.0) {
  Rng rng(seed);
  const int T = 9, P = 3, T_out = 4;
  orthros::AttentionOptions opt;
  opt.window = 3;
  auto cf = orthros::make_attention_case<double>(random_mat<double>(T, 32, rng), random_mat<double>(P + T, 16, rng),
                                                 random_mat<double>(P + T, 16, rng),
                                                 random_mat<double>(T_out, 32, rng), kDims, opt, dt);
  cf.tensors["do"] = orthros::st::from_matrix<double>(random_mat<double>(T, 32, rng, do_amp), {T, 4, 8}, dt);
  cf.tensors["do_out"] = orthros::st::from_matrix<double>(random_mat<double>(T_out, 32, rng, do_amp), {T_out, 4, 8}, dt);
  return cf;
}

/// A small layer case: H_q 4, H_kv 2, D 8, d_model 12, P cached rows, T base and T_out output
/// tokens; seeded, never zero; alpha/alpha' away from 1, beta/beta' away from 0.
inline orthros::st::File small_layer_case(std::uint64_t seed, bool qk_norm, std::int64_t P, std::int64_t T,
                                   std::int64_t T_out, orthros::st::DType dt) {
  Rng rng(seed);
  pk::LayerCase<double> c;
  c.cfg = orthros::AttentionConfig{4, 2, 8, 3, 1e4, qk_norm, 1e-6};
  const std::int64_t dm = 12, d = 32, dkv = 16;
  c.w.w_q = random_mat<double>(dm, d, rng, 0.5);
  c.w.w_k = random_mat<double>(dm, dkv, rng, 0.5);
  c.w.w_v = random_mat<double>(dm, dkv, rng, 0.5);
  c.w.w_o = random_mat<double>(d, dm, rng, 0.3);
  auto vec = [&](std::int64_t n, double lo, double hi) {
    orthros::Vec<double> v(n);
    for (std::int64_t i = 0; i < n; ++i) v[i] = (i % 2 ? -1 : 1) * (lo + (hi - lo) * (orthros::testing::nonzero_uniform(rng) + 1) / 2);
    return v;
  };
  c.w.alpha = vec(d, 0.5, 0.8);
  c.w.beta = vec(d, 0.2, 0.6);
  c.w.alpha_out = vec(d, 1.2, 1.5);
  c.w.beta_out = vec(d, 0.2, 0.6);
  if (qk_norm) {
    c.w.q_norm = vec(8, 0.5, 1.5).cwiseAbs();
    c.w.k_norm = vec(8, 0.5, 1.5).cwiseAbs();
  }
  c.x = random_mat<double>(T, dm, rng);
  c.x_out = random_mat<double>(T_out, dm, rng);
  c.cache.k = random_mat<double>(P, dkv, rng);
  c.cache.v = random_mat<double>(P, dkv, rng);
  return pk::make_layer_case(c, dt);
}

}  // namespace orthros::portkit_testing
