// The float32 LSE floor of SPEC §6 (check.hpp lse_f32_floor): a float32 online softmax in the log2
// domain, simulated here from the math, passes at large |lse| where the plain 2 E_X + 1e-6 bound
// failed it; an LSE in log2 and a window off by one still fail.
//
// The simulated kernel (no library code): per query row, raw dot products r_j in float32, the
// scale folded into exp2 (c = fl(scale * log2 e), a_j = fl(c r_j)), keys in blocks of B with a
// float32 running max M and sum l rescaled by exp2(M_old - M_new), L2 = M + log2 l, lse = L2 * ln 2,
// every step rounded to float32 — and FlashAttention-2's natural-log variant (exponents
// fma(r_j, c, -fl(M_r c)), rescaling by exp2((M_old - M_new) c), lse = fma(M_r, fl(scale), log l)). Optionally exp2 and log2 carry the
// error of a hardware approximation (relative / absolute 2^-22, drawn at random). Scores are
// exact integers of magnitude up to ~1000 (the recipe of `golden --grad`'s edge_grad_large_logits,
// with larger query multipliers), so every error measured is the LSE arithmetic's.
//
// Also criterion 1's LSE scale max(|lse_i|, 1) (check.hpp lse_rel_scale): the naive float32 oracle
// passes on one-key rows whose LSE is near 0 by cancellation, where the plain relative error fails it.
#include "orthros/attention.hpp"
#include "orthros/check.hpp"
#include "orthros_testing.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace oc = orthros::check;
using orthros::Mat;
using orthros::testing::Rng;

