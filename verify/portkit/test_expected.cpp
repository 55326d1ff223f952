// Tests of verify/kit/include/orthros/portkit.hpp: the expected results of a case (float64 oracle + E_X per
// tensor) as `orthros golden` writes them and `orthros check` reads them, including the case where
// the naive oracle at the port's dtype overflows and the max-abs criterion is not applicable.
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

namespace {

const orthros::AttentionDims kDims{4, 2, 8};  // H_q = 4, H_kv = 2, D = 8

/// The reviewer's repro: F16 q, k, q_out all 300, random v; T = 5, P = 2, T_out = 3, w = 3.
/// Scores q.k*scale = 300*300*8/sqrt(8) = 254558 > 65504: the f16 oracle has no finite answer.
orthros::st::File overflow_case(std::uint64_t seed) {
  Rng rng(seed);
  const Mat<double> q = Mat<double>::Constant(5, 32, 300.0), k = Mat<double>::Constant(7, 16, 300.0),
                    qo = Mat<double>::Constant(3, 32, 300.0), v = random_mat<double>(7, 16, rng);
  orthros::AttentionOptions opt;
  opt.window = 3;
  return orthros::make_attention_case<double>(q, k, v, qo, kDims, opt, orthros::st::DType::F16);
}

/// A port's result on `case_file` computed by the float64 oracle with `window`, outputs stored
/// as F16 (o, o_out) and F32 (lse, lse_out: 254558 does not fit f16), checked with `e`.
std::vector<oc::TensorReport> check_port(const orthros::st::File& case_file, const pk::Expected& e,
                                         std::int64_t window) {
  auto c = orthros::load_attention_case<double>(case_file);
  c.options.window = window;
  const auto r = orthros::orthros_attention<double>(c.q, c.k, c.v, c.q_out, c.dims, c.options);
  orthros::st::File port;
  port.tensors["o"] = orthros::st::from_matrix<double>(r.o, {r.o.rows(), 4, 8}, orthros::st::DType::F16);
  port.tensors["o_out"] = orthros::st::from_matrix<double>(r.o_out, {r.o_out.rows(), 4, 8}, orthros::st::DType::F16);
  port.tensors["lse"] = orthros::st::from_matrix<double>(r.lse, {r.lse.rows(), 4}, orthros::st::DType::F32);
  port.tensors["lse_out"] = orthros::st::from_matrix<double>(r.lse_out, {r.lse_out.rows(), 4}, orthros::st::DType::F32);
  std::vector<oc::TensorReport> out;
  for (const char* n : pk::output_names())
    out.push_back(oc::compare(n, pk::values(port.tensors.at(n)), port.tensors.at(n).shape,
                              pk::values(e.file.tensors.at(n)), e.file.tensors.at(n).shape, e.dtype,
                              e.oracle_err.at(n)));
  return out;
}

}  // namespace

TEST(PortkitExpected, F16OracleOverflowMakesAbsCriterionNotApplicable) {
  SCOPED_TRACE("seed=41");
  const auto cf = overflow_case(41);
  const pk::Expected e = pk::compute_expected(cf, "f16");
  for (const char* n : pk::output_names()) {
    const auto& b = e.oracle_err.at(n);
    EXPECT_FALSE(b.maxabs.has_value()) << n << ": a missing E_X must not become a number";
    EXPECT_EQ(b.why_na.rfind("naive f16 oracle overflows: scaled scores q.k*scale overflow f16", 0), 0u) << b.why_na;
    EXPECT_EQ(e.file.metadata.at(pk::err_key(n)), "n/a");
  }
  EXPECT_EQ(e.file.metadata.at("abs_criterion"), "n/a (" + e.oracle_err.at("o").why_na + ")");
  // Written and read back (golden -> check --expected): the same n/a baselines.
  const pk::Expected back = pk::load_expected(orthros::st::parse(orthros::st::serialize(e.file)));
  for (const char* n : pk::output_names()) {
    EXPECT_FALSE(back.oracle_err.at(n).maxabs.has_value()) << n;
    EXPECT_EQ(back.oracle_err.at(n).why_na, e.oracle_err.at(n).why_na) << n;
  }
  // The exact answer rounded to f16 passes (rel err ~2e-4), the n/a noted in every report ...
  for (const auto& r : check_port(cf, back, 3)) {
    EXPECT_TRUE(r.pass) << r.name << " rel " << r.rel_fro << " max_abs " << r.max_abs;
    EXPECT_FALSE(r.abs_applicable) << r.name;
    EXPECT_EQ(r.abs_note.rfind("n/a (naive f16 oracle overflows: ", 0), 0u) << r.abs_note;
  }
  // ... and a window off by one still fails, by the relative criterion on o.
  const auto wrong = check_port(cf, back, 4);
  EXPECT_FALSE(wrong[0].pass);
  EXPECT_FALSE(wrong[0].pass_rel) << "rel " << wrong[0].rel_fro;
}

