// Tests of verify/kit/include/orthros/portkit.hpp's gradient cases: the expected files of `orthros golden --grad`
// (float64 gradients + E_X per gradient), the per-case "grad" flag of a --grad suite, and non-finite
// values named by tensor and first index.
#include "orthros/layer_suite.hpp"
#include "orthros/portkit.hpp"

#include "expected_cases.hpp"
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
using orthros::portkit_testing::grad_case;
using orthros::portkit_testing::small_layer_case;

// ---- gradients: `orthros golden --grad` cases and their expected files ----

namespace {

/// The float64 gradients of a case, computed here directly with the oracle (not through portkit).
orthros::AttentionGrads<double> direct_grads(const orthros::st::File& cf) {
  const auto c = orthros::load_attention_case<double>(cf);
  const auto dout = orthros::st::to_matrix<double>(cf.tensors.at("do"), "do");
  const auto dout_out = orthros::st::to_matrix<double>(cf.tensors.at("do_out"), "do_out");
  return orthros::orthros_attention_backward<double>(c.q, c.k, c.v, c.q_out, dout, dout_out, c.dims, c.options);
}

const Mat<double>& grad_of(const orthros::AttentionGrads<double>& g, const std::string& n) {
  return n == "dq" ? g.dq : n == "dq_out" ? g.dq_out : n == "dk" ? g.dk : g.dv;
}

}  // namespace

TEST(PortkitExpectedGrad, GradientsAreTheOracleBitwiseWithShapesAndPerTensorEx) {
  for (auto [dt, name] : {std::pair{orthros::st::DType::BF16, "bf16"}, std::pair{orthros::st::DType::F64, "f64"}}) {
    const std::uint64_t seed = 51;
    SCOPED_TRACE(std::string("seed=51 dtype=") + name);
    const auto cf = grad_case(seed, dt);
    const pk::Expected e = pk::compute_expected(cf, name);
    ASSERT_TRUE(e.grad);
    EXPECT_EQ(e.names(), (std::vector<std::string>{"o", "o_out", "lse", "lse_out", "dq", "dq_out", "dk", "dv"}));
    const auto g = direct_grads(cf);
    const std::map<std::string, std::vector<std::int64_t>> shapes{
        {"dq", {9, 4, 8}}, {"dq_out", {4, 4, 8}}, {"dk", {12, 2, 8}}, {"dv", {12, 2, 8}}};
    for (const char* n : pk::grad_names()) {
      const auto& t = e.file.tensors.at(n);
      EXPECT_EQ(t.dtype, orthros::st::DType::F64) << n;
      EXPECT_EQ(t.shape, shapes.at(n)) << n;
      EXPECT_EQ(pk::values(t), oc::to_f64(grad_of(g, n))) << n << ": expected gradients must be the f64 oracle bitwise";
      const auto& b = e.oracle_err.at(n);
      ASSERT_TRUE(b.maxabs.has_value()) << n;
      if (dt == orthros::st::DType::F64) {
        EXPECT_EQ(*b.maxabs, 0.0) << n << ": at f64 the oracle is the reference";
      } else {
        EXPECT_GT(*b.maxabs, 0.0) << n << ": the bf16 backward really rounds";
      }
      EXPECT_EQ(e.file.metadata.at(pk::err_key(n)), pk::fmt17(*b.maxabs)) << n;
    }
    // Written and read back: the same tensors and E_X, and `grad` detected from the tensors.
    const pk::Expected back = pk::load_expected(orthros::st::parse(orthros::st::serialize(e.file)));
    ASSERT_TRUE(back.grad);
    for (const char* n : pk::grad_names()) {
      EXPECT_EQ(*back.oracle_err.at(n).maxabs, *e.oracle_err.at(n).maxabs) << n;
      EXPECT_EQ(pk::values(back.file.tensors.at(n)), pk::values(e.file.tensors.at(n))) << n;
    }
  }
}

