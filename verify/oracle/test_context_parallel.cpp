// Context parallelism, CPU proofs: the operator computed over R contiguous shards
// (reference/include/orthros/context_parallel.hpp) equals the single-device oracle
// orthros_attention for any R in 1..8, any shard sizes (shards shorter than the window, length-1
// shards, R > T/2), every regime (PT, SFT, prefill, chunked-prefill chunk with P > 0, decode),
// GQA ratios 1/2/3/7, w = 1 and w >= T, custom scales:
//   - window stream (o, lse): bitwise, in every dtype;
//   - output stream (o_out, lse_out): within the derived bound below (f64 and f32), and bitwise
//     whenever one rank holds all of the row's keys (R = 1, or the query inside rank 0's shard);
//   - a decode step over a sharded cache equals the single-device decode step, and grows only the
//     last rank's shard;
//   - bad shard vectors / sharded caches throw orthros::Error naming the parameter and values.
#include "orthros_rc.hpp"

#include "orthros/context_parallel.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <string>
#include <vector>

using namespace orthros;
using namespace orthros::testing;

namespace {

// ---------------------------------------------------------------------------------------------
// The bound between the context-parallel output stream and the single-device one.
//
// Both sides compute every score s_j = S(Acc(sum_d q_d k_jd) * scale) with the same operands in
// the same order (attend_row), so they share the scores bit for bit; measure both against the
// exact (real-arithmetic) softmax of those shared scores, written with a tilde. u = unit roundoff
// of the accumulator (2^-53 f64, 2^-24 f32); V = max |v_jd| over the row's keys; n = t+1 keys of
// the row; rank r holds n_r of them; K <= R ranks hold any (the states that are merged).
//
// (1) Single device: attention_row_bound (orthros_rc.hpp) with the score term e = 0:
//       |o_1 - o~| <= E1.o = 2(2n+8)uV,   |lse_1 - lse~| <= E1.lse = 2((n+4)u + u|lse|).
// (2) Each rank's state (o_r, lse_r) is attend_row over its n_r keys: the same bound with n_r:
//       |o_r - o_r~| <= eps_o,   |lse_r - lse_r~| <= eps_l   (max over the K ranks).
// (3) Exact merge of the computed states, c_r = e^{lse_r} / sum e^{lse_r'}, o^ = sum c_r o_r:
//     the exact weights are c_r~ = e^{lse_r~ - lse~}, so c_r = c_r~ F_r with |log F_r| <= 2 eps_l,
//     and sum c_r~ = 1 (o~ = sum c_r~ o_r~ is the identity the decomposition rests on).
// (4) Rounding of the merge (merge_partial_states), l(x) = -log(1-x) >= |log(1 +- x)|:
//       x_r = fl(lse_r - M)  perturbs e_r by a factor within e^{+-u Delta}, Delta = max_r |lse_r - M|;
//       e_r = fl(exp(x_r))   factor within e^{+-l(2u)}  (libm exp within 1 ulp = 2u; the project's
//                            factor 2 for libm, as in attention_row_bound);
//       so kappa = u Delta + l(2u) bounds |log(e_r / e^{lse_r - M})|;
//       L = fl(sum_r e_r)    factor e^{+-(kappa + l(gamma_{K-1}))} on the sum;
//       w_r = fl(e_r / L)    factor e^{+-l(u)};
//       o = fl(sum_r w_r o_r) = sum_r w_r o_r (1 + psi_r), |psi_r| <= gamma_K (K products, K-1 sums).
//     Hence o = sum_r c_r~ G_r o_r with
//       |log G_r| <= lambda = 2 eps_l + 2 kappa + l(gamma_{K-1}) + l(u) + l(gamma_K),
//     and |o - o~| <= sum_r c_r~ (|G_r - 1| |o_r| + |o_r - o_r~|) <= (e^lambda - 1)(V + eps_o) + eps_o.
//     lse = fl(M + fl(log L)):
//       |lse - lse~| <= eps_l + kappa + l(gamma_{K-1}) + 2u(log K + 1) + u|lse|
//     (log-sum-exp is 1-Lipschitz in the max norm; |log L| <= log K + kappa + l(gamma_{K-1}) < log K + 1).
// (5) Triangle inequality: |o_CP - o_1| <= (4) + E1.o and |lse_CP - lse_1| <= (4) + E1.lse.
// To first order in u, with n_max = max n_r <= n and Lambda = max_r |lse_r|:
//       |o_CP - o_1| <= u V (4n + 8 n_max + 2K + 2 Delta + 4 Lambda + 52)
//                   <= u V (12 n + 2R + 2 Delta + 4 Lambda + 52);
// the merge itself contributes (2R + 2 Delta + 6) u V; the rest is the two softmaxes' own rounding.
// With R = 1 (or K = 1) the merge is exact (e = 1, L = 1, w = 1), and the test asserts bitwise.
// Computed |lse| stand in for exact ones in the bound (a second-order difference).
// ---------------------------------------------------------------------------------------------
struct MergeBound {
  long double o = 0, lse = 0;
};

long double neg_log1m(long double x) { return -std::log1p(-x); }
long double gamma_n(long double u, long double n) { return n * u / (1 - n * u); }

// Bound (5) for one output row and head. `lse_r` / `n_r`: the non-empty states' LSEs and key
// counts in rank order; `vmax_r` their max |v|; `V` the row's max |v|; `lse_1` the single-device LSE.
MergeBound cp_output_bound(long double u, int D, Index n, long double V, long double lse_1,
                           const std::vector<long double>& lse_r, const std::vector<Index>& n_r,
                           const std::vector<long double>& vmax_r, long double lse_cp) {
  const long double K = static_cast<long double>(lse_r.size());
  long double eps_o = 0, eps_l = 0, M = -INFINITY, Delta = 0;
  for (size_t r = 0; r < lse_r.size(); ++r) {
    const RowBound b = attention_row_bound(u, D, n_r[r], 0.0L, vmax_r[r], 1.0L, std::fabs(lse_r[r]));  // e = 0
    eps_o = std::max(eps_o, b.o);
    eps_l = std::max(eps_l, b.lse);
    M = std::max(M, lse_r[r]);
  }
  for (long double l : lse_r) Delta = std::max(Delta, std::fabs(l - M));
  const RowBound one = attention_row_bound(u, D, n, 0.0L, V, 1.0L, std::fabs(lse_1));
  const long double kappa = u * Delta + neg_log1m(2 * u);
  const long double lambda =
      2 * eps_l + 2 * kappa + neg_log1m(gamma_n(u, K - 1)) + neg_log1m(u) + neg_log1m(gamma_n(u, K));
  MergeBound mb;
  mb.o = (std::expm1(lambda) * (V + eps_o) + eps_o) + one.o;
  mb.lse = (eps_l + kappa + neg_log1m(gamma_n(u, K - 1)) + 2 * u * (std::log(K) + 1) + u * std::fabs(lse_cp)) + one.lse;
  return mb;
}

// Checks the output stream of a context-parallel result `cp` against the single-device `one`:
// rows whose keys all lie in one rank bitwise; with `bounded` (f64/f32) every row within
// cp_output_bound, recomputing each rank's partial states with the public rank_output_partials.
template <typename S>
void check_output_stream(const AttentionResult<S>& one, const AttentionResult<S>& cp, const Mat<S>& q_out,
                         const ShardedKV<S>& cache, const AttentionDims& dims, const AttentionOptions& opt,
                         bool bounded) {
  const ShardLayout layout = check_sharded_kv(cache, dims);
  const Index N = layout.total(), T_out = q_out.rows();
  const int Hq = dims.num_q_heads, D = dims.head_dim, group = Hq / dims.num_kv_heads;
  RC_ASSERT(cp.o_out.rows() == T_out);
  std::vector<PartialStates<S>> parts;
  if (bounded)
    for (int r = 0; r < layout.ranks(); ++r)
      parts.push_back(rank_output_partials<S>(q_out, N - T_out, cache.k[r], cache.v[r], layout.start[r], dims, opt));
  const long double u = unit_roundoff<AccumT<S>>();
  long double worst = 0;  // largest error / bound seen (reported on failure)
  for (Index i = 0; i < T_out; ++i) {
    const Index t = N - T_out + i;  // cache row of the output query
    const int owner = layout.owner(t);
    if (owner == 0) {  // one state: the merge is the identity, bit for bit
      fail_if(bitwise_row_diff(cp.o_out, i, one.o_out, i, "o_out row " + std::to_string(i) + " (one rank)"));
      fail_if(bitwise_row_diff(cp.lse_out, i, one.lse_out, i, "lse_out row " + std::to_string(i) + " (one rank)"));
    }
    if (!bounded) continue;
    for (int h = 0; h < Hq; ++h) {
      const int g = h / group;
      std::vector<long double> lse_r, vmax_r;
      std::vector<Index> n_r;
      long double V = 0;
      for (int r = 0; r <= owner; ++r) {
        const Index hi = std::min(t, layout.end(r) - 1);
        long double vm = 0;
        for (Index j = layout.start[r]; j <= hi; ++j)
          for (int d = 0; d < D; ++d) vm = std::max(vm, std::fabs(to_ld(cache.v[r](j - layout.start[r], Index(g) * D + d))));
        lse_r.push_back(to_ld(parts[r].lse(i, h)));
        n_r.push_back(hi - layout.start[r] + 1);
        vmax_r.push_back(vm);
        V = std::max(V, vm);
      }
      const MergeBound b = cp_output_bound(u, D, t + 1, V, to_ld(one.lse_out(i, h)), lse_r, n_r, vmax_r,
                                           to_ld(cp.lse_out(i, h)));
      // Non-vacuous: at these sizes (n <= 28 keys, K <= 8) the bound is a few hundred u, far below
      // any error a wrong key range or weight would cause (O(1/n) of V).
      RC_ASSERT(b.o <= 1e4L * u * std::max<long double>(V, 1) &&
                b.lse <= 1e4L * u * (1 + std::fabs(to_ld(one.lse_out(i, h)))));
      const long double dl = std::fabs(to_ld(cp.lse_out(i, h)) - to_ld(one.lse_out(i, h)));
      if (!(dl <= b.lse))
        RC_FAIL("lse_out row " + std::to_string(i) + " head " + std::to_string(h) + " (K=" +
                std::to_string(owner + 1) + "): |diff| " + std::to_string(static_cast<double>(dl)) + " > bound " +
                std::to_string(static_cast<double>(b.lse)));
      worst = std::max(worst, dl / b.lse);
      for (int d = 0; d < D; ++d) {
        const Index c = Index(h) * D + d;
        const long double diff = std::fabs(to_ld(cp.o_out(i, c)) - to_ld(one.o_out(i, c)));
        if (!(diff <= b.o))
          RC_FAIL("o_out row " + std::to_string(i) + " head " + std::to_string(h) + " d " + std::to_string(d) +
                  " (K=" + std::to_string(owner + 1) + "): |diff| " + std::to_string(static_cast<double>(diff)) +
                  " > bound " + std::to_string(static_cast<double>(b.o)));
        worst = std::max(worst, diff / b.o);
      }
    }
  }
  RC_LOG() << "largest output-stream error / bound: " << static_cast<double>(worst) << "\n";
}

// A uniform draw from [lo, hi) at every rapidcheck size (gen::inRange shrinks the range at small
// sizes, which would make the early cases all R = 1, N = 1, PT).
template <typename T>
T uniform(T lo, T hi) {
  return *rc::gen::resize(rc::kNominalSize, rc::gen::inRange<T>(lo, hi));
}

// Draws shard lengths for N cache rows: R in 1..min(8, N) (R = 1 and R = min(8, N), i.e. all
// length-1 shards when N <= 8, each with probability 1/4), cut points distinct in [1, N-1].
std::vector<Index> draw_shard_lengths(Index N) {
  const Index max_r = std::min<Index>(8, N);
  const int kind = uniform(0, 4);
  const Index R = kind == 0 ? 1 : kind == 1 ? max_r : uniform<Index>(1, max_r + 1);
  std::vector<Index> cuts = *rc::gen::unique<std::vector<Index>>(static_cast<size_t>(R - 1), rc::gen::inRange<Index>(1, N));
  std::sort(cuts.begin(), cuts.end());
  std::vector<Index> lengths;
  Index prev = 0;
  for (Index c : cuts) {
    lengths.push_back(c - prev);
    prev = c;
  }
  lengths.push_back(N - prev);
  return lengths;
}

std::string lengths_str(const std::vector<Index>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// True when some rank's halo comes from more than one previous rank (shards shorter than w-1).
bool halo_spans_ranks(const ShardLayout& layout, std::int64_t window) {
  for (int r = 1; r < layout.ranks(); ++r)
    if (std::min<Index>(window - 1, layout.start[r]) > layout.length[r - 1]) return true;
  return false;
}

// One call of the operator in a random regime on N cache rows cut into random shards: the
// context-parallel result against orthros_attention on the whole cache.
// With `short_shards`: R = 8 shards of N in [8, 24] rows and a window longer than every shard
// plus one, so the halos of ranks 2..7 always come from several previous ranks.
template <typename S>
void context_parallel_matches_single_device(bool short_shards = false) {
  const AttentionDims dims = draw_dims();
  const Index N = short_shards ? uniform<Index>(8, 25) : uniform<Index>(1, 25);
  std::vector<Index> lengths;
  if (!short_shards) {
    lengths = draw_shard_lengths(N);
  } else {
    std::vector<Index> cuts = *rc::gen::unique<std::vector<Index>>(7, rc::gen::inRange<Index>(1, N));
    std::sort(cuts.begin(), cuts.end());
    for (size_t r = 0; r <= cuts.size(); ++r) lengths.push_back((r < cuts.size() ? cuts[r] : N) - (r ? cuts[r - 1] : 0));
  }
  const char* regimes[] = {"PT", "SFT", "prefill", "chunk", "decode"};
  int regime = uniform(0, 5);
  if (regime == 3 && N == 1) regime = 0;  // a chunk after a cached prefix needs N >= 2
  Index P = 0, T = N, T_out = N;
  if (regime == 1) T_out = *rc::gen::inRange<Index>(1, N + 1);
  if (regime == 2) T_out = 1;
  if (regime == 3) {
    P = *rc::gen::inRange<Index>(1, N);
    T = N - P;
    T_out = *rc::gen::inRange<Index>(0, T + 1);  // 0: a chunk that only fills the cache
  }
  if (regime == 4) P = N - 1, T = 1, T_out = 1;
  AttentionOptions opt;
  opt.window = draw_window(N);
  if (short_shards) {
    const Index longest = *std::max_element(lengths.begin(), lengths.end());
    opt.window = uniform<Index>(0, 4) == 0 ? std::int64_t(1) << 40 : uniform<Index>(longest + 2, N + 3);
  }
  if (*rc::gen::inRange(0, 3) == 0) opt.scale = *rc::gen::inRange(1, 97) / 32.0;
  const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
  const ShardLayout layout = make_shard_layout(lengths, N);
  RC_TAG(regimes[regime]);
  RC_CLASSIFY(halo_spans_ranks(layout, opt.window), "halo spans several ranks");
  RC_LOG() << "dtype=" << dtype_name<S>() << " regime=" << regimes[regime] << " H_q=" << dims.num_q_heads
           << " H_kv=" << dims.num_kv_heads << " D=" << dims.head_dim << " N=" << N << " P=" << P << " T=" << T
           << " T_out=" << T_out << " w=" << opt.window << " scale=" << (opt.scale ? std::to_string(*opt.scale) : "1/sqrt(D)")
           << " shards=" << lengths_str(lengths) << " seed=" << seed << "\n";
  Rng rng(seed);
  const Index cq = Index(dims.num_q_heads) * dims.head_dim, ckv = Index(dims.num_kv_heads) * dims.head_dim;
  const Mat<S> q = random_mat<S>(T, cq, rng, 2.0), k = random_mat<S>(N, ckv, rng), v = random_mat<S>(N, ckv, rng);
  const Mat<S> q_out = random_mat<S>(T_out, cq, rng, 2.0);

  const AttentionResult<S> one = orthros_attention<S>(q, k, v, q_out, dims, opt);
  const ShardedKV<S> cache = shard_kv(k, v, lengths);
  const AttentionResult<S> cp = context_parallel_attention<S>(q, cache, q_out, dims, opt);

  // Window stream: same keys, same order, same function: bitwise.
  fail_if(bitwise_diff(cp.o, one.o, "o (window stream)"));
  fail_if(bitwise_diff(cp.lse, one.lse, "lse (window stream)"));
  // Output stream: bitwise where one rank holds the keys, else within the derived bound.
  constexpr bool bounded = std::is_same_v<S, double> || std::is_same_v<S, float>;
  check_output_stream(one, cp, q_out, cache, dims, opt, bounded);
  if (layout.ranks() == 1) {
    fail_if(bitwise_diff(cp.o_out, one.o_out, "o_out (R = 1)"));
    fail_if(bitwise_diff(cp.lse_out, one.lse_out, "lse_out (R = 1)"));
  }
}

// A prefill sharded over R ranks followed by decode steps: each step appends to the last rank's
// shard and equals the single-device decode step on the gathered cache.
template <typename S>
void decode_over_sharded_cache() {
  const AttentionDims dims = draw_dims();
  const Index N0 = uniform<Index>(1, 21);
  const std::vector<Index> lengths = draw_shard_lengths(N0);
  const Index steps = *rc::gen::inRange<Index>(1, 5);
  AttentionOptions opt;
  opt.window = draw_window(N0 + steps);
  if (*rc::gen::inRange(0, 3) == 0) opt.scale = *rc::gen::inRange(1, 97) / 32.0;
  const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
  RC_LOG() << "dtype=" << dtype_name<S>() << " H_q=" << dims.num_q_heads << " H_kv=" << dims.num_kv_heads
           << " D=" << dims.head_dim << " N0=" << N0 << " steps=" << steps << " w=" << opt.window
           << " scale=" << (opt.scale ? std::to_string(*opt.scale) : "1/sqrt(D)") << " shards=" << lengths_str(lengths)
           << " seed=" << seed << "\n";
  Rng rng(seed);
  const Index cq = Index(dims.num_q_heads) * dims.head_dim, ckv = Index(dims.num_kv_heads) * dims.head_dim;
  Mat<S> k = random_mat<S>(N0, ckv, rng), v = random_mat<S>(N0, ckv, rng);
  ShardedKV<S> cache = shard_kv(k, v, lengths);
  std::vector<Index> expect_lengths = lengths;
  for (Index s = 0; s < steps; ++s) {
    const Mat<S> q = random_mat<S>(1, cq, rng, 2.0), q_out = random_mat<S>(1, cq, rng, 2.0);
    const Mat<S> k_new = random_mat<S>(1, ckv, rng), v_new = random_mat<S>(1, ckv, rng);
    k.conservativeResize(k.rows() + 1, Eigen::NoChange);
    v.conservativeResize(v.rows() + 1, Eigen::NoChange);
    k.row(k.rows() - 1) = k_new.row(0);
    v.row(v.rows() - 1) = v_new.row(0);
    const AttentionResult<S> one = orthros_attention<S>(q, k, v, q_out, dims, opt);  // T = 1, P = N-1
    const AttentionResult<S> cp = context_parallel_decode_step<S>(cache, q, k_new, v_new, q_out, dims, opt);
    expect_lengths.back() += 1;
    RC_ASSERT(cache.shard_lengths() == expect_lengths);  // only the last rank's shard grew
    fail_if(bitwise_diff(gather_shards(cache.k), k, "sharded k after step " + std::to_string(s)));
    fail_if(bitwise_diff(gather_shards(cache.v), v, "sharded v after step " + std::to_string(s)));
    fail_if(bitwise_diff(cp.o, one.o, "decode o (window stream), step " + std::to_string(s)));
    fail_if(bitwise_diff(cp.lse, one.lse, "decode lse (window stream), step " + std::to_string(s)));
    check_output_stream(one, cp, q_out, cache, dims, opt, std::is_same_v<S, double> || std::is_same_v<S, float>);
  }
}

// Seeded random matrix for the unit tests below.
Mat<double> rmat(Index rows, Index cols, std::uint64_t seed, double amp = 1.0) {
  Rng rng(seed);
  return random_mat<double>(rows, cols, rng, amp);
}

}  // namespace

// Proves the decomposition in double: window stream bitwise, output stream within the derived
// bound (bitwise for R = 1 and for rows inside rank 0's shard), every regime, any shards.
RC_GTEST_PROP(ContextParallel, MatchesSingleDeviceDouble, ()) { context_parallel_matches_single_device<double>(); }

// The halo case on purpose: 8 ranks with short shards and a window longer than each, so ranks
// 2..7 receive their halo from several previous ranks; same assertions, double.
RC_GTEST_PROP(ContextParallel, HaloAcrossSeveralRanksDouble, ()) { context_parallel_matches_single_device<double>(true); }

// Same in float (u = 2^-24 in the bound).
RC_GTEST_PROP(ContextParallel, MatchesSingleDeviceFloat, ()) { context_parallel_matches_single_device<float>(); }

// The oracle at kernel precision (bf16/f16 storage, f32 accumulation): the window stream is still
// bitwise, and rows held by one rank are bitwise; the merge's bf16/f16 rounding of each rank's o
// (attend_row stores o at S) has no f64 bound here (docs/context_parallel.md).
RC_GTEST_PROP(ContextParallel, WindowStreamBitwiseBFloat16, ()) {
  context_parallel_matches_single_device<Eigen::bfloat16>();
}
RC_GTEST_PROP(ContextParallel, WindowStreamBitwiseHalf, ()) { context_parallel_matches_single_device<Eigen::half>(); }

// Proves a decode step over a sharded cache (new K/V appended to the last rank; window query with
// its halo; output query split-KV over the shards) equals the single-device decode step, for a
// prefill cache sharded at random and 1..4 steps, in double and float.
RC_GTEST_PROP(ContextParallel, DecodeOverShardedCacheDouble, ()) { decode_over_sharded_cache<double>(); }
RC_GTEST_PROP(ContextParallel, DecodeOverShardedCacheFloat, ()) { decode_over_sharded_cache<float>(); }

// The halo rule on fixed layouts: rank r receives min(w-1, start_r) rows, from every previous
// rank whose shard overlaps them (several when shards are shorter than w-1), in position order.
TEST(ContextParallel, HaloSpansPreviousRanks) {
  const Mat<double> k = rmat(10, 4, 11), v = rmat(10, 4, 12);
  {  // shards {1,1,1,7}, w = 4: rank 3 (start 3) needs rows 0..2, one from each of ranks 0, 1, 2
    const ShardedKV<double> c = shard_kv(k, v, {1, 1, 1, 7});
    const ShardLayout layout = make_shard_layout(c.shard_lengths(), 10);
    const Halo<double> h = receive_halo(c, layout, 3, 4);
    EXPECT_EQ(h.first_row, 0);
    EXPECT_EQ(h.from_ranks, (std::vector<int>{0, 1, 2}));
    EXPECT_TRUE(h.k == k.topRows(3) && h.v == v.topRows(3));
  }
  {  // shards {4,1,1,4}, w = 5: rank 3 (start 6) needs rows 2..5: rows 2-3 from rank 0, 4 from 1, 5 from 2
    const ShardedKV<double> c = shard_kv(k, v, {4, 1, 1, 4});
    const ShardLayout layout = make_shard_layout(c.shard_lengths(), 10);
    const Halo<double> h = receive_halo(c, layout, 3, 5);
    EXPECT_EQ(h.first_row, 2);
    EXPECT_EQ(h.from_ranks, (std::vector<int>{0, 1, 2}));
    EXPECT_TRUE(h.k == k.middleRows(2, 4) && h.v == v.middleRows(2, 4));
    // w = 2: one row, from rank 2 only; w = 1: no halo; rank 0: never a halo.
    EXPECT_EQ(receive_halo(c, layout, 3, 2).from_ranks, (std::vector<int>{2}));
    EXPECT_EQ(receive_halo(c, layout, 3, 1).k.rows(), 0);
    EXPECT_EQ(receive_halo(c, layout, 0, 1 << 20).k.rows(), 0);
    // w >= N: every row before the shard.
    EXPECT_EQ(receive_halo(c, layout, 3, 1 << 20).k.rows(), 6);
  }
}

// SPEC §8's split-KV decode pitfall, with the splits being ranks: one decode query over a
// 4096-key cache, GQA 2:1, D = 128, sharded over R = 1, 3, 8 uneven ranks: equal to the single
// device within the derived bound (R = 1 bitwise).
TEST(ContextParallel, DecodeOver4096KeyCache) {
  const std::uint64_t seed = 1204096;
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  const AttentionDims dims{4, 2, 128};
  const Mat<double> k = rmat(4096, 256, seed), v = rmat(4096, 256, seed + 1);
  const Mat<double> q = rmat(1, 512, seed + 2, 3.0), q_out = rmat(1, 512, seed + 3, 3.0);
  const Mat<double> kn = k.bottomRows(1), vn = v.bottomRows(1);
  AttentionOptions opt;
  opt.window = 128;
  const AttentionResult<double> one = orthros_attention<double>(q, k, v, q_out, dims, opt);
  for (const std::vector<Index>& lengths :
       {std::vector<Index>{4095}, std::vector<Index>{1000, 3000, 95}, std::vector<Index>{1, 7, 512, 1024, 600, 900, 1000, 51}}) {
    SCOPED_TRACE(::testing::Message() << "shards=" << lengths_str(lengths));
    ShardedKV<double> cache = shard_kv<double>(k.topRows(4095), v.topRows(4095), lengths);
    const AttentionResult<double> cp = context_parallel_decode_step<double>(cache, q, kn, vn, q_out, dims, opt);
    EXPECT_FALSE(bitwise_diff(cp.o, one.o, "o"));
    EXPECT_FALSE(bitwise_diff(cp.lse, one.lse, "lse"));
    if (lengths.size() == 1) {
      EXPECT_FALSE(bitwise_diff(cp.o_out, one.o_out, "o_out"));
      EXPECT_FALSE(bitwise_diff(cp.lse_out, one.lse_out, "lse_out"));
    }
    // The derived bound, computed with the same helper as the properties (inside a rapidcheck-free
    // test the RC_ macros would throw; the check is repeated here with plain expectations).
    const ShardLayout layout = make_shard_layout(cache.shard_lengths(), 4096);
    for (int h = 0; h < 4; ++h) {
      std::vector<long double> lse_r, vmax_r;
      std::vector<Index> n_r;
      for (int r = 0; r < layout.ranks(); ++r) {
        const PartialStates<double> p =
            rank_output_partials<double>(q_out, 4095, cache.k[r], cache.v[r], layout.start[r], dims, opt);
        lse_r.push_back(p.lse(0, h));
        n_r.push_back(layout.length[r]);
        vmax_r.push_back(cache.v[r].middleCols((h / 2) * 128, 128).cwiseAbs().maxCoeff());
      }
      const long double V = *std::max_element(vmax_r.begin(), vmax_r.end());
      const MergeBound b = cp_output_bound(0x1p-53L, 128, 4096, V, one.lse_out(0, h), lse_r, n_r, vmax_r, cp.lse_out(0, h));
      EXPECT_LE(std::fabs((long double)cp.lse_out(0, h) - one.lse_out(0, h)), b.lse) << "head " << h;
      for (int d = 0; d < 128; ++d)
        EXPECT_LE(std::fabs((long double)cp.o_out(0, h * 128 + d) - one.o_out(0, h * 128 + d)), b.o)
            << "head " << h << " d " << d;
    }
  }
}

// Bad shard vectors: empty, an entry < 1, a sum that is not the sequence length; each message
// names shard_lengths, the offending value and the whole vector.
TEST(ContextParallelErrors, BadShardLengths) {
  EXPECT_NE(error_message([] { make_shard_layout({}, 5); }).find("shard_lengths must name at least one rank"),
            std::string::npos);
  const std::string zero = error_message([] { make_shard_layout({2, 0, 3}, 5); });
  for (const char* part : {"shard_lengths[1] must be >= 1", "got 0", "[2, 0, 3]"})
    EXPECT_NE(zero.find(part), std::string::npos) << "'" << part << "' missing in: " << zero;
  const std::string neg = error_message([] { make_shard_layout({2, -1, 4}, 5); });
  for (const char* part : {"shard_lengths[1]", "got -1", "[2, -1, 4]"})
    EXPECT_NE(neg.find(part), std::string::npos) << "'" << part << "' missing in: " << neg;
  const std::string sum = error_message([] { make_shard_layout({2, 2}, 5); });
  for (const char* part : {"shard_lengths sum to 4", "5 cache rows", "[2, 2]"})
    EXPECT_NE(sum.find(part), std::string::npos) << "'" << part << "' missing in: " << sum;
  // shard_kv validates the same way, against k's rows.
  const Mat<double> k = rmat(5, 4, 1), v = rmat(5, 4, 2);
  EXPECT_NE(error_message([&] { shard_kv(k, v, {3, 3}); }).find("shard_lengths sum to 6 but the sequence has 5"),
            std::string::npos);
  EXPECT_NE(error_message([&] { shard_kv<double>(k, rmat(4, 4, 3), {5}); }).find("v must have the shape of k"),
            std::string::npos);
  // orthros::Error is a std::invalid_argument.
  EXPECT_THROW(make_shard_layout({1, 0}, 1), std::invalid_argument);
}

// Bad sharded caches and bad calls: messages name cache.k[r] / cache.v[r] and the values.
TEST(ContextParallelErrors, BadShardedCache) {
  const AttentionDims dims{4, 2, 2};  // H_q*D = 8, H_kv*D = 4
  AttentionOptions opt;
  opt.window = 3;
  const Mat<double> k = rmat(6, 4, 1), v = rmat(6, 4, 2), q = rmat(2, 8, 3), q_out = rmat(1, 8, 4);
  const ShardedKV<double> good = shard_kv(k, v, {2, 1, 3});
  EXPECT_EQ(error_message([&] { context_parallel_attention<double>(q, good, q_out, dims, opt); }), "no error");
  auto expect = [&](const ShardedKV<double>& c, const Mat<double>& qq, std::initializer_list<std::string> parts) {
    const std::string msg = error_message([&] { context_parallel_attention<double>(qq, c, q_out, dims, opt); });
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' missing in: " << msg;
  };
  ShardedKV<double> c = good;
  c.k[1] = rmat(1, 6, 5);
  expect(c, q, {"cache.k[1] must be", "4 columns", "got 6"});
  c = good;
  c.v[2] = rmat(2, 4, 6);
  expect(c, q, {"cache.v[2] must have the shape of cache.k[2]", "[3, 4]", "[2, 4]"});
  c = good;
  c.v.pop_back();
  expect(c, q, {"cache.k holds 3 shards but cache.v holds 2"});
  c = good;
  c.k[1].resize(0, 4);
  c.v[1].resize(0, 4);
  expect(c, q, {"cache.k[1] is empty", "[2, 0, 3]"});
  c = good;
  c.k[2](1, 3) = std::nan("");
  expect(c, q, {"cache.k[2] contains a non-finite value"});
  expect(ShardedKV<double>{}, q, {"at least one rank"});
  expect(good, rmat(7, 8, 7), {"P+T >= T", "T = q rows = 7", "6 rows", "[2, 1, 3]"});
  opt.window = 0;
  expect(good, q, {"window must be >= 1", "got 0"});
  opt.window = 3;
  const ShardLayout layout = make_shard_layout(good.shard_lengths(), 6);
  EXPECT_NE(error_message([&] { receive_halo(good, layout, 3, 2); }).find("rank must be in [0, 3) (got 3)"),
            std::string::npos);
}

// A decode step validates the new token's tensors and leaves the cache unchanged when it throws.
TEST(ContextParallelErrors, DecodeStepLeavesCacheOnError) {
  const AttentionDims dims{4, 2, 2};
  AttentionOptions opt;
  opt.window = 3;
  ShardedKV<double> cache = shard_kv<double>(rmat(5, 4, 1), rmat(5, 4, 2), {2, 3});
  const ShardedKV<double> before = cache;
  const Mat<double> q = rmat(1, 8, 3), q_out = rmat(1, 8, 4), kn = rmat(1, 4, 5), vn = rmat(1, 4, 6);
  auto msg = [&](const Mat<double>& qq, const Mat<double>& k1, const Mat<double>& v1) {
    return error_message([&] { context_parallel_decode_step<double>(cache, qq, k1, v1, q_out, dims, opt); });
  };
  EXPECT_NE(msg(q, rmat(1, 6, 7), vn).find("k_new must be [1, H_kv, D] = [1, 2, 2] (4 columns); got [1, 6]"),
            std::string::npos);
  EXPECT_NE(msg(q, kn, rmat(2, 4, 8)).find("v_new must be"), std::string::npos);
  EXPECT_NE(msg(rmat(2, 8, 9), kn, vn).find("one base query and one output query"), std::string::npos);
  Mat<double> bad = kn;
  bad(0, 1) = INFINITY;
  EXPECT_NE(msg(q, bad, vn).find("k_new contains a non-finite value"), std::string::npos);  // named before the append
  EXPECT_EQ(cache.shard_lengths(), before.shard_lengths());
  EXPECT_TRUE(cache.k[1] == before.k[1] && cache.v[1] == before.v[1]);
  EXPECT_EQ(msg(q, kn, vn), "no error");
  EXPECT_EQ(cache.shard_lengths(), (std::vector<Index>{2, 4}));
}

// A shard whose scores all overflow S to -inf carries zero weight (as on one device): an empty
// state, not a NaN. Hand-built so that q_out.k of shard 0's two keys is -400*400/sqrt(2) < -65504
// (f16 -inf) while shard 1's scores are finite (found by a reviewer's probe).
TEST(ContextParallel, ShardWithAllScoresOverflowingToMinusInfIsEmpty) {
  using H = Eigen::half;
  const AttentionDims dims{1, 1, 2};
  AttentionOptions opt;
  opt.window = 1;
  Mat<H> k(4, 2), v(4, 2), q(1, 2), qo(1, 2);
  k << H(400), H(0), H(400), H(0), H(0), H(1), H(0), H(0.5);
  v << H(0.25), H(-0.5), H(0.75), H(1), H(-1), H(0.125), H(0.5), H(0.5);
  q << H(0.5), H(0.5);
  qo << H(-400), H(1);
  const auto one = orthros_attention<H>(q, k, v, qo, dims, opt);
  for (const std::vector<Index>& lens : {std::vector<Index>{2, 2}, std::vector<Index>{1, 3}}) {
    const auto cp = context_parallel_attention<H>(q, shard_kv<H>(k, v, lens), qo, dims, opt);
    // Shard 0 contributes nothing, so the merge is the identity of shard 1's state: bitwise.
    EXPECT_TRUE(cp.o_out == one.o_out && cp.lse_out == one.lse_out)
        << "shards {" << lens[0] << ", " << lens[1] << "}: o_out " << double(cp.o_out(0, 0)) << " vs "
        << double(one.o_out(0, 0)) << ", lse_out " << double(cp.lse_out(0, 0)) << " vs " << double(one.lse_out(0, 0));
  }
}

// The merge rejects non-finite states by name instead of returning NaN.
TEST(ContextParallelErrors, MergeRejectsNonFiniteStates) {
  PartialStates<double> a, b;
  a.o = Mat<double>::Constant(1, 2, 0.5);
  a.lse = Mat<double>::Constant(1, 1, 1.0);
  b.o = Mat<double>::Constant(1, 2, 0.25);
  b.lse = Mat<double>::Constant(1, 1, 2.0);
  auto msg = [&] { return error_message([&] { merge_partial_states<double>({a, b}); }); };
  a.lse(0, 0) = std::nan("");
  EXPECT_NE(msg().find("state 0 has lse nan at output row 0 head 0"), std::string::npos) << msg();
  a.lse(0, 0) = INFINITY;
  EXPECT_NE(msg().find("state 0 has lse inf"), std::string::npos) << msg();
  a.lse(0, 0) = 1.0;
  b.o(0, 1) = std::nan("");
  EXPECT_NE(msg().find("state 1 has o nan at output row 0 head 0 dim 1"), std::string::npos) << msg();
  b.lse(0, 0) = -INFINITY;  // an empty state's o is not read
  EXPECT_EQ(msg(), "no error");
}

// One non-empty state: the merge copies it, so signed zeros survive (R = 1 bitwise in every dtype).
TEST(ContextParallel, SingleStateMergeKeepsSignedZero) {
  PartialStates<Eigen::half> a, b;
  a.o = Mat<Eigen::half>::Constant(1, 2, Eigen::half(-0.0f));
  a.lse = Mat<float>::Constant(1, 1, 0.5f);
  b.o = Mat<Eigen::half>::Constant(1, 2, Eigen::half(0.25f));
  b.lse = Mat<float>::Constant(1, 1, -INFINITY);
  const auto m = merge_partial_states<Eigen::half>({a, b});
  EXPECT_TRUE(std::signbit(static_cast<float>(m.o(0, 0))) && std::signbit(static_cast<float>(m.o(0, 1))));
  EXPECT_EQ(m.lse(0, 0), 0.5f);
}