namespace {

constexpr int kHq = 4, kHkv = 2, kD = 64, kT = 24, kTout = 4, kWindow = 8;

/// q [T, H_q*D], k [T, H_kv*D], q_out [T_out, H_q*D] with integer scores 8 b + (-4..4) per row,
/// |b| in [b_lo, b_hi] (k_j = u + r_j, q_i = b_i u + p_i, r, p orthogonal to a sign vector u).
struct LargeScoreCase {
  Mat<double> q, k, v, q_out;
};

LargeScoreCase large_score_case(Rng& rng, int b_lo, int b_hi) {
  auto bit = [&] { return (rng() & 1) != 0; };
  Mat<double> u(kHkv, kD);
  for (int h = 0; h < kHkv; ++h)
    for (int d = 0; d < kD; ++d) u(h, d) = bit() ? 1.0 : -1.0;
  auto put_pair = [&](double* row, int h, int m, double a) {
    row[2 * m] += a;
    row[2 * m + 1] -= u(h, 2 * m) * u(h, 2 * m + 1) * a;
  };
  LargeScoreCase c;
  c.k.resize(kT, kHkv * kD);
  for (int j = 0; j < kT; ++j)
    for (int h = 0; h < kHkv; ++h) {
      double* row = c.k.data() + j * c.k.cols() + h * kD;
      for (int d = 0; d < kD; ++d) row[d] = u(h, d);
      for (int m = 0; m < kD / 2; ++m) put_pair(row, h, m, 4.0 * (static_cast<double>(rng() % 3) - 1.0));
    }
  auto queries = [&](int rows) {
    Mat<double> q(rows, kHq * kD);
    for (int i = 0; i < rows; ++i)
      for (int h = 0; h < kHq; ++h) {
        double* row = q.data() + i * q.cols() + h * kD;
        const int mag = b_lo + static_cast<int>(rng() % static_cast<std::uint64_t>(b_hi - b_lo + 1));
        const double b = bit() ? mag : -mag;
        for (int d = 0; d < kD; ++d) row[d] = b * u(h / 2, d);
        std::vector<bool> used(kD / 2, false);
        for (int n = 0; n < 4;) {
          const int m = static_cast<int>(rng() % (kD / 2));
          if (used[m]) continue;
          used[m] = true;
          put_pair(row, h / 2, m, bit() ? 1.0 : -1.0);
          ++n;
        }
      }
    return q;
  };
  c.q = queries(kT);
  c.q_out = queries(kTout);
  c.v = orthros::testing::random_mat<double>(kT, kHkv * kD, rng);
  return c;
}

/// How the simulated kernel forms its LSE.
enum class Form { kLog2, kNatural };

/// One row's LSE by a float32 online softmax over keys [lo, hi] of KV head `kvh`, blocks of `block`.
float simulated_row_lse(const double* q, const Mat<double>& k, int kvh, int lo, int hi, int block, Form form,
                        bool approx, Rng& rng) {
  const float scale = 1.0f / 8.0f;  // 1/sqrt(64), exact
  const float c = scale * 1.44269504088896340736f;  // fl(scale * log2 e): the product rounded once
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  auto exp2_hw = [&](float x) {
    const float e = std::exp2(x);
    return approx ? static_cast<float>(e * (1.0 + 0x1p-22 * unit(rng))) : e;
  };
  auto log2_hw = [&](float x) {
    const float e = std::log2(x);
    return approx ? static_cast<float>(e + 0x1p-22 * unit(rng)) : e;
  };
  const float ninf = -std::numeric_limits<float>::infinity();
  float M = ninf, l = 0.0f;  // log2 form: running max of a_j; natural form: running max of r_j
  for (int b0 = lo; b0 <= hi; b0 += block) {
    const int b1 = std::min(hi, b0 + block - 1);
    std::vector<float> r;
    for (int j = b0; j <= b1; ++j) {
      float dot = 0.0f;
      const double* kj = k.data() + j * k.cols() + kvh * kD;
      for (int d = 0; d < kD; ++d) dot += static_cast<float>(q[d]) * static_cast<float>(kj[d]);
      r.push_back(dot);
    }
    float m_new = M;
    for (float x : r) m_new = std::max(m_new, form == Form::kLog2 ? c * x : x);
    float sum = 0.0f;
    if (form == Form::kLog2) {
      for (float x : r) sum += exp2_hw(c * x - m_new);
      l = (M == ninf ? 0.0f : l * exp2_hw(M - m_new)) + sum;
    } else {
      const float mc = m_new * c;
      for (float x : r) sum += exp2_hw(std::fma(x, c, -mc));
      l = (M == ninf ? 0.0f : l * exp2_hw((M - m_new) * c)) + sum;  // raw maxes subtracted first: 0 when unchanged
    }
    M = m_new;
  }
  if (form == Form::kLog2) return (M + log2_hw(l)) * 0.693147180559945309f;
  return std::fma(M, scale, static_cast<float>(log2_hw(l) * 0.693147180559945309f));
}

/// The simulated kernel's lse [T, H_q] and lse_out [T_out, H_q], flat, widened to double.
std::pair<std::vector<double>, std::vector<double>> simulated_lse(const LargeScoreCase& c, int window, int block,
                                                                  Form form, bool approx, Rng& rng) {
  std::vector<double> lse, lse_out;
  const int group = kHq / kHkv;
  for (int i = 0; i < kT; ++i)
    for (int h = 0; h < kHq; ++h)
      lse.push_back(simulated_row_lse(c.q.data() + i * c.q.cols() + h * kD, c.k, h / group,
                                      std::max(0, i - window + 1), i, block, form, approx, rng));
  for (int i = 0; i < kTout; ++i)
    for (int h = 0; h < kHq; ++h)
      lse_out.push_back(simulated_row_lse(c.q_out.data() + i * c.q_out.cols() + h * kD, c.k, h / group, 0,
                                          kT - kTout + i, block, form, approx, rng));
  return {lse, lse_out};
}

const orthros::AttentionDims kDims{kHq, kHkv, kD};

/// The float64 oracle and the oracle at S on the case (inputs exact in S: small integers / v rounded).
template <typename S>
std::pair<orthros::AttentionResult<double>, orthros::AttentionResult<S>> oracles(const LargeScoreCase& c, int window) {
  orthros::AttentionOptions opt;
  opt.window = window;
  const Mat<S> q = orthros::round_matrix<S>(c.q), k = orthros::round_matrix<S>(c.k),
               v = orthros::round_matrix<S>(c.v), qo = orthros::round_matrix<S>(c.q_out);
  auto wide = [](const Mat<S>& m) { return orthros::testing::to_double(m); };
  return {orthros::orthros_attention<double>(wide(q), wide(k), wide(v), wide(qo), kDims, opt),
          orthros::orthros_attention<S>(q, k, v, qo, kDims, opt)};
}

struct Judged {
  oc::TensorReport with_floor, without_floor;
};

/// SPEC §6 on one LSE tensor with and without the float32 floor.
template <typename L>
Judged judge(const std::string& name, const std::vector<double>& actual, const Mat<double>& ref, const Mat<L>& at,
             const std::string& dtype) {
  const double e_x = oc::max_abs_diff(at, ref);
  const std::vector<std::int64_t> shape{ref.rows(), ref.cols()};
  const std::int64_t keys = oc::lse_max_keys(name, 0, kT, kTout, kWindow);
  return {oc::compare(name, actual, shape, oc::to_f64(ref), shape, dtype, e_x, keys),
          oc::compare(name, actual, shape, oc::to_f64(ref), shape, dtype, e_x, 0)};
}

}  // namespace

