// Tests of verify/kit/include/orthros/portkit.hpp on large scores in the backward: the recipe of
// `orthros golden --grad`'s edge_grad_large_logits, the oracle at each dtype against its bound.
#include "orthros/layer_suite.hpp"
#include "orthros/portkit.hpp"

#include "orthros_testing.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace oc = orthros::check;
namespace pk = orthros::portkit;
using orthros::Mat;
using orthros::testing::error_message;
using orthros::testing::random_mat;
using orthros::testing::Rng;

// ---- large scores in the backward: the recipe of `golden --grad`'s edge_grad_large_logits ----

namespace {

/// The recipe of edge_grad_large_logits (cmd_golden.cpp; here with this file's Rng): H_q 4, H_kv 2,
/// D 64 (scale 1/8), T 24, T_out 4, w 8. Per KV head a sign vector u; k_j = u + r_j and
/// q_i = b_i u + p_i with r_j, p_i orthogonal to u (pairs (2m, 2m+1): x_{2m+1} = -u_{2m} u_{2m+1}
/// x_{2m}), r in {0, ±4}, p = ±1 on 4 pairs, |b| in [17, 30]: every score is the integer
/// 8 b_i + (-4..4), |s| in [132, 244], exact in every dtype; v, do, do_out random. Scores of
/// magnitude `mult` times that when `mult` > 1 (q scaled; still exact for mult 2 and 4).
orthros::st::File large_score_grad_case(std::uint64_t seed, orthros::st::DType dt, double mult = 1.0) {
  Rng rng(seed);
  const int Hq = 4, Hkv = 2, D = 64, T = 24, T_out = 4;
  const orthros::AttentionDims dims{Hq, Hkv, D};
  auto bit = [&] { return (rng() & 1) != 0; };
  Mat<double> u(Hkv, D);
  for (int h = 0; h < Hkv; ++h)
    for (int d = 0; d < D; ++d) u(h, d) = bit() ? 1.0 : -1.0;
  auto put_pair = [&](double* row, int h, int m, double a) {
    row[2 * m] += a;
    row[2 * m + 1] -= u(h, 2 * m) * u(h, 2 * m + 1) * a;
  };
  Mat<double> k(T, Hkv * D);
  for (int j = 0; j < T; ++j)
    for (int h = 0; h < Hkv; ++h) {
      double* row = k.data() + j * k.cols() + h * D;
      for (int d = 0; d < D; ++d) row[d] = u(h, d);
      for (int m = 0; m < D / 2; ++m) put_pair(row, h, m, 4.0 * (static_cast<double>(rng() % 3) - 1.0));
    }
  auto queries = [&](int rows) {
    Mat<double> q(rows, Hq * D);
    for (int i = 0; i < rows; ++i)
      for (int h = 0; h < Hq; ++h) {
        double* row = q.data() + i * q.cols() + h * D;
        const int mag = 17 + static_cast<int>(rng() % 14);
        const double b = bit() ? mag : -mag;
        for (int d = 0; d < D; ++d) row[d] = b * u(h / 2, d);
        std::vector<bool> used(D / 2, false);
        for (int n = 0; n < 4;) {
          const int m = static_cast<int>(rng() % (D / 2));
          if (used[m]) continue;
          used[m] = true;
          put_pair(row, h / 2, m, bit() ? 1.0 : -1.0);
          ++n;
        }
      }
    return Mat<double>(q * mult);
  };
  const Mat<double> q = queries(T), qo = queries(T_out);
  orthros::AttentionOptions opt;
  opt.window = 8;
  auto cf = orthros::make_attention_case<double>(q, k, random_mat<double>(T, Hkv * D, rng), qo, dims, opt, dt);
  cf.tensors["do"] = orthros::st::from_matrix<double>(random_mat<double>(T, Hq * D, rng), {T, Hq, D}, dt);
  cf.tensors["do_out"] = orthros::st::from_matrix<double>(random_mat<double>(T_out, Hq * D, rng), {T_out, Hq, D}, dt);
  return cf;
}

/// The oracle at S (forward + backward on the case's inputs in S) as a port's eight tensors, in
/// float64 (exact widening).
template <typename S>
std::map<std::string, std::vector<double>> oracle_port(const orthros::st::File& cf) {
  const auto c = orthros::load_attention_case<S>(cf);
  const auto f = orthros::orthros_attention<S>(c.q, c.k, c.v, c.q_out, c.dims, c.options);
  const auto g = orthros::orthros_attention_backward<S>(
      c.q, c.k, c.v, c.q_out, f, orthros::st::to_matrix<S>(cf.tensors.at("do"), "do"),
      orthros::st::to_matrix<S>(cf.tensors.at("do_out"), "do_out"), c.dims, c.options);
  return {{"o", oc::to_f64(f.o)},   {"o_out", oc::to_f64(f.o_out)},   {"lse", oc::to_f64(f.lse)},
          {"lse_out", oc::to_f64(f.lse_out)}, {"dq", oc::to_f64(g.dq)}, {"dq_out", oc::to_f64(g.dq_out)},
          {"dk", oc::to_f64(g.dk)}, {"dv", oc::to_f64(g.dv)}};
}

/// Worst relative error of the oracle at S over the eight tensors; every tensor must pass.
template <typename S>
double oracle_at_dtype_passes_large_scores(std::uint64_t seed, const char* dtype, orthros::st::DType dt) {
  const auto cf = large_score_grad_case(seed, dt);
  const pk::Expected e = pk::compute_expected(cf, dtype);
  EXPECT_TRUE(e.grad);
  const auto port = oracle_port<S>(cf);
  double worst = 0;
  for (const std::string& n : e.names()) {
    const auto& ref = e.file.tensors.at(n);
    auto r = oc::compare(n, port.at(n), ref.shape, pk::values(ref), ref.shape, dtype, e.oracle_err.at(n));
    EXPECT_TRUE(r.pass) << dtype << " " << n << " rel " << r.rel_fro << " (tol " << r.rel_tol << ") max_abs "
                        << r.max_abs << " (tol " << r.abs_tol << ")";
    worst = std::max(worst, r.rel_fro);
  }
  return worst;
}

}  // namespace