TEST(PortkitExpected, MeasuredBaselinesRoundTrip) {
  Rng rng(42);
  SCOPED_TRACE("seed=42");
  orthros::AttentionOptions opt;
  opt.window = 3;
  const auto cf = orthros::make_attention_case<double>(random_mat<double>(5, 32, rng), random_mat<double>(7, 16, rng),
                                                       random_mat<double>(7, 16, rng), random_mat<double>(3, 32, rng),
                                                       kDims, opt, orthros::st::DType::F16);
  const pk::Expected e = pk::compute_expected(cf, "f16");
  EXPECT_EQ(e.file.metadata.count("abs_criterion"), 0u);
  const pk::Expected back = pk::load_expected(orthros::st::parse(orthros::st::serialize(e.file)));
  for (const char* n : pk::output_names()) {
    ASSERT_TRUE(e.oracle_err.at(n).maxabs.has_value()) << n;
    EXPECT_EQ(*back.oracle_err.at(n).maxabs, *e.oracle_err.at(n).maxabs) << n;  // %.17g reads back exactly
  }
  EXPECT_GT(*e.oracle_err.at("o").maxabs, 0.0);  // f16 really rounds
}

TEST(PortkitExpected, NotApplicableWithoutReasonIsRejected) {
  pk::Expected e = pk::compute_expected(overflow_case(43), "f16");
  orthros::st::File f = e.file;
  f.metadata.erase("abs_criterion");
  EXPECT_THROW(pk::load_expected(f), orthros::Error);
  f.metadata["abs_criterion"] = "n/a ()";
  EXPECT_THROW(pk::load_expected(f), orthros::Error);
  f = e.file;
  f.metadata[pk::err_key("o")] = "-1";
  EXPECT_THROW(pk::load_expected(f), orthros::Error);
}

// ---- gradients (issue 8): `orthros golden --grad` cases and their expected files ----

