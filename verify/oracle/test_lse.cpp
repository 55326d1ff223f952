// LSE correctness: the operator's lse is the natural-log sum-exp of the scaled scores, exp(lse)
// normalizes the softmax, and the LSEs make split-KV partial results combine into the full one
// (what a split-KV decode kernel relies on; SPEC §8 split-KV pitfall, checked on the oracle).
#include "orthros_rc.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <vector>

using namespace orthros;
using namespace orthros::testing;

namespace {

constexpr long double kU = 0x1p-53L;  // double unit roundoff

struct RowScores {
  std::vector<long double> s;  // exact (long double) scaled scores of the row's key range
  long double abs_max = 0;     // max_j sum_d |q_d k_jd|
  long double vmax = 0;
  Index lo = 0, hi = 0;        // 0-based inclusive key range
};

RowScores row_scores(const OpCase& c, const OpInputs<double>& in, bool base, Index i, int h) {
  const int D = c.dims.head_dim, group = c.dims.num_q_heads / c.dims.num_kv_heads;
  const Mat<double>& qm = base ? in.q : in.q_out;
  const Index t = base ? c.P + i + 1 : c.P + (c.T - c.T_out) + i + 1;
  RowScores r;
  r.lo = (base ? std::max<Index>(1, t - c.window + 1) : 1) - 1;
  r.hi = t - 1;
  for (Index j = r.lo; j <= r.hi; ++j) {
    long double dot = 0, ad = 0;
    for (int d = 0; d < D; ++d) {
      const long double x = (long double)qm(i, Index(h) * D + d) * in.k(j, Index(h / group) * D + d);
      dot += x;
      ad += std::fabs(x);
      r.vmax = std::max(r.vmax, std::fabs((long double)in.v(j, Index(h / group) * D + d)));
    }
    r.s.push_back(dot * c.scale_l());
    r.abs_max = std::max(r.abs_max, ad);
  }
  return r;
}

}  // namespace

// Proves: lse (both streams) = log(sum_j exp(s q.k_j)) over exactly the row's key range, computed
// here directly in long double without max subtraction (scores are small), within the derived
// rounding bound; and exp(lse) normalizes: sum_j exp(s_j - lse) = 1 and
// o = sum_j exp(s_j - lse) v_j within the same bounds.
RC_GTEST_PROP(OracleLse, LseIsLogSumExpAndNormalizes, ()) {
  const OpCase c = draw_op_case();
  RC_LOG() << c.describe() << "\n";
  const auto in = make_inputs<double>(c);
  const auto r = orthros_attention<double>(in.q, in.k, in.v, in.q_out, c.dims, c.options());
  const int Hq = c.dims.num_q_heads, D = c.dims.head_dim, group = Hq / c.dims.num_kv_heads;
  for (int stream = 0; stream < 2; ++stream) {
    const bool base = stream == 0;
    for (Index i = 0; i < (base ? c.T : c.T_out); ++i)
      for (int h = 0; h < Hq; ++h) {
        const RowScores rs = row_scores(c, in, base, i, h);
        long double z = 0;
        for (long double s : rs.s) z += std::exp(s);
        const long double lse_ref = std::log(z);
        const long double lse = base ? r.lse(i, h) : r.lse_out(i, h);
        const Index n = rs.hi - rs.lo + 1;
        const RowBound b = attention_row_bound(kU, D, n, rs.abs_max, rs.vmax, c.scale_l(), std::fabs(lse_ref));
        RC_ASSERT(std::fabs(lse - lse_ref) <= b.lse);
        long double psum = 0;
        std::vector<long double> o(D, 0.0L);
        for (Index j = rs.lo; j <= rs.hi; ++j) {
          const long double p = std::exp(rs.s[j - rs.lo] - lse);
          psum += p;
          for (int d = 0; d < D; ++d) o[d] += p * in.v(j, Index(h / group) * D + d);
        }
        // exp(s_j - lse) = p_j * exp(lse_ref - lse): relative error <= exp(|Δlse|) - 1.
        const long double rel = std::exp(b.lse) - 1;
        RC_ASSERT(std::fabs(psum - 1) <= rel + 8 * n * kU);
        for (int d = 0; d < D; ++d) {
          const long double got = (base ? r.o : r.o_out)(i, Index(h) * D + d);
          RC_ASSERT(std::fabs(got - o[d]) <= b.o + rel * rs.vmax);
        }
      }
  }
}

namespace {

// Split-KV decode assembled from oracle calls: one query at cache position N attends to the
// key ranges [a, b] of a split (computed with a query placed at b and window b-a+1; post-RoPE
// scores do not depend on the query's position), and the partials are merged by their LSEs:
//   lse = log sum_i exp(lse_i),  o = sum_i exp(lse_i - lse) o_i.
struct Merged {
  Mat<double> o, lse;
};

Merged split_kv(const Mat<double>& q, const Mat<double>& k, const Mat<double>& v, const AttentionDims& dims,
                const std::vector<Index>& bounds, std::optional<double> scale) {
  const int Hq = dims.num_q_heads, D = dims.head_dim;
  const Mat<double> none(0, q.cols());
  std::vector<AttentionResult<double>> parts;
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    const Index a = bounds[i], b = bounds[i + 1];  // keys a..b-1 (0-based)
    AttentionOptions opt;
    opt.window = b - a;
    opt.scale = scale;
    parts.push_back(orthros_attention<double>(q, k.topRows(b), v.topRows(b), none, dims, opt));
  }
  Merged m{Mat<double>::Zero(1, q.cols()), Mat<double>::Zero(1, Hq)};
  for (int h = 0; h < Hq; ++h) {
    double mx = -std::numeric_limits<double>::infinity();
    for (const auto& p : parts) mx = std::max(mx, p.lse(0, h));
    double z = 0;
    for (const auto& p : parts) z += std::exp(p.lse(0, h) - mx);
    const double lse = mx + std::log(z);
    m.lse(0, h) = lse;
    for (const auto& p : parts)
      for (int d = 0; d < D; ++d) m.o(0, Index(h) * D + d) += std::exp(p.lse(0, h) - lse) * p.o(0, Index(h) * D + d);
  }
  return m;
}

