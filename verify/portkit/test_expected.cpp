// Tests of reference/cli/portkit.hpp: the expected results of a case (float64 oracle + E_X per
// tensor) as `orthros golden` writes them and `orthros check` reads them, including the case where
// the naive oracle at the port's dtype overflows and the max-abs criterion is not applicable.
#include "portkit.hpp"

#include "orthros_testing.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace oc = orthros::check;
namespace pk = orthros::portkit;
using orthros::Mat;
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
