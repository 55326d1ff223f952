// SPEC §8 pitfalls of real attention ports, each as a test of the oracle.
#include "orthros_testing.hpp"

#include <gtest/gtest.h>

#include <string>

using namespace orthros;
using namespace orthros::testing;

namespace {

bool rows_bitwise_equal(const Mat<double>& a, Index ra, const Mat<double>& b, Index rb) {
  return !bitwise_row_diff(a, ra, b, rb, "").has_value();
}

}  // namespace

// Window off by one: T = 8, w = 4 (window includes the current token: keys [t-3, t]).
// For every base row t and every key j, perturbing k_j or v_j changes o_t iff
// j in [max(1, t-w+1), t] (for k: o_t or lse_t changes): each row sees exactly min(t, w) keys; in particular changing
// k_{t-w} leaves o_t unchanged and changing k_{t-w+1} changes it.
TEST(Pitfalls, WindowOffByOneT8W4) {
  const std::uint64_t seed = 8004;
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  Rng rng(seed);
  const Index T = 8;
  const std::int64_t w = 4;
  const AttentionDims dims{2, 1, 4};
  const Mat<double> q = random_mat<double>(T, 8, rng, 2.0), k = random_mat<double>(T, 4, rng),
                    v = random_mat<double>(T, 4, rng);
  const Mat<double> q_out(0, 8);
  AttentionOptions opt;
  opt.window = w;
  const auto base = orthros_attention<double>(q, k, v, q_out, dims, opt);
  for (Index j = 1; j <= T; ++j) {  // 1-based key position to perturb
    for (int which = 0; which < 2; ++which) {
      Mat<double> k2 = k, v2 = v;
      Mat<double>& m = which == 0 ? k2 : v2;
      m.row(j - 1) *= -1.5;  // all entries are nonzero, so every entry changes
      const auto r = orthros_attention<double>(q, k2, v2, q_out, dims, opt);
      for (Index t = 1; t <= T; ++t) {
        const bool in_window = j >= std::max<Index>(1, t - w + 1) && j <= t;
        // (o_1 cannot depend on k_1 alone: one key always gets weight 1; lse does depend on it.)
        const bool changed =
            !rows_bitwise_equal(r.o, t - 1, base.o, t - 1) || !rows_bitwise_equal(r.lse, t - 1, base.lse, t - 1);
        EXPECT_EQ(changed, in_window) << (which == 0 ? "k_" : "v_") << j << " perturbed, row o_" << t;
      }
    }
  }
  // Count check: number of keys each row depends on is min(t, w).
  for (Index t = 1; t <= T; ++t) {
    int deps = 0;
    for (Index j = 1; j <= T; ++j) {
      Mat<double> v2 = v;
      v2.row(j - 1) *= -1.5;
      deps += !rows_bitwise_equal(orthros_attention<double>(q, k, v2, q_out, dims, opt).o, t - 1, base.o, t - 1);
    }
    EXPECT_EQ(deps, std::min<Index>(t, w)) << "row t=" << t;
  }
}

// Prefill mask and decode mask agree: T = w + 2 = 5, w = 3, one head, D = 8. Full-sequence SWA
// rows (one call, P = 0) equal step-by-step decode rows (T = 1, P = t-1) bit for bit, base and
// output stream, double and float.
template <typename S>
void prefill_equals_decode() {
  const std::uint64_t seed = 5038;
  SCOPED_TRACE(::testing::Message() << "seed=" << seed << " dtype=" << dtype_name<S>());
  Rng rng(seed);
  const Index T = 5;
  const AttentionDims dims{1, 1, 8};
  const Mat<S> q = random_mat<S>(T, 8, rng, 2.0), qo = random_mat<S>(T, 8, rng, 2.0), k = random_mat<S>(T, 8, rng),
               v = random_mat<S>(T, 8, rng);
  AttentionOptions opt;
  opt.window = 3;
  const auto full = orthros_attention<S>(q, k, v, qo, dims, opt);
  for (Index t = 1; t <= T; ++t) {
    const Mat<S> qt = q.row(t - 1), qot = qo.row(t - 1);
    const auto step = orthros_attention<S>(qt, k.topRows(t), v.topRows(t), qot, dims, opt);
    auto e1 = bitwise_row_diff(step.o, 0, full.o, t - 1, "o decode step t=" + std::to_string(t));
    auto e2 = bitwise_row_diff(step.o_out, 0, full.o_out, t - 1, "o_out decode step t=" + std::to_string(t));
    auto e3 = bitwise_row_diff(step.lse, 0, full.lse, t - 1, "lse decode step t=" + std::to_string(t));
    EXPECT_FALSE(e1) << *e1;
    EXPECT_FALSE(e2) << *e2;
    EXPECT_FALSE(e3) << *e3;
  }
}
TEST(Pitfalls, PrefillEqualsDecodeT5W3Double) { prefill_equals_decode<double>(); }
TEST(Pitfalls, PrefillEqualsDecodeT5W3Float) { prefill_equals_decode<float>(); }