TEST(PortkitExpectedGrad, ForwardOnlyCaseHasNoGradients) {
  SCOPED_TRACE("seed=52");
  auto cf = grad_case(52, orthros::st::DType::F32);
  cf.tensors.erase("do");
  cf.tensors.erase("do_out");
  const pk::Expected e = pk::compute_expected(cf, "f32");
  EXPECT_FALSE(e.grad);
  for (const char* n : pk::grad_names()) {
    EXPECT_EQ(e.file.tensors.count(n), 0u) << n;
    EXPECT_EQ(e.file.metadata.count(pk::err_key(n)), 0u) << n;
  }
  EXPECT_FALSE(pk::load_expected(e.file).grad);
}

TEST(PortkitExpectedGrad, BadUpstreamAndIncompleteExpectedFilesAreRejected) {
  SCOPED_TRACE("seed=53");
  const auto cf = grad_case(53, orthros::st::DType::F32);
  auto only_do = cf;
  only_do.tensors.erase("do_out");
  try {
    pk::compute_expected(only_do, "f32");
    FAIL() << "a case with do but no do_out must be rejected";
  } catch (const orthros::Error& err) {
    EXPECT_NE(std::string(err.what()).find("do_out"), std::string::npos) << err.what();
  }
  auto bad_shape = cf;
  bad_shape.tensors["do"] = orthros::st::from_matrix<double>(Mat<double>::Constant(8, 32, 0.5), {8, 4, 8},
                                                             orthros::st::DType::F32);
  try {
    pk::compute_expected(bad_shape, "f32");
    FAIL() << "do with 8 rows for T = 9 must be rejected";
  } catch (const orthros::Error& err) {
    const std::string w = err.what();
    EXPECT_NE(w.find("\"do\" must be [T, H_q, D] = [9, 4, 8]"), std::string::npos) << w;
    EXPECT_NE(w.find("[8, 4, 8]"), std::string::npos) << w;
  }
  const pk::Expected e = pk::compute_expected(cf, "f32");
  for (const char* n : pk::grad_names()) {  // an expected file with 3 of the 4 gradients
    auto f = e.file;
    f.tensors.erase(n);
    try {
      pk::load_expected(f);
      FAIL() << "expected file without " << n << " must be rejected";
    } catch (const orthros::Error& err) {
      EXPECT_NE(std::string(err.what()).find(std::string("\"") + n + "\""), std::string::npos) << err.what();
    }
    f = e.file;
    f.metadata.erase(pk::err_key(n));
    EXPECT_THROW(pk::load_expected(f), orthros::Error) << n;
  }
}

// A backward that overflows f16 while the forward does not: do = 60000 (finite in f16, max 65504)
// and |v| >= 0.05 make dP_j = do·v_j of order 60000 * 8 * 0.5 > 65504, so the naive f16 backward
// has no finite gradients; the forward's E_X stay measured and only the gradients' are n/a.
TEST(PortkitExpectedGrad, F16GradientOverflowMakesOnlyGradientCriterionNotApplicable) {
  SCOPED_TRACE("seed=54");
  auto cf = grad_case(54, orthros::st::DType::F16);
  cf.tensors["do"] = orthros::st::from_matrix<double>(Mat<double>::Constant(9, 32, 60000.0), {9, 4, 8},
                                                      orthros::st::DType::F16);
  const pk::Expected e = pk::compute_expected(cf, "f16");
  ASSERT_TRUE(e.grad);
  for (const char* n : pk::output_names()) EXPECT_TRUE(e.oracle_err.at(n).maxabs.has_value()) << n;
  for (const char* n : pk::grad_names()) {
    const auto& b = e.oracle_err.at(n);
    EXPECT_FALSE(b.maxabs.has_value()) << n;
    EXPECT_EQ(b.why_na.rfind(std::string("naive f16 oracle overflows: ") + orthros::kGradientOverflowPrefix, 0), 0u)
        << b.why_na;
    EXPECT_EQ(e.file.metadata.at(pk::err_key(n)), "n/a") << n;
  }
  EXPECT_EQ(e.file.metadata.at("abs_criterion"), "n/a (" + e.oracle_err.at("dq").why_na + ")");
  const pk::Expected back = pk::load_expected(orthros::st::parse(orthros::st::serialize(e.file)));
  for (const char* n : pk::output_names()) EXPECT_TRUE(back.oracle_err.at(n).maxabs.has_value()) << n;
  for (const char* n : pk::grad_names()) {
    EXPECT_FALSE(back.oracle_err.at(n).maxabs.has_value()) << n;
    // The exact gradients (stored as F32: they exceed f16) pass on the relative criterion ...
    const auto& ref = e.file.tensors.at(n);
    auto as_f32 = orthros::st::from_matrix<double>(orthros::st::to_matrix<double>(ref, n), ref.shape,
                                                   orthros::st::DType::F32);
    auto r = oc::compare(n, pk::values(as_f32), ref.shape, pk::values(ref), ref.shape, "f16", back.oracle_err.at(n));
    EXPECT_TRUE(r.pass) << n << " rel " << r.rel_fro;
    EXPECT_FALSE(r.abs_applicable) << n;
    // ... and a gradient off by 10 % in one row still fails it.
    auto vals = pk::values(ref);
    const std::int64_t per_row = ref.shape[1] * ref.shape[2];
    double all2 = 0;  // rel err of adding c to every element of row 1: c*sqrt(per_row)/||ref|| = 0.1
    for (double x : vals) all2 += x * x;
    const double c = 0.1 * std::sqrt(all2 / static_cast<double>(per_row));
    for (std::int64_t i = 0; i < per_row; ++i) vals[per_row + i] += c;
    auto bad = oc::compare(n, vals, ref.shape, pk::values(ref), ref.shape, "f16", back.oracle_err.at(n));
    EXPECT_FALSE(bad.pass_rel) << n << " rel " << bad.rel_fro;
    EXPECT_NEAR(bad.rel_fro, 0.1, 1e-9) << n;
  }
}

