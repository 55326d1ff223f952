// Tests of verify/kit/include/orthros/portkit.hpp: the expected results of a case (float64 oracle + E_X per
// tensor) as `orthros golden` writes them and `orthros check` reads them, including the case where
// the naive oracle at the port's dtype overflows and the max-abs criterion is not applicable.
// Gradients: test_expected_grad.cpp; large scores in the backward: test_expected_large_scores.cpp;
// layer cases: test_expected_layer.cpp (one executable, test_portkit_expected).
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