TEST(PortkitLargeScoreGrad, ScoresAreLargeIntegersAndSoftmaxIsPeakedNotOneHot) {
  SCOPED_TRACE("seed=57");
  const auto cf = large_score_grad_case(57, orthros::st::DType::BF16);
  const auto c = orthros::load_attention_case<double>(cf);
  double smin = 1e300, smax = 0, pmax_min = 1, pmax_max = 0;
  for (int which = 0; which < 2; ++which) {
    const Mat<double>& q = which ? c.q_out : c.q;
    const Eigen::Index off = which ? c.T - c.T_out : 0;
    for (Eigen::Index i = 0; i < q.rows(); ++i)
      for (int h = 0; h < 4; ++h) {
        const Eigen::Index t = off + i, lo = which ? 0 : std::max<Eigen::Index>(0, t - 7);
        std::vector<double> s;
        for (Eigen::Index j = lo; j <= t; ++j) {
          double dot = 0;
          for (int d = 0; d < 64; ++d) dot += q(i, h * 64 + d) * c.k(j, (h / 2) * 64 + d);
          s.push_back(dot / 8);
          EXPECT_EQ(s.back(), std::round(s.back())) << "scores are integers (exact in bf16 below 256)";
          smin = std::min(smin, std::abs(s.back()));
          smax = std::max(smax, std::abs(s.back()));
        }
        const double m = *std::max_element(s.begin(), s.end());
        double l = 0;
        for (double x : s) l += std::exp(x - m);
        if (s.size() >= 8) {  // rows with a full window or more
          pmax_min = std::min(pmax_min, 1 / l);
          pmax_max = std::max(pmax_max, 1 / l);
        }
      }
  }
  EXPECT_GE(smin, 132);
  EXPECT_LE(smax, 244);
  EXPECT_GT(smax, 200);
  EXPECT_LT(pmax_max, 0.999) << "no row is one-hot";
  EXPECT_GT(pmax_max, 0.3) << "some rows are peaked";
  // The float64 gradients are O(1), far above every dtype's resolution (unlike edge_large_logits).
  const pk::Expected e = pk::compute_expected(cf, "f64");
  for (const char* n : {"dq", "dq_out", "dk"}) {
    const auto v = pk::values(e.file.tensors.at(n));
    double rms = 0;
    for (double x : v) rms += x * x;
    EXPECT_GT(std::sqrt(rms / static_cast<double>(v.size())), 1e-2) << n;
  }
}