// Error budget: the full result is within (2n+8)u vmax of exact (attention_row_bound, same
// scores bit for bit in every partial); the merged one adds per partial (2n_i+8)u from its own
// softmax and, through the weights exp(lse_i - lse), the LSE errors (n_i + n + 2 splits + 8 + 2|lse|)u.
// Sum (difference of two results): <= (5n + 4 splits + 32 + 2|lse|) u vmax; factor 2 for libm.
double split_tol_o(Index n, Index splits, double lse_abs, double vmax) {
  return static_cast<double>(2 * (5 * n + 4 * splits + 32 + 2 * static_cast<long double>(lse_abs)) * kU * vmax);
}
double split_tol_lse(Index n, Index splits, double lse_abs) {
  return static_cast<double>(2 * (n + 2 * splits + 8) * kU * (1 + static_cast<long double>(lse_abs)));
}

}  // namespace

// Proves (SPEC §8 split-KV pitfall, oracle side): one decode query over a 4096-key cache,
// GQA 2:1 (4 query / 2 KV heads), D = 128: merging the oracle's partials over 1, 3, 16 and 32
// splits via their LSEs reproduces the full decode result within the derived rounding bound.
TEST(OracleLse, SplitKvMergeMatchesFullDecode4096) {
  const std::uint64_t seed = 4096128;
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  Rng rng(seed);
  const Index N = 4096;
  const AttentionDims dims{4, 2, 128};
  const Mat<double> k = random_mat<double>(N, 2 * 128, rng), v = random_mat<double>(N, 2 * 128, rng);
  const Mat<double> q = random_mat<double>(1, 4 * 128, rng, 3.0);
  AttentionOptions opt;
  opt.window = 128;
  const auto full = orthros_attention<double>(q, k, v, q, dims, opt);  // decode step: T = 1, P = N-1
  for (Index splits : {1, 3, 16, 32}) {
    SCOPED_TRACE(::testing::Message() << "splits=" << splits);
    std::vector<Index> bounds;
    for (Index i = 0; i <= splits; ++i) bounds.push_back(i * N / splits);
    const Merged m = split_kv(q, k, v, dims, bounds, std::nullopt);
    for (int h = 0; h < dims.num_q_heads; ++h) {
      const double la = std::fabs(full.lse_out(0, h));
      EXPECT_LE(std::fabs(m.lse(0, h) - full.lse_out(0, h)), split_tol_lse(N, splits, la)) << "head " << h;
      for (int d = 0; d < dims.head_dim; ++d)
        EXPECT_LE(std::fabs(m.o(0, h * 128 + d) - full.o_out(0, h * 128 + d)), split_tol_o(N, splits, la, 1.0))
            << "head " << h << " d " << d;
    }
  }
}

// Proves the same for random caches, random GQA dims, random split boundaries and scales.
RC_GTEST_PROP(OracleLse, SplitKvMergeMatchesFullRandom, ()) {
  const AttentionDims dims = draw_dims();
  const Index N = *rc::gen::inRange<Index>(1, 65);
  const Index splits = *rc::gen::inRange<Index>(1, N + 1);
  std::vector<Index> cuts = *rc::gen::unique<std::vector<Index>>(splits - 1, rc::gen::inRange<Index>(1, N));
  std::sort(cuts.begin(), cuts.end());
  std::vector<Index> bounds{0};
  bounds.insert(bounds.end(), cuts.begin(), cuts.end());
  bounds.push_back(N);
  const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
  Rng rng(seed);
  const Index cq = Index(dims.num_q_heads) * dims.head_dim, ckv = Index(dims.num_kv_heads) * dims.head_dim;
  const Mat<double> k = random_mat<double>(N, ckv, rng), v = random_mat<double>(N, ckv, rng);
  const Mat<double> q = random_mat<double>(1, cq, rng, 2.0);
  AttentionOptions opt;
  opt.window = *rc::gen::inRange<std::int64_t>(1, N + 2);
  const auto full = orthros_attention<double>(q, k, v, q, dims, opt);
  const Merged m = split_kv(q, k, v, dims, bounds, std::nullopt);
  RC_LOG() << "H_q=" << dims.num_q_heads << " H_kv=" << dims.num_kv_heads << " D=" << dims.head_dim << " N=" << N
           << " splits=" << splits << " seed=" << seed << "\n";
  for (int h = 0; h < dims.num_q_heads; ++h) {
    const double la = std::fabs(full.lse_out(0, h));
    RC_ASSERT(std::fabs(m.lse(0, h) - full.lse_out(0, h)) <= split_tol_lse(N, splits, la));
    for (int d = 0; d < dims.head_dim; ++d) {
      const Index c = Index(h) * dims.head_dim + d;
      RC_ASSERT(std::fabs(m.o(0, c) - full.o_out(0, c)) <= split_tol_o(N, splits, la, 1.0));
    }
  }
}