TEST(PortkitExpectedGrad, RowPositionsOfEveryTensor) {
  // P = 3, T = 9, T_out = 4: base row 0 is position 4, output row 0 is position 9, cache row 0 is 1.
  for (const char* n : {"o", "lse", "dq"}) EXPECT_EQ(pk::row_position(n, 2, 3, 9, 4), 6) << n;
  for (const char* n : {"o_out", "lse_out", "dq_out"}) EXPECT_EQ(pk::row_position(n, 2, 3, 9, 4), 11) << n;
  for (const char* n : {"dk", "dv"}) EXPECT_EQ(pk::row_position(n, 2, 3, 9, 4), 3) << n;
}

// The bf16 oracle's gradients, as a port's result, pass their own criterion; a perturbed dk row
// is caught at exactly that row (cache row r = position r+1).
TEST(PortkitExpectedGrad, OracleAtBf16PassesAndPerturbedDkRowIsCaught) {
  const std::uint64_t seed = 55;
  SCOPED_TRACE("seed=55");
  const auto cf = grad_case(seed, orthros::st::DType::BF16);
  const pk::Expected e = pk::compute_expected(cf, "bf16");
  const auto c = orthros::load_attention_case<Eigen::bfloat16>(cf);
  const auto g = orthros::orthros_attention_backward<Eigen::bfloat16>(
      c.q, c.k, c.v, c.q_out, orthros::st::to_matrix<Eigen::bfloat16>(cf.tensors.at("do"), "do"),
      orthros::st::to_matrix<Eigen::bfloat16>(cf.tensors.at("do_out"), "do_out"), c.dims, c.options);
  const std::map<std::string, const Mat<Eigen::bfloat16>*> port{{"dq", &g.dq}, {"dq_out", &g.dq_out}, {"dk", &g.dk}, {"dv", &g.dv}};
  for (const char* n : pk::grad_names()) {
    const auto& ref = e.file.tensors.at(n);
    auto r = oc::compare(n, oc::to_f64(*port.at(n)), ref.shape, pk::values(ref), ref.shape, "bf16", e.oracle_err.at(n));
    EXPECT_TRUE(r.pass) << n << " rel " << r.rel_fro << " abs " << r.max_abs << " tol " << r.abs_tol;
  }
  const auto& ref = e.file.tensors.at("dk");
  auto vals = oc::to_f64(g.dk);
  const std::int64_t row = 5, per_row = ref.shape[1] * ref.shape[2];
  const double tol = oc::abs_tolerance(*e.oracle_err.at("dk").maxabs);
  vals[row * per_row + 3] += 4 * tol;  // one element of cache row 5, well over the bound
  auto r = oc::compare("dk", vals, ref.shape, pk::values(ref), ref.shape, "bf16", e.oracle_err.at("dk"));
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.bad_rows, (std::vector<std::int64_t>{row}));
  EXPECT_EQ(pk::row_position("dk", r.bad_rows[0], 3, 9, 4), row + 1);
}

