// Unit and property tests of the SPEC §6 checker (verify/kit/include/orthros/check.hpp).
#include "orthros/attention.hpp"
#include "orthros/attention_backward.hpp"
#include "orthros/check.hpp"
#include "orthros_testing.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace oc = orthros::check;
using orthros::Mat;
using orthros::testing::random_mat;
using orthros::testing::Rng;

namespace {

std::vector<double> random_vec(std::size_t n, Rng& rng) {
  std::vector<double> v(n);
  for (auto& x : v) x = orthros::testing::nonzero_uniform(rng, 2.0);
  return v;
}

double frob(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

}  // namespace

TEST(CheckTolerance, RelativeToleranceFollowsSpec6) {
  EXPECT_EQ(oc::rel_tolerance("f32"), 1e-5);
  EXPECT_EQ(oc::rel_tolerance("f16"), 2e-3);
  EXPECT_EQ(oc::rel_tolerance("bf16"), 1e-2);
  EXPECT_EQ(oc::rel_tolerance("f64"), 1e-12);
  EXPECT_THROW(oc::rel_tolerance("fp8"), orthros::Error);
}

TEST(CheckTolerance, AbsToleranceIsTwiceOracleErrorPlusSlack) {
  EXPECT_EQ(oc::abs_tolerance(0.0), 1e-6);
  EXPECT_EQ(oc::abs_tolerance(0.25), 0.5 + 1e-6);
  EXPECT_THROW(oc::abs_tolerance(-1.0), orthros::Error);
  EXPECT_THROW(oc::abs_tolerance(std::nan("")), orthros::Error);
}

TEST(CheckUnravel, RowMajorMultiIndex) {
  // [2,3,4]: flat 23 = 1*12 + 2*4 + 3.
  EXPECT_EQ(oc::unravel(23, {2, 3, 4}), (std::vector<std::int64_t>{1, 2, 3}));
  EXPECT_EQ(oc::unravel(5, {2, 3, 4}), (std::vector<std::int64_t>{0, 1, 1}));
}

TEST(CheckCompare, IdenticalTensorsPassWithZeroError) {
  const std::uint64_t seed = 11;
  SCOPED_TRACE("seed=" + std::to_string(seed));
  Rng rng(seed);
  auto ref = random_vec(5 * 3 * 4, rng);
  auto r = oc::compare("o", ref, {5, 3, 4}, ref, {5, 3, 4}, "f32", 0.0);
  EXPECT_TRUE(r.pass);
  EXPECT_EQ(r.rel_fro, 0.0);
  EXPECT_EQ(r.max_abs, 0.0);
  EXPECT_EQ(r.nan_count, 0);
  EXPECT_TRUE(r.bad_rows.empty());
}

TEST(CheckCompare, SinglePerturbationIsLocatedAndMeasured) {
  const std::uint64_t seed = 12;
  SCOPED_TRACE("seed=" + std::to_string(seed));
  Rng rng(seed);
  const std::vector<std::int64_t> shape{6, 2, 8};
  auto ref = random_vec(6 * 2 * 8, rng);
  auto act = ref;
  const std::size_t at = 4 * 16 + 1 * 8 + 5;  // [4, 1, 5]
  const double delta = 0.125;                  // exact in binary: the error is exactly delta
  act[at] += delta;
  auto r = oc::compare("o", act, shape, ref, shape, "bf16", 0.01);
  EXPECT_EQ(r.max_abs, delta);
  EXPECT_EQ(r.worst_index, (std::vector<std::int64_t>{4, 1, 5}));
  EXPECT_EQ(r.worst_ref, ref[at]);
  EXPECT_EQ(r.worst_actual, act[at]);
  EXPECT_NEAR(r.rel_fro, delta / frob(ref), 1e-15);
  EXPECT_NEAR(r.max_rel, delta / std::abs(ref[at]), 1e-15);
  // abs bound 2*0.01 + 1e-6 < 0.125: fails criterion 2 only at row 4.
  EXPECT_FALSE(r.pass_abs);
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.bad_rows, (std::vector<std::int64_t>{4}));
  EXPECT_EQ(r.bad_row_count, 1);
}