TEST(LseFloor, FormulaAndKeyCounts) {
  EXPECT_DOUBLE_EQ(oc::lse_f32_floor(0.0, 1), 0.0);
  EXPECT_DOUBLE_EQ(oc::lse_f32_floor(234.0, 8), 0x1p-24 * (5 * 234.0 + 6 * std::log(8.0)));
  EXPECT_THROW(oc::lse_f32_floor(-1.0, 8), orthros::Error);
  EXPECT_THROW(oc::lse_f32_floor(1.0, 0), orthros::Error);
  EXPECT_EQ(oc::lse_max_keys("lse", 3, 20, 4, 8), 8);
  EXPECT_EQ(oc::lse_max_keys("lse", 0, 5, 1, 8), 5);
  EXPECT_EQ(oc::lse_max_keys("lse_out", 3, 20, 4, 8), 23);
  EXPECT_EQ(oc::lse_max_keys("lse_out", 3, 20, 0, 8), 0);
  EXPECT_EQ(oc::lse_max_keys("o", 3, 20, 4, 8), 0);
  EXPECT_THROW(oc::lse_max_keys("lse", 0, 5, 6, 8), orthros::Error);
  EXPECT_THROW(oc::lse_max_keys("lse", 0, 5, 1, 0), orthros::Error);
}

TEST(LseFloor, AppliesToFloat32LsesOnlyAndNotToF64OrOtherTensors) {
  const std::vector<double> ref{234.0, -200.0, 5.0}, act{234.0 + 3e-5, -200.0, 5.0};
  const std::vector<std::int64_t> shape{3};
  const auto f32 = oc::compare("lse", act, shape, ref, shape, "f32", 0.0, 8);
  EXPECT_TRUE(f32.pass) << f32.abs_tol;
  EXPECT_DOUBLE_EQ(f32.lse_floor, oc::lse_f32_floor(234.0, 8));
  EXPECT_DOUBLE_EQ(f32.abs_tol, 1e-6 + f32.lse_floor);
  EXPECT_NE(oc::abs_criterion_text(f32).find("F_lse"), std::string::npos);
  const auto f64 = oc::compare("lse", act, shape, ref, shape, "f64", 0.0, 8);
  EXPECT_FALSE(f64.pass);
  EXPECT_EQ(f64.lse_floor, 0.0);
  const auto none = oc::compare("lse", act, shape, ref, shape, "f32", 0.0);
  EXPECT_FALSE(none.pass);
  // Criterion 2 not applicable: nothing to add a floor to.
  const auto na = oc::compare("lse", act, shape, ref, shape, "f16", oc::AbsBaseline::not_applicable("test"), 8);
  EXPECT_EQ(na.lse_floor, 0.0);
  EXPECT_FALSE(na.abs_applicable);
  EXPECT_THROW(oc::compare("lse", act, shape, ref, shape, "f32", 0.0, -1), orthros::Error);
}