// ---- per-case "grad" of a --grad suite (edge_large_logits is forward-only there) ----

TEST(PortkitSuiteGrad, PerCaseFlagDecidesAndMustMatchTheExpectedFile) {
  // A --grad suite marks every case: true needs gradients, false is a forward-only case.
  EXPECT_TRUE(pk::suite_case_grad(true, true, true));
  EXPECT_FALSE(pk::suite_case_grad(true, false, false));  // edge_large_logits: judged on o, o_out, lse, lse_out
  try {
    pk::suite_case_grad(true, true, false);
    FAIL() << "\"grad\": true for a case whose expected file has no gradients must be an error";
  } catch (const orthros::Error& err) {
    EXPECT_NE(std::string(err.what()).find("\"grad\": true for this case but its expected file has no gradients"),
              std::string::npos)
        << err.what();
  }
  try {
    pk::suite_case_grad(true, false, true);
    FAIL() << "\"grad\": false for a case whose expected file holds gradients must be an error";
  } catch (const orthros::Error& err) {
    EXPECT_NE(std::string(err.what()).find("\"grad\": false for this case (forward only)"), std::string::npos)
        << err.what();
  }
  // A per-case flag wins over the suite's, whatever the top level says.
  EXPECT_FALSE(pk::suite_case_grad(std::nullopt, false, false));
  EXPECT_TRUE(pk::suite_case_grad(false, true, true));
}

TEST(PortkitSuiteGrad, WithoutPerCaseFlagTheSuiteFlagOrTheFileDecides) {
  // A --grad suite written before per-case flags: every expected file needs gradients.
  EXPECT_TRUE(pk::suite_case_grad(true, std::nullopt, true));
  EXPECT_THROW(pk::suite_case_grad(true, std::nullopt, false), orthros::Error);
  // A forward-only suite (no "grad", or false): judged on what the expected file holds.
  EXPECT_FALSE(pk::suite_case_grad(std::nullopt, std::nullopt, false));
  EXPECT_TRUE(pk::suite_case_grad(std::nullopt, std::nullopt, true));
  EXPECT_FALSE(pk::suite_case_grad(false, std::nullopt, false));
}

// A case without do/do_out in a --grad suite (the forward-only edge_large_logits): its expected
// file has no gradients, the suite's per-case "grad": false accepts it, and a port's result with
// only the forward tensors is judged on exactly those four.
TEST(PortkitSuiteGrad, ForwardOnlyCaseOfAGradSuiteIsJudgedOnTheForwardOnly) {
  SCOPED_TRACE("seed=56");
  auto cf = grad_case(56, orthros::st::DType::BF16);
  cf.tensors.erase("do");
  cf.tensors.erase("do_out");
  const pk::Expected e = pk::load_expected(orthros::st::parse(orthros::st::serialize(pk::compute_expected(cf, "bf16").file)));
  ASSERT_FALSE(pk::suite_case_grad(true, false, e.grad));
  EXPECT_EQ(e.names(), (std::vector<std::string>{"o", "o_out", "lse", "lse_out"}));
  const auto c = orthros::load_attention_case<Eigen::bfloat16>(cf);
  const auto r = orthros::orthros_attention<Eigen::bfloat16>(c.q, c.k, c.v, c.q_out, c.dims, c.options);
  const std::map<std::string, std::vector<double>> port{
      {"o", oc::to_f64(r.o)}, {"o_out", oc::to_f64(r.o_out)}, {"lse", oc::to_f64(r.lse)}, {"lse_out", oc::to_f64(r.lse_out)}};
  for (const std::string& n : e.names()) {
    const auto& ref = e.file.tensors.at(n);
    auto rep = oc::compare(n, port.at(n), ref.shape, pk::values(ref), ref.shape, "bf16", e.oracle_err.at(n));
    EXPECT_TRUE(rep.pass) << n << " rel " << rep.rel_fro;
  }
}

