// The backward of the attention operator (attention_backward.hpp): finite differences, the
// SPEC §4.4 special cases as exact (bitwise) properties, SFT = masked PT, thread invariance.
#include "finite_difference.hpp"
#include "orthros_rc.hpp"

#include "orthros/attention_backward.hpp"

#include <gtest/gtest.h>
#include <omp.h>
#include <rapidcheck/gtest.h>

using namespace orthros;
using namespace orthros::testing;

namespace {

/// Upstream gradients of a case (dL/do, dL/do_out), seeded, never zero.
struct Upstream {
  Mat<double> dout, dout_out;
};
Upstream make_upstream(const OpCase& c, std::uint64_t seed) {
  Rng rng(seed);
  const Index cq = Index(c.dims.num_q_heads) * c.dims.head_dim;
  return Upstream{random_mat<double>(c.T, cq, rng), random_mat<double>(c.T_out, cq, rng)};
}

AttentionGrads<double> backward(const OpCase& c, const OpInputs<double>& in, const Upstream& up) {
  return orthros_attention_backward<double>(in.q, in.k, in.v, in.q_out, up.dout, up.dout_out, c.dims, c.options());
}

// The same call without output queries (T_out = 0): the base stream's share of dk, dv alone.
AttentionGrads<double> backward_base_stream_only(OpCase c, OpInputs<double> in, Upstream up) {
  c.T_out = 0;
  in.q_out.resize(0, in.q.cols());
  up.dout_out.resize(0, up.dout.cols());
  return backward(c, in, up);
}

// L(q, k, v, q_out) = Σ dO ⊙ o + Σ dO' ⊙ o'  (its gradient is exactly what the backward returns).
long double scalar_loss(const OpCase& c, const OpInputs<double>& in, const Upstream& up) {
  const auto r = orthros_attention<double>(in.q, in.k, in.v, in.q_out, c.dims, c.options());
  long double l = 0;
  for (Index i = 0; i < r.o.size(); ++i) l += static_cast<long double>(r.o.data()[i]) * up.dout.data()[i];
  for (Index i = 0; i < r.o_out.size(); ++i) l += static_cast<long double>(r.o_out.data()[i]) * up.dout_out.data()[i];
  return l;
}

// verify::richardson_derivative (finite_difference.hpp, h = 1e-5) on every input entry. Tolerance,
// from the error terms derived there:
//   truncation  <= h^4/18 max|L^(5)| = 5.6e-22 max|L^(5)|: negligible, with |q| <= 2, |k|, |v|,
//               |dO| <= 1 and D <= 16 keeping |L^(5)| below ~1e2.
//   rounding    <= 1.5 eps_L / h. L is summed in long double, so eps_L is the float64 rounding of the
//               outputs o that the moved entry reaches (the others are bitwise the same at every step
//               and cancel): at most (T + T_out) (H_q / H_kv) D <= 14 * 7 * 16 ~ 1.6e3 entries, each
//               off by ~10 u |o| <= 1.1e-15, |dO| <= 1: eps_L <= 1.8e-12 if every error had the same
//               sign, ~4e-14 as a random walk; the term is <= 2.6e-7, typically ~7e-9.
// The bound 1e-6 (1 + |g|) stays above both, while a missing or wrong term of a gradient is of the
// order of |g| itself.
void finite_differences() {
  const OpCase c = draw_op_case(7, 5);
  const std::uint64_t up_seed = *rc::gen::arbitrary<std::uint64_t>();
  RC_LOG() << c.describe() << " upstream seed=" << up_seed << "\n";
  OpInputs<double> in = make_inputs<double>(c);
  const Upstream up = make_upstream(c, up_seed);
  const AttentionGrads<double> g = backward(c, in, up);
  auto check = [&](Mat<double>& x, const Mat<double>& gx, const char* name) {
    RC_ASSERT(gx.rows() == x.rows() && gx.cols() == x.cols());
    for (Index i = 0; i < x.size(); ++i) {
      const double fd = verify::richardson_partial(x.data()[i], [&] { return scalar_loss(c, in, up); });
      const double an = gx.data()[i];
      if (!(std::fabs(fd - an) <= 1e-6 * (1 + std::fabs(an))))
        RC_FAIL(detail::cat(name, " [row ", i / x.cols(), ", col ", i % x.cols(), "]: analytic ", an,
                            " vs finite difference ", fd));
    }
  };
  check(in.q, g.dq, "dq");
  check(in.q_out, g.dq_out, "dq_out");
  check(in.k, g.dk, "dk");
  check(in.v, g.dv, "dv");
}

// w = 1: P_t = 1 exactly, o_t = v_t, so dS = P (dO·v - dO·o) = 0 exactly: dq = 0; with no output
// queries dk = 0 and dv_t = Σ_{h in group} dO_{t,h} (group heads summed ascending); with output
// queries the base stream adds nothing to dk: dk does not depend on dO at all.
void window_one() {
  OpCase c = draw_op_case();
  c.window = 1;
  const std::uint64_t s1 = *rc::gen::arbitrary<std::uint64_t>(), s2 = *rc::gen::arbitrary<std::uint64_t>();
  RC_LOG() << c.describe() << " upstream seeds=" << s1 << ", " << s2 << "\n";
  const auto in = make_inputs<double>(c);
  const Upstream up = make_upstream(c, s1);
  const auto g = backward(c, in, up);
  for (Index i = 0; i < g.dq.size(); ++i) RC_ASSERT(g.dq.data()[i] == 0.0);
  Upstream other = make_upstream(c, s2);
  other.dout_out = up.dout_out;
  fail_if(bitwise_diff(backward(c, in, other).dk, g.dk, "dk with another base-stream dO (w = 1)"));

  const auto g0 = backward_base_stream_only(c, in, up);
  const int D = c.dims.head_dim, group = c.dims.num_q_heads / c.dims.num_kv_heads;
  for (Index j = 0; j < g0.dk.rows(); ++j)
    for (int kvh = 0; kvh < c.dims.num_kv_heads; ++kvh)
      for (int d = 0; d < D; ++d) {
        double want = 0;  // key row j = P + i is seen only by base row i
        if (j >= c.P)
          for (int h = kvh * group; h < (kvh + 1) * group; ++h) want += up.dout(j - c.P, Index(h) * D + d);
        RC_ASSERT(g0.dk(j, Index(kvh) * D + d) == 0.0);
        RC_ASSERT(std::memcmp(&g0.dv(j, Index(kvh) * D + d), &want, sizeof(double)) == 0);
      }
}

// Both streams equal (q' = q, dO' = dO, T_out = T, w >= P+T): dq' = dq, and dk, dv are twice
// those of the base stream alone (T_out = 0), bitwise: the two per-stream sums are identical and
// the GQA sum of 2x equals 2x the sum exactly.
void equal_streams() {
  OpCase c = draw_op_case();
  c.window = *rc::gen::element<std::int64_t>(c.P + c.T, c.P + c.T + 3, std::int64_t(1) << 40);
  c.T_out = c.T;
  const std::uint64_t s = *rc::gen::arbitrary<std::uint64_t>();
  RC_LOG() << c.describe() << " upstream seed=" << s << "\n";
  auto in = make_inputs<double>(c);
  in.q_out = in.q;
  Upstream up = make_upstream(c, s);
  up.dout_out = up.dout;
  const auto g = backward(c, in, up);
  fail_if(bitwise_diff(g.dq_out, g.dq, "dq_out vs dq (equal streams)"));
  const auto g0 = backward_base_stream_only(c, in, up);
  fail_if(bitwise_diff(g.dk, Mat<double>(2.0 * g0.dk), "dk vs 2 x base-stream dk"));
  fail_if(bitwise_diff(g.dv, Mat<double>(2.0 * g0.dv), "dv vs 2 x base-stream dv"));
}

// H_kv = H_q with every KV head repeated: its dk/dv summed over each group (ascending) equal
// GQA's dk/dv bitwise; dq, dq_out are identical.
void repeated_kv_equals_gqa() {
  const OpCase c = draw_op_case();
  const std::uint64_t s = *rc::gen::arbitrary<std::uint64_t>();
  RC_LOG() << c.describe() << " upstream seed=" << s << "\n";
  const auto in = make_inputs<double>(c);
  const Upstream up = make_upstream(c, s);
  const int Hq = c.dims.num_q_heads, D = c.dims.head_dim, group = Hq / c.dims.num_kv_heads;
  OpInputs<double> rep = in;
  rep.k.resize(in.k.rows(), Index(Hq) * D);
  rep.v.resize(in.v.rows(), Index(Hq) * D);
  for (int h = 0; h < Hq; ++h) {
    rep.k.middleCols(Index(h) * D, D) = in.k.middleCols(Index(h / group) * D, D);
    rep.v.middleCols(Index(h) * D, D) = in.v.middleCols(Index(h / group) * D, D);
  }
  OpCase mha = c;
  mha.dims.num_kv_heads = Hq;
  const auto gq = backward(c, in, up), gm = backward(mha, rep, up);
  fail_if(bitwise_diff(gm.dq, gq.dq, "dq: MHA with repeated KV vs GQA"));
  fail_if(bitwise_diff(gm.dq_out, gq.dq_out, "dq_out: MHA with repeated KV vs GQA"));
  Mat<double> dk_sum = Mat<double>::Zero(in.k.rows(), in.k.cols()), dv_sum = dk_sum;
  for (int h = 0; h < Hq; ++h) {
    dk_sum.middleCols(Index(h / group) * D, D) += gm.dk.middleCols(Index(h) * D, D);
    dv_sum.middleCols(Index(h / group) * D, D) += gm.dv.middleCols(Index(h) * D, D);
  }
  fail_if(bitwise_diff(dk_sum, gq.dk, "dk: repeated-KV heads summed per group vs GQA"));
  fail_if(bitwise_diff(dv_sum, gq.dv, "dv: repeated-KV heads summed per group vs GQA"));
}

// SFT = PT with the loss masked to the last T_out positions: the PT call (T_out = T) with
// dO' = 0 on its first T - T_out rows gives the SFT call's gradients bitwise (zero rows add exact
// zeros to every sum); its masked dq' rows are 0.
template <typename S>
void sft_equals_masked_pt() {
  OpCase c = draw_op_case();
  c.T_out = *rc::gen::inRange<Index>(1, c.T + 1);
  const std::uint64_t s = *rc::gen::arbitrary<std::uint64_t>(), sq = *rc::gen::arbitrary<std::uint64_t>();
  RC_LOG() << dtype_name<S>() << " " << c.describe() << " upstream seed=" << s << " q_out seed=" << sq << "\n";
  const auto in = make_inputs<S>(c);
  Rng rng(sq);
  const Index cq = Index(c.dims.num_q_heads) * c.dims.head_dim;
  const Mat<S> q_out_all = random_mat<S>(c.T, cq, rng, 2.0);  // an output query at every position (PT)
  const Mat<S> q_out_sft = q_out_all.bottomRows(c.T_out);
  const Upstream up = make_upstream(c, s);
  const Mat<S> dout = round_matrix<S>(up.dout), dout_sft = round_matrix<S>(up.dout_out);
  Mat<S> dout_pt = Mat<S>::Zero(c.T, cq);
  dout_pt.bottomRows(c.T_out) = dout_sft;
  const auto gs = orthros_attention_backward<S>(in.q, in.k, in.v, q_out_sft, dout, dout_sft, c.dims, c.options());
  const auto gp = orthros_attention_backward<S>(in.q, in.k, in.v, q_out_all, dout, dout_pt, c.dims, c.options());
  fail_if(bitwise_diff(gp.dq, gs.dq, "dq: masked PT vs SFT"));
  fail_if(bitwise_diff(Mat<S>(gp.dq_out.bottomRows(c.T_out)), gs.dq_out, "dq_out (kept rows): masked PT vs SFT"));
  fail_if(bitwise_diff(gp.dk, gs.dk, "dk: masked PT vs SFT"));
  fail_if(bitwise_diff(gp.dv, gs.dv, "dv: masked PT vs SFT"));
  for (Index i = 0; i < (c.T - c.T_out) * cq; ++i) RC_ASSERT(static_cast<double>(gp.dq_out.data()[i]) == 0.0);
}

// The gradients do not depend on the number of OpenMP threads (fixed summation order).
void thread_count_invariance() {
  const OpCase c = draw_op_case(40, 20);
  const std::uint64_t s = *rc::gen::arbitrary<std::uint64_t>();
  RC_LOG() << c.describe() << " upstream seed=" << s << "\n";
  const auto in = make_inputs<double>(c);
  const Upstream up = make_upstream(c, s);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto g1 = backward(c, in, up);
  omp_set_num_threads(3);
  const auto g3 = backward(c, in, up);
  omp_set_num_threads(saved);
  fail_if(bitwise_diff(g1.dq, g3.dq, "dq 1 vs 3 threads"));
  fail_if(bitwise_diff(g1.dq_out, g3.dq_out, "dq_out 1 vs 3 threads"));
  fail_if(bitwise_diff(g1.dk, g3.dk, "dk 1 vs 3 threads"));
  fail_if(bitwise_diff(g1.dv, g3.dv, "dv 1 vs 3 threads"));
}

}  // namespace