TEST(PortkitLargeScoreGrad, OracleAtEachDtypePasses) {
  for (std::uint64_t seed : {58u, 59u, 60u}) {
    SCOPED_TRACE("seed=" + std::to_string(seed));
    EXPECT_EQ(oracle_at_dtype_passes_large_scores<double>(seed, "f64", orthros::st::DType::F64), 0.0);
    EXPECT_GT(oracle_at_dtype_passes_large_scores<float>(seed, "f32", orthros::st::DType::F32), 0.0);
    oracle_at_dtype_passes_large_scores<Eigen::bfloat16>(seed, "bf16", orthros::st::DType::BF16);
    oracle_at_dtype_passes_large_scores<Eigen::half>(seed, "f16", orthros::st::DType::F16);
  }
}

// Why the case stops below |s| = 256: with scores twice as large (still exact in every dtype), the
// f32 oracle's lse rounding (P = exp(s - lse)) alone costs about 1e-5 in dq/dq_out/dk, the f32 bound.
TEST(PortkitLargeScoreGrad, F32OracleErrorGrowsWithTheScoreMagnitude) {
  SCOPED_TRACE("seed=61");
  double worst[2] = {0, 0};
  for (int x = 0; x < 2; ++x) {
    const auto cf = large_score_grad_case(61, orthros::st::DType::F32, x ? 4.0 : 1.0);
    const pk::Expected e = pk::compute_expected(cf, "f32");
    const auto port = oracle_port<float>(cf);
    for (const char* n : pk::grad_names()) {
      const auto& ref = e.file.tensors.at(n);
      worst[x] = std::max(worst[x], oc::compare(n, port.at(n), ref.shape, pk::values(ref), ref.shape, "f32",
                                                e.oracle_err.at(n)).rel_fro);
    }
  }
  EXPECT_LT(worst[0], 1e-5);
  EXPECT_GT(worst[1], 1e-5) << "|s| 528..976: f32 lse rounding exceeds the bound";
}

TEST(PortkitLargeScoreGrad, PerturbedDqRowFails) {
  SCOPED_TRACE("seed=62");
  const auto cf = large_score_grad_case(62, orthros::st::DType::BF16);
  const pk::Expected e = pk::compute_expected(cf, "bf16");
  auto port = oracle_port<Eigen::bfloat16>(cf);
  const auto& ref = e.file.tensors.at("dq");
  const std::int64_t row = 13, per_row = ref.shape[1] * ref.shape[2];
  port.at("dq")[row * per_row + 70] += 4 * oc::abs_tolerance(*e.oracle_err.at("dq").maxabs);  // head 1, dim 6
  auto r = oc::compare("dq", port.at("dq"), ref.shape, pk::values(ref), ref.shape, "bf16", e.oracle_err.at("dq"));
  EXPECT_FALSE(r.pass);
  EXPECT_FALSE(r.pass_abs);
  EXPECT_EQ(r.bad_rows, (std::vector<std::int64_t>{row}));
  EXPECT_EQ(pk::row_position("dq", row, 0, 24, 4), row + 1);
  for (const char* n : {"dq_out", "dk", "dv"}) {  // the other gradients still pass
    const auto& rf = e.file.tensors.at(n);
    EXPECT_TRUE(oc::compare(n, port.at(n), rf.shape, pk::values(rf), rf.shape, "bf16", e.oracle_err.at(n)).pass) << n;
  }
}