TEST(CheckCompare, AbsBoundSeparatesJustBelowFromJustAbove) {
  const std::vector<std::int64_t> shape{2, 2};
  const std::vector<double> ref{1.5, -2.0, 0.75, 3.0};
  const double e_x = 0.5;  // abs_tol = 2*0.5 + 1e-6
  const double tol = oc::abs_tolerance(e_x);
  auto act = ref;
  act[2] = ref[2] + tol * (1 - 1e-9);  // error below the bound (rounding of the sum is ~1e-16)
  auto r = oc::compare("lse", act, shape, ref, shape, "bf16", e_x);
  EXPECT_TRUE(r.pass_abs) << r.max_abs << " vs " << r.abs_tol;
  act[2] = ref[2] + tol * (1 + 1e-9);  // error above the bound
  r = oc::compare("lse", act, shape, ref, shape, "bf16", e_x);
  EXPECT_FALSE(r.pass_abs) << r.max_abs << " vs " << r.abs_tol;
  EXPECT_EQ(r.bad_rows, (std::vector<std::int64_t>{1}));
}

TEST(CheckCompare, RelativeCriterionAloneCanFail) {
  // Uniform error 1e-4 on values of magnitude ~1: abs passes with a generous E_X, rel (f32: 1e-5) fails.
  const std::uint64_t seed = 13;
  SCOPED_TRACE("seed=" + std::to_string(seed));
  Rng rng(seed);
  const std::vector<std::int64_t> shape{8, 4};
  auto ref = random_vec(32, rng);
  std::vector<double> act(ref);
  for (auto& x : act) x *= 1 + 1e-4;  // rel_fro = 1e-4 exactly up to rounding
  auto r = oc::compare("o", act, shape, ref, shape, "f32", 1.0);
  EXPECT_TRUE(r.pass_abs);
  EXPECT_NEAR(r.rel_fro, 1e-4, 1e-12);
  EXPECT_FALSE(r.pass_rel);
  EXPECT_FALSE(r.pass);
}

TEST(CheckCompare, NanAndInfNeverPass) {
  const std::uint64_t seed = 14;
  SCOPED_TRACE("seed=" + std::to_string(seed));
  Rng rng(seed);
  const std::vector<std::int64_t> shape{4, 2, 2};
  auto ref = random_vec(16, rng);
  auto act = ref;
  act[9] = std::numeric_limits<double>::quiet_NaN();  // [2,0,1]
  act[14] = std::numeric_limits<double>::infinity();  // [3,1,0]
  auto r = oc::compare("o", act, shape, ref, shape, "bf16", 1e9);  // huge E_X: only NaN/Inf can fail it
  EXPECT_EQ(r.nan_count, 1);
  EXPECT_EQ(r.inf_count, 1);
  EXPECT_FALSE(r.pass_finite);
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.worst_index, (std::vector<std::int64_t>{2, 0, 1}));  // first non-finite
  EXPECT_EQ(r.bad_rows, (std::vector<std::int64_t>{2, 3}));
}

TEST(CheckCompare, AllNanReportsInfiniteErrorsNotZero) {
  // An all-NaN result has no finite entry: its errors must not read 0 (the max over no finite value).
  const std::uint64_t seed = 15;
  SCOPED_TRACE("seed=" + std::to_string(seed));
  Rng rng(seed);
  const std::vector<std::int64_t> shape{3, 2, 4};
  const auto ref = random_vec(24, rng);
  const std::vector<double> act(24, std::numeric_limits<double>::quiet_NaN());
  for (const double e_x : {0.0, 1e9}) {
    const auto r = oc::compare("o", act, shape, ref, shape, "bf16", e_x);
    EXPECT_EQ(r.nan_count, 24);
    EXPECT_EQ(r.inf_count, 0);
    EXPECT_TRUE(std::isinf(r.max_abs) && r.max_abs > 0) << r.max_abs;
    EXPECT_TRUE(std::isinf(r.max_rel) && r.max_rel > 0) << r.max_rel;
    EXPECT_TRUE(std::isinf(r.rel_fro) && r.rel_fro > 0) << r.rel_fro;
    EXPECT_FALSE(r.pass_finite || r.pass_rel || r.pass_abs || r.pass);
    EXPECT_EQ(r.worst_index, (std::vector<std::int64_t>{0, 0, 0}));
    EXPECT_EQ(r.bad_row_count, 3);
  }
  // One NaN among finite values: the errors are inf too (as rel_fro always was), not the finite max.
  auto one = ref;
  one[5] = std::numeric_limits<double>::quiet_NaN();
  const auto r1 = oc::compare("o", one, shape, ref, shape, "f32", 1e9);
  EXPECT_TRUE(std::isinf(r1.max_abs) && std::isinf(r1.max_rel) && std::isinf(r1.rel_fro));
  EXPECT_EQ(r1.nan_count, 1);
  EXPECT_FALSE(r1.pass);
  // The same with the criterion-2-not-applicable baseline.
  const auto rn = oc::compare("o", act, shape, ref, shape, "f16", oc::AbsBaseline::not_applicable("test"));
  EXPECT_TRUE(std::isinf(rn.max_abs));
  EXPECT_FALSE(rn.pass_abs || rn.pass);
}

