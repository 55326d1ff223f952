// Regime agreement at operator level (SPEC §4.1/§4.2): the same keys/values and queries,
// computed as PT, SFT (any split), prefill, chunked prefill (random chunkings, P > 0) and
// decode steps, give bit-identical o / o_out / lse / lse_out rows at every absolute position,
// in float and in double.
#include "orthros_rc.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <omp.h>

#include <vector>

using namespace orthros;
using namespace orthros::testing;

namespace {

// All per-position tensors of one sequence of N positions: base queries Q, output queries
// Qo (one per position), keys/values K/V.
template <typename S>
struct Sequence {
  Mat<S> Q, Qo, K, V;
};

// Runs the operator on base positions [p0+1, p0+T] with output queries for the last T_out
// of them; the KV cache holds positions 1..p0+T.
template <typename S>
AttentionResult<S> run_call(const Sequence<S>& s, Index p0, Index T, Index T_out, const AttentionDims& dims,
                            const AttentionOptions& opt) {
  Mat<S> q = s.Q.middleRows(p0, T);
  Mat<S> q_out = s.Qo.middleRows(p0 + T - T_out, T_out);
  Mat<S> k = s.K.topRows(p0 + T), v = s.V.topRows(p0 + T);
  return orthros_attention<S>(q, k, v, q_out, dims, opt);
}

// Asserts that the rows of call result `r` (covering base positions p0+1..p0+T, output
// positions of the last T_out) equal the PT result `pt` bit for bit.
template <typename S>
void assert_rows_equal(const AttentionResult<S>& pt, const AttentionResult<S>& r, Index p0, Index T, Index T_out,
                       const std::string& regime) {
  for (Index i = 0; i < T; ++i) {
    const std::string at = regime + " base position " + std::to_string(p0 + i + 1);
    if (auto e = bitwise_row_diff(r.o, i, pt.o, p0 + i, at + " o")) RC_FAIL(*e);
    if (auto e = bitwise_row_diff(r.lse, i, pt.lse, p0 + i, at + " lse")) RC_FAIL(*e);
  }
  for (Index i = 0; i < T_out; ++i) {
    const Index pos = p0 + T - T_out + i;  // 0-based
    const std::string at = regime + " output position " + std::to_string(pos + 1);
    if (auto e = bitwise_row_diff(r.o_out, i, pt.o_out, pos, at + " o_out")) RC_FAIL(*e);
    if (auto e = bitwise_row_diff(r.lse_out, i, pt.lse_out, pos, at + " lse_out")) RC_FAIL(*e);
  }
}

template <typename S>
void regimes_agree_bitwise() {
  const AttentionDims dims = draw_dims();
  const Index N = *rc::gen::inRange<Index>(1, 17);
  AttentionOptions opt;
  opt.window = draw_window(N);
  if (*rc::gen::inRange(0, 3) == 0) opt.scale = *rc::gen::inRange(1, 97) / 32.0;
  const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
  RC_LOG() << "dtype=" << dtype_name<S>() << " H_q=" << dims.num_q_heads << " H_kv=" << dims.num_kv_heads
           << " D=" << dims.head_dim << " N=" << N << " w=" << opt.window << " seed=" << seed << "\n";
  Rng rng(seed);
  const Index cq = Index(dims.num_q_heads) * dims.head_dim, ckv = Index(dims.num_kv_heads) * dims.head_dim;
  Sequence<S> s{random_mat<S>(N, cq, rng, 2.0), random_mat<S>(N, cq, rng, 2.0), random_mat<S>(N, ckv, rng),
                random_mat<S>(N, ckv, rng)};

  // PT: every position is a base token and has an output token (T_out = T = N, P = 0).
  const auto pt = run_call(s, 0, N, N, dims, opt);
  RC_ASSERT(all_finite(pt.o) && all_finite(pt.o_out) && all_finite(pt.lse) && all_finite(pt.lse_out));

  // SFT: any split T_in + T_out = N.
  const Index sft_out = *rc::gen::inRange<Index>(0, N + 1);
  assert_rows_equal(pt, run_call(s, 0, N, sft_out, dims, opt), 0, N, sft_out, "SFT(T_out=" + std::to_string(sft_out) + ")");

  // Prefill of the prompt 1..N: one output query at the last prompt token.
  assert_rows_equal(pt, run_call(s, 0, N, 1, dims, opt), 0, N, 1, "prefill");

  // Chunked prefill: random chunk sizes, each chunk continuing from the cache of the previous
  // ones (P > 0), each with a random number of output queries in 0..T_chunk.
  {
    Index p0 = 0;
    int chunk = 0;
    while (p0 < N) {
      const Index T = *rc::gen::inRange<Index>(1, N - p0 + 1);
      const Index T_out = *rc::gen::inRange<Index>(0, T + 1);
      assert_rows_equal(pt, run_call(s, p0, T, T_out, dims, opt), p0, T, T_out,
                        "chunked prefill chunk " + std::to_string(chunk) + " (P=" + std::to_string(p0) +
                            ", T=" + std::to_string(T) + ", T_out=" + std::to_string(T_out) + ")");
      p0 += T;
      ++chunk;
    }
  }

  // Prefill of 1..n0 then decode steps t = n0+1..N (T = 1, P = t-1, T_out = 1).
  {
    const Index n0 = *rc::gen::inRange<Index>(0, N);
    if (n0 > 0) assert_rows_equal(pt, run_call(s, 0, n0, 1, dims, opt), 0, n0, 1, "prefill before decode");
    for (Index t = n0 + 1; t <= N; ++t)
      assert_rows_equal(pt, run_call(s, t - 1, 1, 1, dims, opt), t - 1, 1, 1, "decode step t=" + std::to_string(t));
  }
}

}  // namespace