// w = 0 or negative is rejected (never "no window" or NaN), with a message naming the window.
TEST(Pitfalls, NonPositiveWindowRejected) {
  Rng rng(7);
  const AttentionDims dims{2, 1, 4};
  const Mat<double> q = random_mat<double>(3, 8, rng), k = random_mat<double>(3, 4, rng),
                    v = random_mat<double>(3, 4, rng), qo = random_mat<double>(1, 8, rng);
  for (std::int64_t w : {std::int64_t(0), std::int64_t(-1), std::int64_t(-128), std::numeric_limits<std::int64_t>::min()}) {
    AttentionOptions opt;
    opt.window = w;
    try {
      (void)orthros_attention<double>(q, k, v, qo, dims, opt);
      ADD_FAILURE() << "window " << w << " accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("window"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::to_string(w)), std::string::npos) << msg;
    }
  }
}

// GQA with a group ratio that is not a power of two: 28 query / 4 KV heads (ratio 7), D = 16,
// P = 3, T = 9, w = 4. Matches the long-double transcription (relative Frobenius <= 1e-12) and
// the MHA run with each KV head repeated 7 times, bitwise; query heads 7g..7g+6 read KV head g
// (heads of different groups give different outputs, same group same keys).
TEST(Pitfalls, GqaRatio7Heads28Over4) {
  const std::uint64_t seed = 2804;
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  Rng rng(seed);
  const AttentionDims dims{28, 4, 16};
  const Index T = 9, P = 3, T_out = 4;
  const Mat<double> q = random_mat<double>(T, 28 * 16, rng, 2.0), k = random_mat<double>(P + T, 4 * 16, rng),
                    v = random_mat<double>(P + T, 4 * 16, rng), qo = random_mat<double>(T_out, 28 * 16, rng, 2.0);
  AttentionOptions opt;
  opt.window = 4;
  const auto r = orthros_attention<double>(q, k, v, qo, dims, opt);
  const auto ref = transcribe_attention(q, k, v, qo, dims, opt.window, default_scale(16));
  EXPECT_LE(static_cast<double>(rel_frobenius(r.o, ref.o)), 1e-12);
  EXPECT_LE(static_cast<double>(rel_frobenius(r.o_out, ref.o_out)), 1e-12);
  EXPECT_LE(static_cast<double>(max_abs_diff(r.lse, ref.lse)), 1e-12);
  EXPECT_LE(static_cast<double>(max_abs_diff(r.lse_out, ref.lse_out)), 1e-12);
  Mat<double> k_rep(P + T, 28 * 16), v_rep(P + T, 28 * 16);
  for (int h = 0; h < 28; ++h) {
    k_rep.middleCols(h * 16, 16) = k.middleCols((h / 7) * 16, 16);
    v_rep.middleCols(h * 16, 16) = v.middleCols((h / 7) * 16, 16);
  }
  const auto mha = orthros_attention<double>(q, k_rep, v_rep, qo, AttentionDims{28, 28, 16}, opt);
  auto e = bitwise_diff(mha.o, r.o, "o MHA(repeated) vs GQA 28/4");
  EXPECT_FALSE(e) << *e;
  e = bitwise_diff(mha.o_out, r.o_out, "o_out MHA(repeated) vs GQA 28/4");
  EXPECT_FALSE(e) << *e;
  // The same query in head 6 and head 7 (last of group 0, first of group 1) must give different
  // outputs (different KV heads); in head 0 and head 6 the same output (same KV head).
  Mat<double> q_same = q;
  for (int h = 1; h < 28; ++h) q_same.middleCols(h * 16, 16) = q.middleCols(0, 16);
  const auto rs = orthros_attention<double>(q_same, k, v, qo, dims, opt);
  for (Index i = 0; i < T; ++i) {
    EXPECT_TRUE((rs.o.row(i).segment(0, 16).array() == rs.o.row(i).segment(6 * 16, 16).array()).all()) << i;
    EXPECT_FALSE((rs.o.row(i).segment(6 * 16, 16).array() == rs.o.row(i).segment(7 * 16, 16).array()).all()) << i;
  }
}

// H_q % H_kv != 0 is rejected with a message naming both head counts.
TEST(Pitfalls, NonDivisibleGqaRejected) {
  Rng rng(11);
  for (auto [hq, hkv] : {std::pair{5, 2}, std::pair{28, 3}, std::pair{2, 4}}) {
    const AttentionDims dims{hq, hkv, 4};
    const Mat<double> q = random_mat<double>(2, hq * 4, rng), k = random_mat<double>(2, hkv * 4, rng),
                      v = random_mat<double>(2, hkv * 4, rng), qo = random_mat<double>(1, hq * 4, rng);
    try {
      (void)orthros_attention<double>(q, k, v, qo, dims, AttentionOptions{});
      ADD_FAILURE() << "H_q=" << hq << " H_kv=" << hkv << " accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("H_q=" + std::to_string(hq)), std::string::npos) << msg;
      EXPECT_NE(msg.find("H_kv=" + std::to_string(hkv)), std::string::npos) << msg;
    }
  }
}