// (a) The simulated float32 online softmax passes at large |lse| in every draw, where the plain
// bound fails it in some: both forms, blocks of 1..8 keys, with and without approximate exp2/log2.
template <typename S>
void simulated_kernel_passes(const char* dtype, int b_lo, int b_hi, std::uint64_t seed0, int draws) {
  int old_failures = 0;
  double worst_ratio = 0;  // max_abs / abs_tol with the floor
  for (int n = 0; n < draws; ++n) {
    const std::uint64_t seed = seed0 + static_cast<std::uint64_t>(n);
    SCOPED_TRACE("seed=" + std::to_string(seed) + " dtype=" + dtype);
    Rng rng(seed);
    const LargeScoreCase c = large_score_case(rng, b_lo, b_hi);
    const auto [ref, at] = oracles<S>(c, kWindow);
    const int block = 1 + static_cast<int>(rng() % 8);
    const Form form = (rng() & 1) ? Form::kLog2 : Form::kNatural;
    const bool approx = (rng() & 1) != 0;
    const auto [lse, lse_out] = simulated_lse(c, kWindow, block, form, approx, rng);
    for (const auto& [name, act, r, a] : {std::tuple{std::string("lse"), &lse, &ref.lse, &at.lse},
                                          std::tuple{std::string("lse_out"), &lse_out, &ref.lse_out, &at.lse_out}}) {
      const Judged j = judge(name, *act, *r, *a, dtype);
      EXPECT_TRUE(j.with_floor.pass) << name << " block " << block << (form == Form::kLog2 ? " log2" : " natural")
                                     << (approx ? " approx" : "") << ": max_abs " << j.with_floor.max_abs
                                     << " > tol " << j.with_floor.abs_tol << " (floor " << j.with_floor.lse_floor
                                     << ") at " << j.with_floor.worst_ref;
      old_failures += j.without_floor.pass ? 0 : 1;
      worst_ratio = std::max(worst_ratio, j.with_floor.max_abs / j.with_floor.abs_tol);
    }
  }
  std::printf("%s |b| in [%d, %d]: %d draws, %d LSE tensors fail the plain 2 E_X + 1e-6 bound; worst "
              "max_abs / (bound + F) = %.3f\n", dtype, b_lo, b_hi, draws, old_failures, worst_ratio);
  EXPECT_GT(old_failures, 0) << "the draws never reach the case the floor is for: the test would prove nothing";
}

TEST(LseFloor, SimulatedOnlineSoftmaxPassesAtF32) { simulated_kernel_passes<float>("f32", 17, 120, 1000, 150); }
TEST(LseFloor, SimulatedOnlineSoftmaxPassesAtBf16) {
  simulated_kernel_passes<Eigen::bfloat16>("bf16", 17, 30, 2000, 150);
}