TEST(CheckCompare, ShapeMismatchFailsWithoutThrowing) {
  std::vector<double> ref{1, 2, 3, 4, 5, 6};
  auto r = oc::compare("o", ref, {3, 2}, ref, {2, 3}, "f32", 0.0);
  EXPECT_FALSE(r.shape_ok);
  EXPECT_FALSE(r.pass);
}

TEST(CheckCompare, BadArgumentsThrow) {
  std::vector<double> ref{1, 2, 3};
  EXPECT_THROW(oc::compare("o", ref, {4}, ref, {3}, "f32", 0.0), orthros::Error);  // size vs shape
  std::vector<double> bad{1, std::nan(""), 3};
  EXPECT_THROW(oc::compare("o", ref, {3}, bad, {3}, "f32", 0.0), orthros::Error);  // non-finite reference
  try {  // named with what it holds and its index, not only a flat index
    oc::compare("lse", std::vector<double>(6, 1.0), {3, 2}, {1, 1, 1, std::nan(""), 1, 1}, {3, 2}, "f32", 0.0);
    ADD_FAILURE() << "a NaN reference must throw";
  } catch (const orthros::Error& e) {
    EXPECT_NE(std::string(e.what()).find("reference 'lse' holds NaN at [1, 1] (flat index 3"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(oc::compare("o", ref, {3}, ref, {3}, "int8", 0.0), orthros::Error);
}

TEST(CheckCompare, EmptyTensorPasses) {
  // T_out = 0 (a prefill chunk that is not the last): o_out is [0, H, D] and trivially agrees.
  std::vector<double> none;
  auto r = oc::compare("o_out", none, {0, 4, 16}, none, {0, 4, 16}, "f32", 0.0);
  EXPECT_TRUE(r.pass);
}

// Criterion 2 not applicable (no finite naive oracle at the dtype): the relative and NaN/Inf
// criteria still decide, and the report says why.
TEST(CheckCompare, AbsCriterionNotApplicableIsReportedAndOnlyRelativeDecides) {
  Rng rng(31);
  SCOPED_TRACE("seed=31");
  const std::vector<std::int64_t> shape{4, 2, 8};
  const auto ref = random_vec(64, rng);
  auto act = ref;
  act[9] += 1e-3 * frob(ref);  // rel err 1e-3 < 2e-3 (f16), but max abs far above 2*0 + 1e-6
  const auto na = oc::AbsBaseline::not_applicable("naive f16 oracle overflows: test");
  auto r = oc::compare("o", act, shape, ref, shape, "f16", na);
  EXPECT_TRUE(r.pass) << "rel " << r.rel_fro;
  EXPECT_FALSE(r.abs_applicable);
  EXPECT_EQ(r.abs_note, "n/a (naive f16 oracle overflows: test)");
  EXPECT_EQ(oc::abs_criterion_text(r), r.abs_note);
  EXPECT_TRUE(std::isinf(r.abs_tol));
  EXPECT_TRUE(std::isnan(r.oracle_at_dtype_maxabs));  // never a silent 0
  EXPECT_EQ(r.bad_row_count, 0);
  // The same error with a measured E_X of 0 fails on the abs criterion: the n/a changed the verdict.
  auto r0 = oc::compare("o", act, shape, ref, shape, "f16", 0.0);
  EXPECT_FALSE(r0.pass);
  EXPECT_FALSE(r0.pass_abs);
  EXPECT_TRUE(r0.pass_rel);
  // Relative criterion still fails a wrong answer ...
  auto big = ref;
  big[9] += 0.1 * frob(ref);
  auto rb = oc::compare("o", big, shape, ref, shape, "f16", na);
  EXPECT_FALSE(rb.pass);
  EXPECT_FALSE(rb.pass_rel);
  // ... and NaN/Inf never pass.
  auto nan = ref;
  nan[3] = std::numeric_limits<double>::quiet_NaN();
  auto rn = oc::compare("o", nan, shape, ref, shape, "f16", na);
  EXPECT_FALSE(rn.pass);
  EXPECT_FALSE(rn.pass_finite);
  EXPECT_EQ(rn.bad_rows, (std::vector<std::int64_t>{0}));
  // A missing baseline must say why; a measured one must be finite and >= 0.
  EXPECT_THROW(oc::AbsBaseline::not_applicable(""), orthros::Error);
  EXPECT_THROW(oc::AbsBaseline::of(std::nan("")), orthros::Error);
  EXPECT_THROW(oc::compare("o", act, shape, ref, shape, "f16", oc::AbsBaseline{}), orthros::Error);
}

// The oracle's overflow error (attention.hpp) is recognized; bad-input errors are not.
TEST(CheckCompare, OracleOverflowIsRecognized) {
  // F16 q, k all 300, D = 8: q.k*scale = 300*300*8/sqrt(8) = 254558 > 65504 (f16 max).
  const orthros::AttentionDims dims{4, 2, 8};
  Mat<Eigen::half> q = Mat<Eigen::half>::Constant(5, 32, Eigen::half(300)),
                   k = Mat<Eigen::half>::Constant(7, 16, Eigen::half(300)),
                   qo = Mat<Eigen::half>::Constant(3, 32, Eigen::half(300));
  Rng rng(32);
  SCOPED_TRACE("seed=32");
  Mat<Eigen::half> v = orthros::round_matrix<Eigen::half>(random_mat<double>(7, 16, rng));
  orthros::AttentionOptions opt;
  opt.window = 3;
  try {
    orthros::orthros_attention<Eigen::half>(q, k, v, qo, dims, opt);
    FAIL() << "the f16 oracle should overflow";
  } catch (const orthros::Error& e) {
    EXPECT_TRUE(oc::is_oracle_overflow(e)) << e.what();
    const auto b = oc::overflow_baseline("f16", e);
    EXPECT_FALSE(b.maxabs.has_value());
    EXPECT_EQ(b.why_na.rfind("naive f16 oracle overflows: scaled scores q.k*scale overflow f16", 0), 0u) << b.why_na;
  }
  opt.window = 0;
  try {
    orthros::orthros_attention<Eigen::half>(q, k, v, qo, dims, opt);
    FAIL() << "window 0 must throw";
  } catch (const orthros::Error& e) {
    EXPECT_FALSE(oc::is_oracle_overflow(e)) << e.what();
  }
}

// The backward's gradient-overflow error (attention_backward.hpp) is an oracle overflow too (the
// n/a rule applies to gradients), while its bad-input errors are not.
TEST(CheckCompare, GradientOverflowIsRecognized) {
  // f16: q, k small (the forward is finite), do = 60000 (finite in f16, max 65504) and |v| >= 0.05
  // in 8 dims: dP = do·v reaches several times 65504, so the naive f16 gradients are not finite.
  const orthros::AttentionDims dims{4, 2, 8};
  Rng rng(33);
  SCOPED_TRACE("seed=33");
  const auto q = random_mat<Eigen::half>(5, 32, rng), k = random_mat<Eigen::half>(7, 16, rng),
             v = random_mat<Eigen::half>(7, 16, rng), qo = random_mat<Eigen::half>(3, 32, rng),
             dqo = random_mat<Eigen::half>(3, 32, rng);
  const Mat<Eigen::half> big = Mat<Eigen::half>::Constant(5, 32, Eigen::half(60000));
  orthros::AttentionOptions opt;
  opt.window = 3;
  EXPECT_NO_THROW(orthros::orthros_attention<Eigen::half>(q, k, v, qo, dims, opt));
  try {
    orthros::orthros_attention_backward<Eigen::half>(q, k, v, qo, big, dqo, dims, opt);
    FAIL() << "the f16 gradients should overflow";
  } catch (const orthros::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(orthros::kGradientOverflowPrefix, 0), 0u) << e.what();
    EXPECT_TRUE(oc::is_oracle_overflow(e)) << e.what();
    const auto b = oc::overflow_baseline("f16", e);
    EXPECT_FALSE(b.maxabs.has_value());
    EXPECT_EQ(b.why_na.rfind("naive f16 oracle overflows: attention gradients overflow f16", 0), 0u) << b.why_na;
  }
  try {  // do with 4 rows for T = 5: bad input, not an overflow
    orthros::orthros_attention_backward<Eigen::half>(q, k, v, qo, big.topRows(4), dqo, dims, opt);
    FAIL() << "a do of the wrong shape must throw";
  } catch (const orthros::Error& e) {
    EXPECT_FALSE(oc::is_oracle_overflow(e)) << e.what();
  }
}

// The oracle's gradients at a kernel's own precision pass their own criterion (E_X measured on
// the same inputs), and a gradient computed with a window one too wide fails dk at rows whose
// key is seen by one more query. f64's E_X is 0.
template <typename S>
void oracle_grads_at_dtype_pass(std::uint64_t seed) {
  SCOPED_TRACE("seed=" + std::to_string(seed) + " dtype=" + orthros::dtype_name<S>());
  Rng rng(seed);
  const orthros::AttentionDims dims{6, 2, 16};
  const int T = 20, P = 4, T_out = 3;
  const Mat<S> q = random_mat<S>(T, 96, rng), k = random_mat<S>(P + T, 32, rng), v = random_mat<S>(P + T, 32, rng),
               qo = random_mat<S>(T_out, 96, rng), dout = random_mat<S>(T, 96, rng),
               dout_out = random_mat<S>(T_out, 96, rng);
  auto wide = [](const Mat<S>& m) -> Mat<double> { return m.template cast<double>(); };
  orthros::AttentionOptions opt;
  opt.window = 5;
  const auto ref = orthros::orthros_attention_backward<double>(wide(q), wide(k), wide(v), wide(qo), wide(dout),
                                                               wide(dout_out), dims, opt);
  const auto low = orthros::orthros_attention_backward<S>(q, k, v, qo, dout, dout_out, dims, opt);
  const std::string dt = orthros::dtype_name<S>();
  const std::pair<const char*, std::pair<const Mat<S>*, const Mat<double>*>> grads[] = {
      {"dq", {&low.dq, &ref.dq}}, {"dq_out", {&low.dq_out, &ref.dq_out}},
      {"dk", {&low.dk, &ref.dk}}, {"dv", {&low.dv, &ref.dv}}};
  for (const auto& [name, pr] : grads) {
    const int heads = (name[1] == 'k' || name[1] == 'v') ? 2 : 6;
    const double e_x = oc::max_abs_diff(*pr.first, *pr.second);
    const auto r = oc::compare(name, *pr.first, *pr.second, heads, 16, dt, e_x);
    EXPECT_TRUE(r.pass) << name << " rel " << r.rel_fro << " abs " << r.max_abs;
    if constexpr (std::is_same_v<S, double>) EXPECT_EQ(e_x, 0.0) << name;
    else EXPECT_GT(e_x, 0.0) << name << ": really a lower precision";
  }
}

TEST(CheckOracle, OracleGradientsAtF32Pass) { oracle_grads_at_dtype_pass<float>(34); }
TEST(CheckOracle, OracleGradientsAtBf16Pass) { oracle_grads_at_dtype_pass<Eigen::bfloat16>(35); }
TEST(CheckOracle, OracleGradientsAtF16Pass) { oracle_grads_at_dtype_pass<Eigen::half>(36); }
TEST(CheckOracle, OracleGradientsAtF64Pass) { oracle_grads_at_dtype_pass<double>(37); }

// A perturbed dk row of a float64 gradient is caught at exactly that row, with the other rows
// and gradients passing.
TEST(CheckCompare, PerturbedDkRowIsLocated) {
  Rng rng(38);
  SCOPED_TRACE("seed=38");
  const orthros::AttentionDims dims{4, 2, 8};
  const auto q = random_mat<double>(9, 32, rng), k = random_mat<double>(12, 16, rng), v = random_mat<double>(12, 16, rng),
             qo = random_mat<double>(4, 32, rng), dout = random_mat<double>(9, 32, rng),
             dout_out = random_mat<double>(4, 32, rng);
  orthros::AttentionOptions opt;
  opt.window = 3;
  const auto g = orthros::orthros_attention_backward<double>(q, k, v, qo, dout, dout_out, dims, opt);
  for (int row : {0, 7, 11}) {
    Mat<double> bad = g.dk;
    bad(row, 9) += 1e-3;  // KV head 1, dim 1
    const auto r = oc::compare("dk", bad, g.dk, 2, 8, "f64", 0.0);
    EXPECT_FALSE(r.pass) << row;
    EXPECT_EQ(r.bad_rows, (std::vector<std::int64_t>{row}));
    EXPECT_EQ(r.worst_index, (std::vector<std::int64_t>{row, 1, 1}));
  }
  EXPECT_TRUE(oc::compare("dk", g.dk, g.dk, 2, 8, "f64", 0.0).pass);
}

// The single narrowing rule (tensor.hpp round_rne): one rounding, directly from the double.
// 1 + 2^-8 is the midpoint of bf16 neighbours 1 and 1 + 2^-7; + 2^-30 puts x just above it, so
// the correct rounding is 1 + 2^-7 = 1.0078125. Through float32 (quantum 2^-23) the 2^-30 is lost,
// the midpoint ties to even and gives 1.0 (Eigen's cast). Likewise at f16: 1 + 2^-11 is the
// midpoint of 1 and 1 + 2^-10; + 2^-40 rounds up to 1 + 2^-10 = 1.0009765625.
TEST(CheckRounding, DirectRoundToNearestEvenFromDouble) {
  const double xb = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
  const double xh = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  EXPECT_EQ(static_cast<double>(orthros::round_rne<Eigen::bfloat16>(xb)), 1.0078125);
  EXPECT_EQ(static_cast<double>(orthros::round_rne<Eigen::half>(xh)), 1.0009765625);
  EXPECT_EQ(static_cast<double>(orthros::round_rne<Eigen::bfloat16>(-xb)), -1.0078125);
  // The double rounding this rule replaces (documents why the helper exists):
  EXPECT_EQ(static_cast<double>(static_cast<Eigen::bfloat16>(static_cast<float>(xb))), 1.0);
  EXPECT_EQ(static_cast<double>(static_cast<Eigen::half>(static_cast<float>(xh))), 1.0);
  // Exact midpoints still tie to even; overflow gives inf.
  EXPECT_EQ(static_cast<double>(orthros::round_rne<Eigen::bfloat16>(1.0 + std::ldexp(1.0, -8))), 1.0);
  EXPECT_EQ(static_cast<double>(orthros::round_rne<Eigen::half>(1.0 + 3 * std::ldexp(1.0, -11))), 1.001953125);
  EXPECT_TRUE(std::isinf(static_cast<double>(orthros::round_rne<Eigen::half>(65520.0))));
  EXPECT_EQ(static_cast<double>(orthros::round_rne<Eigen::half>(65519.0)), 65504.0);
  Mat<double> m(1, 3);
  m << xb, xh, -2.5;
  const Mat<Eigen::bfloat16> mb = orthros::round_matrix<Eigen::bfloat16>(m);
  const Mat<Eigen::half> mh = orthros::round_matrix<Eigen::half>(m);
  EXPECT_EQ(static_cast<double>(mb(0, 0)), 1.0078125);
  EXPECT_EQ(static_cast<double>(mh(0, 1)), 1.0009765625);
  EXPECT_EQ(static_cast<double>(mh(0, 2)), -2.5);
  EXPECT_EQ(mb.rows(), 1);
  EXPECT_EQ(mb.cols(), 3);
}

// The oracle run at a kernel's own precision passes its own criterion, for every dtype and for
// both outputs and LSEs: the criterion is never stricter than a naive implementation.
template <typename S>
void oracle_at_dtype_passes(std::uint64_t seed) {
  SCOPED_TRACE("seed=" + std::to_string(seed) + " dtype=" + orthros::dtype_name<S>());
  Rng rng(seed);
  const orthros::AttentionDims dims{8, 2, 32};
  const int T = 24, P = 5, T_out = 3;
  auto q = random_mat<double>(T, 8 * 32, rng), k = random_mat<double>(P + T, 2 * 32, rng),
       v = random_mat<double>(P + T, 2 * 32, rng), qo = random_mat<double>(T_out, 8 * 32, rng);
  // Round inputs to S, then widen: both oracles see identical inputs.
  Mat<S> qs = orthros::round_matrix<S>(q), ks = orthros::round_matrix<S>(k), vs = orthros::round_matrix<S>(v),
         qos = orthros::round_matrix<S>(qo);
  orthros::AttentionOptions opt;
  opt.window = 6;
  auto ref = orthros::orthros_attention<double>(qs.template cast<double>(), ks.template cast<double>(),
                                                vs.template cast<double>(), qos.template cast<double>(), dims, opt);
  auto low = orthros::orthros_attention<S>(qs, ks, vs, qos, dims, opt);
  const std::string dt = orthros::dtype_name<S>();
  auto ro = oc::compare("o", low.o, ref.o, 8, 32, dt, oc::max_abs_diff(low.o, ref.o));
  auto rl = oc::compare("lse", low.lse, ref.lse, 8, 1, dt, oc::max_abs_diff(low.lse, ref.lse));
  auto roo = oc::compare("o_out", low.o_out, ref.o_out, 8, 32, dt, oc::max_abs_diff(low.o_out, ref.o_out));
  EXPECT_TRUE(ro.pass) << "rel " << ro.rel_fro << " abs " << ro.max_abs;
  EXPECT_TRUE(rl.pass) << "rel " << rl.rel_fro << " abs " << rl.max_abs;
  EXPECT_TRUE(roo.pass) << "rel " << roo.rel_fro << " abs " << roo.max_abs;
  EXPECT_EQ(ro.shape, (std::vector<std::int64_t>{T, 8, 32}));
  EXPECT_EQ(rl.shape, (std::vector<std::int64_t>{T, 8}));
  if constexpr (!std::is_same_v<S, double>) {
    EXPECT_GT(ro.max_abs, 0.0);  // really a lower precision
  }
}

TEST(CheckOracle, OracleAtF32Passes) { oracle_at_dtype_passes<float>(21); }
TEST(CheckOracle, OracleAtBf16Passes) { oracle_at_dtype_passes<Eigen::bfloat16>(22); }
TEST(CheckOracle, OracleAtF16Passes) { oracle_at_dtype_passes<Eigen::half>(23); }
TEST(CheckOracle, OracleAtF64Passes) { oracle_at_dtype_passes<double>(24); }

// Property: a window that is one too wide (w+1 instead of w, the classic `(w, 0)` vs `(w-1, 0)`
// mistake) fails the f32 criterion, and the reported bad rows are exactly the rows that see an
// extra key: 0-based rows i with P + i >= w (absolute position t = P+i+1 > w).
RC_GTEST_PROP(CheckProperty, WindowOffByOneIsCaughtAtTheRightRows, ()) {
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  const int w = *rc::gen::inRange(1, 9);
  const int T = *rc::gen::inRange(1, 24);
  const int P = *rc::gen::inRange(0, 6);
  const int Hkv = *rc::gen::element(1, 2);
  const int Hq = Hkv * *rc::gen::element(1, 3);
  const int D = *rc::gen::element(4, 8);
  Rng rng(seed);
  const orthros::AttentionDims dims{Hq, Hkv, D};
  auto q = random_mat<double>(T, Hq * D, rng), k = random_mat<double>(P + T, Hkv * D, rng),
       v = random_mat<double>(P + T, Hkv * D, rng), qo = random_mat<double>(1, Hq * D, rng);
  orthros::AttentionOptions good, bad;
  good.window = w;
  bad.window = w + 1;
  auto ref = orthros::orthros_attention<double>(q, k, v, qo, dims, good);
  auto wrong = orthros::orthros_attention<double>(q, k, v, qo, dims, bad);
  auto r = oc::compare("o", wrong.o, ref.o, Hq, D, "f32", 0.0);
  std::vector<std::int64_t> expect;
  for (int i = 0; i < T; ++i)
    if (P + i >= w) expect.push_back(i);
  // Every bad row, however many, as one run of consecutive rows [max(0, w-P), T-1].
  std::vector<std::pair<std::int64_t, std::int64_t>> runs;
  if (!expect.empty()) runs.emplace_back(expect.front(), expect.back());
  RC_ASSERT(r.bad_row_ranges == runs);
  RC_ASSERT(r.bad_row_count == static_cast<std::int64_t>(expect.size()));
  if (expect.size() > oc::kMaxBadRows) expect.resize(oc::kMaxBadRows);
  RC_ASSERT(r.bad_rows == expect);
  RC_ASSERT(r.pass == expect.empty());
  // Output queries have full attention: the window does not touch them.
  auto ro = oc::compare("o_out", wrong.o_out, ref.o_out, Hq, D, "f32", 0.0);
  RC_ASSERT(ro.pass);
}

// Property: compare(x, x) passes with zero error for any shape and dtype tolerance.
RC_GTEST_PROP(CheckProperty, SelfComparisonAlwaysPasses, ()) {
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  const int a = *rc::gen::inRange(0, 7), b = *rc::gen::inRange(1, 5), c = *rc::gen::inRange(1, 9);
  const std::string dt = *rc::gen::element<std::string>("f64", "f32", "bf16", "f16");
  Rng rng(seed);
  auto x = random_vec(static_cast<std::size_t>(a * b * c), rng);
  auto r = oc::compare("o", x, {a, b, c}, x, {a, b, c}, dt, 0.0);
  RC_ASSERT(r.pass);
  RC_ASSERT(r.max_abs == 0.0);
  RC_ASSERT(r.rel_fro == 0.0);
}

// An exactly-zero reference (structural zeros of the backward: dq with w = 1, gradients of a
// one-key row) has no relative scale: criterion 1 is n/a and the max-abs bound judges. Rounding
// noise below 2·E_X + 1e-6 passes; noise above it fails; NaN still fails.
TEST(CheckCompare, ExactlyZeroReferenceIsJudgedByTheAbsBound) {
  const std::vector<std::int64_t> shape{3, 2, 4};
  const std::vector<double> ref(24, 0.0);
  std::vector<double> act(24, 0.0);
  act[5] = 2.4e-7;  // the size of the noise PyTorch's autograd leaves on such a tensor (H200 run)
  auto r = oc::compare("dq", act, shape, ref, shape, "bf16", 0.0);
  EXPECT_FALSE(r.rel_applicable);
  EXPECT_NE(r.rel_note.find("exactly zero"), std::string::npos);
  EXPECT_TRUE(std::isinf(r.rel_fro));
  EXPECT_TRUE(r.pass_rel && r.pass_abs && r.pass) << r.max_abs;
  act[5] = 3e-6;  // over 2*0 + 1e-6
  r = oc::compare("dq", act, shape, ref, shape, "bf16", 0.0);
  EXPECT_FALSE(r.pass_abs);
  EXPECT_FALSE(r.pass);
  ASSERT_EQ(r.bad_rows.size(), 1u);
  EXPECT_EQ(r.bad_rows[0], 0);
  act[5] = std::numeric_limits<double>::quiet_NaN();
  r = oc::compare("dq", act, shape, ref, shape, "bf16", 0.0);
  EXPECT_FALSE(r.pass);
  // A non-zero reference keeps criterion 1.
  std::vector<double> ref2 = ref;
  ref2[0] = 1.0;
  r = oc::compare("dq", ref2, shape, ref2, shape, "bf16", 0.0);
  EXPECT_TRUE(r.rel_applicable);
}

// Bad rows are reported as runs of consecutive rows, all of them: rows 3..174 and 190 of a
// [200, 2, 4] tensor (173 rows) give the runs {3, 174} and {190, 190}, while bad_rows keeps its
// first kMaxBadRows rows and bad_row_count the total.
TEST(CheckReport, BadRowsAreRunsOfConsecutiveRows) {
  Rng rng(20261202);
  const std::vector<std::int64_t> shape{200, 2, 4};
  const std::vector<double> ref = random_vec(200 * 8, rng);
  std::vector<double> out = ref;
  auto spoil = [&](std::int64_t row) { out[static_cast<std::size_t>(row * 8 + 5)] += 0.5; };
  for (std::int64_t row = 3; row <= 174; ++row) spoil(row);
  spoil(190);
  const oc::TensorReport r = oc::compare("o", out, shape, ref, shape, "f32", 1e-7);
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.bad_row_count, 173);
  EXPECT_EQ(r.bad_row_ranges, (std::vector<std::pair<std::int64_t, std::int64_t>>{{3, 174}, {190, 190}}));
  ASSERT_EQ(r.bad_rows.size(), oc::kMaxBadRows);
  EXPECT_EQ(r.bad_rows.front(), 3);
  EXPECT_EQ(r.bad_rows.back(), 3 + static_cast<std::int64_t>(oc::kMaxBadRows) - 1);
  const oc::TensorReport same = oc::compare("o", ref, shape, ref, shape, "f32", 1e-7);
  EXPECT_TRUE(same.bad_row_ranges.empty());
}