namespace {

/// A gradient case: random q, k, v, q_out and upstream gradients do, do_out, all stored in `dt`.
/// T = 9, P = 3, T_out = 4, w = 3, H_q = 4, H_kv = 2, D = 8 (so dk/dv have P+T = 12 rows and the
/// first cache rows are seen only by the output stream).
orthros::st::File grad_case(std::uint64_t seed, orthros::st::DType dt, double do_amp = 1.0) {
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

// ---- layer cases (issue 11; layer_suite.hpp) ----

namespace {

/// A small layer case: H_q 4, H_kv 2, D 8, d_model 12, P cached rows, T base and T_out output
/// tokens; seeded, never zero; alpha/alpha' away from 1, beta/beta' away from 0.
orthros::st::File small_layer_case(std::uint64_t seed, bool qk_norm, std::int64_t P, std::int64_t T,
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

}  // namespace

TEST(PortkitLayer, ExpectedIsTheLayerOracleAndRoundTrips) {
  SCOPED_TRACE("seed=71");
  const auto cf = small_layer_case(71, true, 5, 7, 3, orthros::st::DType::F64);
  ASSERT_TRUE(pk::is_layer_case(cf));
  const pk::Expected e = pk::compute_layer_expected(cf, "f64");
  EXPECT_TRUE(e.layer);
  EXPECT_EQ(e.names(), (std::vector<std::string>{"y", "y_out", "k_cache_after", "v_cache_after"}));
  EXPECT_EQ(e.file.tensors.at("y").shape, (std::vector<std::int64_t>{7, 12}));
  EXPECT_EQ(e.file.tensors.at("y_out").shape, (std::vector<std::int64_t>{3, 12}));
  EXPECT_EQ(e.file.tensors.at("k_cache_after").shape, (std::vector<std::int64_t>{12, 2, 8}));
  // the same numbers as calling the layer directly
  auto c = pk::load_layer_case<double>(cf);
  orthros::KVCache<double> cache = c.cache;
  const auto y = orthros::orthros_attention_layer<double>(c.w, c.cfg, c.x, c.x_out, cache);
  EXPECT_EQ(pk::values(e.file.tensors.at("y_out")), std::vector<double>(y.second.data(), y.second.data() + y.second.size()));
  EXPECT_EQ(pk::values(e.file.tensors.at("v_cache_after")), std::vector<double>(cache.v.data(), cache.v.data() + cache.v.size()));
  for (const auto& n : e.names()) EXPECT_EQ(*e.oracle_err.at(n).maxabs, 0.0) << n;
  const pk::Expected back = pk::load_expected(e.file);
  EXPECT_TRUE(back.layer);
  EXPECT_FALSE(back.grad);
  EXPECT_EQ(pk::row_position("y_out", 0, 5, 7, 3), 10);
  EXPECT_EQ(pk::row_position("y", 0, 5, 7, 3), 6);
  EXPECT_EQ(pk::row_position("k_cache_after", 4, 5, 7, 3), 5);
}

TEST(PortkitLayer, BF16OracleErrorIsPositiveAndItPassesItsOwnBound) {
  SCOPED_TRACE("seed=72");
  const auto cf = small_layer_case(72, false, 4, 6, 2, orthros::st::DType::BF16);
  const pk::Expected e = pk::compute_layer_expected(cf, "bf16");
  const auto low = pk::run_layer<Eigen::bfloat16>(pk::load_layer_case<Eigen::bfloat16>(cf));
  const std::map<std::string, const Mat<Eigen::bfloat16>*> port{
      {"y", &low.y}, {"y_out", &low.y_out}, {"k_cache_after", &low.cache.k}, {"v_cache_after", &low.cache.v}};
  for (const auto& n : e.names()) {
    ASSERT_TRUE(e.oracle_err.at(n).maxabs.has_value()) << n;
    const auto& ref = e.file.tensors.at(n);
    std::vector<double> a;
    for (Eigen::Index i = 0; i < port.at(n)->size(); ++i) a.push_back(static_cast<double>(port.at(n)->data()[i]));
    EXPECT_TRUE(oc::compare(n, a, ref.shape, pk::values(ref), ref.shape, "bf16", e.oracle_err.at(n)).pass) << n;
  }
  EXPECT_GT(*e.oracle_err.at("y").maxabs, 0.0);
  // the first P cache rows are copied, not recomputed: exact in every dtype
  const auto& k = e.file.tensors.at("k_cache_after");
  const auto kin = pk::values(cf.tensors.at("k_cache"));
  const auto kout = pk::values(k);
  EXPECT_TRUE(std::equal(kin.begin(), kin.end(), kout.begin()));
}

TEST(PortkitLayer, MalformedLayerCaseNamesTheParameter) {
  auto cf = small_layer_case(73, true, 2, 4, 1, orthros::st::DType::F32);
  auto expect_error = [](orthros::st::File f, const std::string& needle) {
    try {
      pk::compute_layer_expected(f, "f32");
      ADD_FAILURE() << "no error; wanted: " << needle;
    } catch (const orthros::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto f = cf;
  f.tensors.erase("k_norm");
  expect_error(f, "missing tensor \"k_norm\" [D] (qk_norm is \"1\")");
  f = cf;
  f.metadata["num_q_heads"] = "3";
  expect_error(f, "H_q");
  f = cf;
  f.metadata["rope_theta"] = "-1";
  expect_error(f, "rope_theta\" must be > 0 (got -1)");
  f = cf;
  f.metadata["head_dim"] = "7";
  expect_error(f, "metadata \"head_dim\" must be even for RoPE (got 7)");
  f = cf;
  f.metadata["head_dim"] = "4";
  expect_error(f, "tensor \"k_cache\" must be [P, H_kv, D] = [2, 2, 4]; got [2, 2, 8]");
  f = cf;
  f.metadata["qk_norm"] = "0";
  expect_error(f, "qk_norm\" is \"0\" but the case holds q_norm/k_norm");
  f = cf;
  f.tensors["v_cache"] = cf.tensors.at("x");
  expect_error(f, "tensor \"v_cache\" must be [P, H_kv, D] (the shape of k_cache) = [2, 2, 8]; got [4, 12]");
  f = cf;
  f.metadata.erase("window");
  expect_error(f, "missing metadata \"window\"");
  // an expected file without a layer tensor is rejected
  auto e = pk::compute_layer_expected(cf, "f32").file;
  e.tensors.erase("y_out");
  EXPECT_THROW(pk::load_expected(e), orthros::Error);
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