// (c) What the floor must not let pass, at large |lse| where it is largest and on ordinary inputs.
TEST(LseFloor, Log2LseAndOffByOneWindowStillFail) {
  for (std::uint64_t seed = 3000; seed < 3040; ++seed) {
    SCOPED_TRACE("seed=" + std::to_string(seed));
    Rng rng(seed);
    const bool large = seed % 2 == 0;
    LargeScoreCase c;
    if (large) {
      c = large_score_case(rng, 17, 30);
    } else {
      c.q = orthros::testing::random_mat<double>(kT, kHq * kD, rng);
      c.k = orthros::testing::random_mat<double>(kT, kHkv * kD, rng);
      c.v = orthros::testing::random_mat<double>(kT, kHkv * kD, rng);
      c.q_out = orthros::testing::random_mat<double>(kTout, kHq * kD, rng);
    }
    const auto [ref, at] = oracles<float>(c, kWindow);
    for (const char* dtype : {"f32", "bf16", "f16"}) {
      // The oracle's own float32 LSE converted to log2: every row off by 0.44 |lse|.
      std::vector<double> log2 = oc::to_f64(at.lse), log2_out = oc::to_f64(at.lse_out);
      for (double& x : log2) x *= 1.4426950408889634;
      for (double& x : log2_out) x *= 1.4426950408889634;
      EXPECT_FALSE(judge("lse", log2, ref.lse, at.lse, dtype).with_floor.pass) << dtype;
      EXPECT_FALSE(judge("lse_out", log2_out, ref.lse_out, at.lse_out, dtype).with_floor.pass) << dtype;
      // Windows w+1 and w-1 (the float32 oracle's own LSE under the wrong window).
      for (int w : {kWindow + 1, kWindow - 1}) {
        const auto wrong = oracles<float>(c, w).second;
        const Judged j = judge("lse", oc::to_f64(wrong.lse), ref.lse, at.lse, dtype);
        EXPECT_FALSE(j.with_floor.pass) << dtype << " window " << w << ": max_abs " << j.with_floor.max_abs
                                        << " tol " << j.with_floor.abs_tol;
      }
    }
  }
}

// (d) Criterion 1's LSE scale max(|lse_i|, 1) (check.hpp lse_rel_scale): one-key rows whose score
// q.k*scale is near 0 by cancellation. In float64 the key is chosen so that q.k is
// 1e-4 * |q| |k| / sqrt(D) - small against the products it sums - and the inputs are then rounded to
// float32, so the float32 dot product's rounding is many times 1e-5 |lse|.
namespace {
struct OneKeyRow {
  Mat<double> q, k, v, q_out;
};

OneKeyRow one_key_cancelling_row(Rng& rng, int D) {
  OneKeyRow c;
  c.q = orthros::testing::random_mat<double>(1, D, rng);
  c.k = orthros::testing::random_mat<double>(1, D, rng);
  c.v = orthros::testing::random_mat<double>(1, D, rng);
  double dot = 0, qq = 0, kk = 0;
  for (int d = 0; d < D; ++d) dot += c.q(0, d) * c.k(0, d), qq += c.q(0, d) * c.q(0, d), kk += c.k(0, d) * c.k(0, d);
  const double target = 1e-4 * std::sqrt(qq * kk / D);  // cancel all but a 1e-4 fraction of the typical |q.k|
  for (int d = 0; d < D; ++d) c.k(0, d) -= (dot - target) / qq * c.q(0, d);  // k <- k - (q.k - target) q / |q|^2
  c.q_out = c.q;
  return c;
}
}  // namespace

