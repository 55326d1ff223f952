// Tests of verify/kit/include/orthros/portkit.hpp and layer_suite.hpp on layer cases: the expected file is the
// layer oracle and round-trips, the bf16 oracle passes its own bound, malformed cases are named.
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
using orthros::portkit_testing::small_layer_case;

// ---- layer cases (layer_suite.hpp) ----

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