namespace {

/// `f` with element [row, col] of tensor `n` (Mat layout [shape[0], rest]) set to `x`, same dtype and shape.
orthros::st::File with_value(orthros::st::File f, const std::string& n, Eigen::Index row, Eigen::Index col, double x) {
  orthros::st::Tensor& t = f.tensors.at(n);
  Mat<double> m = orthros::st::to_matrix<double>(t, n);
  m(row, col) = x;
  t = orthros::st::from_matrix<double>(m, t.shape, t.dtype);
  return f;
}

}  // namespace

// A NaN/Inf in a case's inputs, weights, upstream gradients or an expected file's LSE is named as
// that tensor with its first index (not as a derived tensor, a flat index or a gradient overflow).
TEST(PortkitNonFinite, NamedWithTheTensorWhatItHoldsAndTheFirstIndex) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  SCOPED_TRACE("seed=81");
  const auto lc = small_layer_case(81, true, 2, 4, 1, orthros::st::DType::F32);
  auto layer_error = [](const orthros::st::File& f) { return error_message([&] { pk::compute_layer_expected(f, "bf16"); }); };
  auto twice = with_value(with_value(lc, "w_q", 3, 17, nan), "w_q", 5, 0, nan);
  EXPECT_NE(layer_error(twice).find("layer case: tensor \"w_q\" holds NaN at [3, 17] (the first of 2 non-finite values"),
            std::string::npos) << layer_error(twice);
  EXPECT_NE(layer_error(with_value(lc, "k_cache", 1, 10, inf)).find("tensor \"k_cache\" holds inf at [1, 1, 2]"),
            std::string::npos) << layer_error(with_value(lc, "k_cache", 1, 10, inf));
  EXPECT_NE(layer_error(with_value(lc, "alpha_out", 7, 0, -inf)).find("tensor \"alpha_out\" holds -inf at [7]"),
            std::string::npos) << layer_error(with_value(lc, "alpha_out", 7, 0, -inf));
  EXPECT_NE(layer_error(with_value(lc, "q_norm", 2, 0, nan)).find("tensor \"q_norm\" holds NaN at [2]"),
            std::string::npos) << layer_error(with_value(lc, "q_norm", 2, 0, nan));
  EXPECT_NE(layer_error(with_value(lc, "x", 0, 11, nan)).find("tensor \"x\" holds NaN at [0, 11]"), std::string::npos);

  SCOPED_TRACE("seed=82");
  const auto cf = grad_case(82, orthros::st::DType::BF16);
  auto op_error = [](const orthros::st::File& f) { return error_message([&] { pk::compute_expected(f, "bf16"); }); };
  EXPECT_NE(op_error(with_value(cf, "q", 2, 13, nan)).find("tensor \"q\" holds NaN at [2, 1, 5] (the first of 1 "
                                                           "non-finite value; case inputs must be finite)"),
            std::string::npos) << op_error(with_value(cf, "q", 2, 13, nan));
  EXPECT_NE(op_error(with_value(cf, "v", 11, 15, inf)).find("tensor \"v\" holds inf at [11, 1, 7]"), std::string::npos);
  EXPECT_NE(op_error(with_value(cf, "do_out", 3, 0, nan)).find("tensor \"do_out\" holds NaN at [3, 0, 0]"),
            std::string::npos) << op_error(with_value(cf, "do_out", 3, 0, nan));

  // An expected file whose LSE holds NaN: named at load, with its [t, h] index.
  const pk::Expected e = pk::compute_expected(cf, "bf16");
  const std::string lse = error_message([&] { pk::load_expected(with_value(e.file, "lse", 2, 1, nan)); });
  EXPECT_NE(lse.find("expected tensor \"lse\" holds NaN at [2, 1] (the first of 1 non-finite value; the oracle's "
                     "expected results are always finite: the file is damaged)"),
            std::string::npos) << lse;
  const std::string dk = error_message([&] { pk::load_expected(with_value(e.file, "dk", 0, 3, -inf)); });
  EXPECT_NE(dk.find("expected tensor \"dk\" holds -inf at [0, 0, 3]"), std::string::npos) << dk;
}