TEST(LseRelScale, NaiveFloat32OracleOnCancellingOneKeyRowsPasses) {
  constexpr int D = 16;
  const orthros::AttentionDims dims{1, 1, D};
  orthros::AttentionOptions opt;
  opt.window = 1;
  int plain_failures = 0;
  for (std::uint64_t seed = 4000; seed < 4200; ++seed) {
    SCOPED_TRACE("seed=" + std::to_string(seed));
    Rng rng(seed);
    const OneKeyRow c = one_key_cancelling_row(rng, D);
    const Mat<float> q = orthros::round_matrix<float>(c.q), k = orthros::round_matrix<float>(c.k),
                     v = orthros::round_matrix<float>(c.v), qo = orthros::round_matrix<float>(c.q_out);
    auto wide = [](const Mat<float>& m) { return orthros::testing::to_double(m); };
    const auto ref = orthros::orthros_attention<double>(wide(q), wide(k), wide(v), wide(qo), dims, opt);
    const auto at = orthros::orthros_attention<float>(q, k, v, qo, dims, opt);
    ASSERT_LT(std::abs(ref.lse(0, 0)), 1e-2);  // the case is what it claims: L near 0
    for (const auto& [name, a, r] : {std::tuple{std::string("lse"), &at.lse, &ref.lse},
                                     std::tuple{std::string("lse_out"), &at.lse_out, &ref.lse_out}}) {
      const std::vector<std::int64_t> shape{1, 1};
      const std::int64_t keys = oc::lse_max_keys(name, 0, 1, 1, 1);
      const double e_x = oc::max_abs_diff(*a, *r);
      const auto rep = oc::compare(name, oc::to_f64(*a), shape, oc::to_f64(*r), shape, "f32", e_x, keys);
      EXPECT_TRUE(rep.rel_lse_scale) << name;
      EXPECT_TRUE(rep.pass) << name << ": rel " << rep.rel_fro << " (tol " << rep.rel_tol << ") max_abs "
                            << rep.max_abs << " (tol " << rep.abs_tol << ") at L = " << rep.worst_ref;
      // The plain relative error |ΔL| / |L| of the same values, as criterion 1 measured it before.
      const double plain = rep.max_abs / std::abs(rep.worst_ref);
      plain_failures += plain > rep.rel_tol ? 1 : 0;
      // A port whose e^L is 2e-5 off in relative terms (ΔL = 2e-5) still fails, at L near 0.
      const auto off = oc::compare(name, {rep.worst_ref + 2e-5}, shape, oc::to_f64(*r), shape, "f32", e_x, keys);
      EXPECT_FALSE(off.pass_rel) << name << ": rel " << off.rel_fro;
      EXPECT_FALSE(off.pass) << name;
    }
  }
  std::printf("one-key rows with L near 0: %d of 400 naive float32 LSEs fail the plain relative error\n",
              plain_failures);
  EXPECT_GT(plain_failures, 0) << "no draw reaches the case the LSE scale is for: the test would prove nothing";
}

TEST(LseRelScale, EqualsThePlainRelativeErrorWhereEveryLseIsAtLeastOne) {
  const std::vector<double> ref{234.0, -200.0, 5.0, -1.0}, act{234.0 + 3e-3, -200.0 - 1e-3, 5.0, -1.0 + 2e-4};
  const std::vector<std::int64_t> shape{4};
  for (const char* dtype : {"f64", "f32", "bf16", "f16"}) {
    const auto lse = oc::compare("lse", act, shape, ref, shape, dtype, oc::AbsBaseline::of(0.0), 8);
    const auto plain = oc::compare("x", act, shape, ref, shape, dtype, oc::AbsBaseline::of(0.0), 0);
    EXPECT_TRUE(lse.rel_lse_scale);
    EXPECT_FALSE(plain.rel_lse_scale);
    EXPECT_DOUBLE_EQ(lse.rel_fro, plain.rel_fro) << dtype;
  }
  // Below |L| = 1 the scale is 1 per element: ‖Δ‖_F / sqrt(Σ max(L_i^2, 1)).
  const std::vector<double> small{0.5, -3e-5}, small_act{0.5 + 3e-6, -3e-5 + 4e-6};
  const auto r = oc::compare("lse", small_act, {2}, small, {2}, "f32", oc::AbsBaseline::of(0.0), 4);
  EXPECT_NEAR(r.rel_fro, 5e-6 / std::sqrt(2.0), 1e-15);  // 0.5 + 3e-6 carries a 1e-17 rounding
  EXPECT_TRUE(r.pass_rel);
  // An exactly zero LSE reference is judged by criterion 1 too (its scale is 1, not 0).
  const auto z = oc::compare("lse", {2e-5}, {1}, {0.0}, {1}, "f32", oc::AbsBaseline::of(0.0), 4);
  EXPECT_TRUE(z.rel_applicable);
  EXPECT_DOUBLE_EQ(z.rel_fro, 2e-5);
  EXPECT_FALSE(z.pass_rel);
}