// Proves SPEC §4.2 at operator level in double: PT, SFT (random split), prefill, chunked prefill
// (random chunking, random T_out per chunk incl. 0) and prefill + decode steps produce the same
// bits for o, o_out, lse and lse_out at every absolute position.
RC_GTEST_PROP(OperatorRegimes, BitwiseAgreementDouble, ()) { regimes_agree_bitwise<double>(); }

// Same in float.
RC_GTEST_PROP(OperatorRegimes, BitwiseAgreementFloat, ()) { regimes_agree_bitwise<float>(); }

// The oracle at kernel precision (bf16 / f16 storage, fp32 accumulation) is regime-invariant too:
// each row's arithmetic is independent of the call, so the same bits come out in every regime.
RC_GTEST_PROP(OperatorRegimes, BitwiseAgreementBFloat16, ()) { regimes_agree_bitwise<Eigen::bfloat16>(); }
RC_GTEST_PROP(OperatorRegimes, BitwiseAgreementHalf, ()) { regimes_agree_bitwise<Eigen::half>(); }

// Proves the oracle's bits do not depend on the OpenMP thread count (1 vs 2 vs 3 threads):
// each row is computed by one thread with a fixed order of operations.
RC_GTEST_PROP(OperatorRegimes, ThreadCountInvariance, ()) {
  const OpCase c = draw_op_case();
  RC_LOG() << c.describe() << "\n";
  const auto in = make_inputs<double>(c);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto r1 = orthros_attention<double>(in.q, in.k, in.v, in.q_out, c.dims, c.options());
  omp_set_num_threads(3);
  const auto r3 = orthros_attention<double>(in.q, in.k, in.v, in.q_out, c.dims, c.options());
  omp_set_num_threads(saved);
  for (auto e : {bitwise_diff(r1.o, r3.o, "o 1 vs 3 threads"), bitwise_diff(r1.o_out, r3.o_out, "o_out 1 vs 3 threads"),
                 bitwise_diff(r1.lse, r3.lse, "lse 1 vs 3 threads"),
                 bitwise_diff(r1.lse_out, r3.lse_out, "lse_out 1 vs 3 threads")})
    if (e) RC_FAIL(*e);
}