RC_GTEST_PROP(AttentionBackward, FiniteDifferencesDouble, ()) { finite_differences(); }
RC_GTEST_PROP(AttentionBackward, WindowOneExact, ()) { window_one(); }
RC_GTEST_PROP(AttentionBackward, EqualStreamsExact, ()) { equal_streams(); }
RC_GTEST_PROP(AttentionBackward, RepeatedKvEqualsGqa, ()) { repeated_kv_equals_gqa(); }
RC_GTEST_PROP(AttentionBackward, SftEqualsMaskedPtDouble, ()) { sft_equals_masked_pt<double>(); }
RC_GTEST_PROP(AttentionBackward, SftEqualsMaskedPtBFloat16, ()) { sft_equals_masked_pt<Eigen::bfloat16>(); }
RC_GTEST_PROP(AttentionBackward, ThreadCountInvariance, ()) { thread_count_invariance(); }

// Bad upstream gradients or forward results are clear errors naming the tensor and shapes.
TEST(AttentionBackwardErrors, ShapesAndValuesAreNamed) {
  const std::uint64_t seed = 20261201;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const AttentionDims dims{4, 2, 8};
  AttentionOptions opt;
  opt.window = 3;
  const Mat<double> q = random_mat<double>(5, 32, rng), k = random_mat<double>(5, 16, rng),
                    v = random_mat<double>(5, 16, rng), qo = random_mat<double>(2, 32, rng);
  const Mat<double> dO = random_mat<double>(5, 32, rng), dOo = random_mat<double>(2, 32, rng);
  auto msg = [](auto f) { return error_message(f); };
  EXPECT_NE(msg([&] { orthros_attention_backward<double>(q, k, v, qo, Mat<double>(dO.topRows(4)), dOo, dims, opt); })
                .find("do (dL/do) must be [5, 32]; got [4, 32]"),
            std::string::npos);
  EXPECT_NE(msg([&] { orthros_attention_backward<double>(q, k, v, qo, dO, Mat<double>(dO.topRows(3)), dims, opt); })
                .find("do_out (dL/do_out) must be [2, 32]; got [3, 32]"),
            std::string::npos);
  auto fwd = orthros_attention<double>(q, k, v, qo, dims, opt);
  fwd.lse.resize(5, 3);
  EXPECT_NE(msg([&] { orthros_attention_backward<double>(q, k, v, qo, fwd, dO, dOo, dims, opt); })
                .find("fwd.lse must be [5, 4]; got [5, 3]"),
            std::string::npos);
  Mat<double> bad = dO;
  bad(2, 9) = std::numeric_limits<double>::quiet_NaN();
  EXPECT_NE(msg([&] { orthros_attention_backward<double>(q, k, v, qo, bad, dOo, dims, opt); })
                .find("do contains a non-finite value"),
            std::string::npos);
  // A NaN in the saved forward's LSE (or o) is named there, not reported as a gradient overflow.
  auto nan_fwd = orthros_attention<double>(q, k, v, qo, dims, opt);
  nan_fwd.lse(2, 1) = std::numeric_limits<double>::quiet_NaN();
  const std::string lse = msg([&] { orthros_attention_backward<double>(q, k, v, qo, nan_fwd, dO, dOo, dims, opt); });
  EXPECT_NE(lse.find("fwd.lse contains a non-finite value (nan) at [row, head] = [2, 1]"), std::string::npos) << lse;
  EXPECT_EQ(lse.find(orthros::kGradientOverflowPrefix), std::string::npos) << lse;
  nan_fwd = orthros_attention<double>(q, k, v, qo, dims, opt);
  nan_fwd.lse_out(1, 3) = std::numeric_limits<double>::infinity();
  EXPECT_NE(msg([&] { orthros_attention_backward<double>(q, k, v, qo, nan_fwd, dO, dOo, dims, opt); })
                .find("fwd.lse_out contains a non-finite value (inf) at [row, head] = [1, 3]"),
            std::string::npos);
  nan_fwd = orthros_attention<double>(q, k, v, qo, dims, opt);
  nan_fwd.o(4, 9) = std::numeric_limits<double>::quiet_NaN();
  EXPECT_NE(msg([&] { orthros_attention_backward<double>(q, k, v, qo, nan_fwd, dO, dOo, dims, opt); })
                .find("fwd.o contains a non-finite value (nan) at [row, head, dim] = [4, 1, 1]"),
            std::string::npos);
  opt.window = 0;
  EXPECT_NE(msg([&] { orthros_attention_backward<double>(q, k, v, qo, dO, dOo, dims, opt); }).find("window must be >= 1"),
            std::string::npos);
}
