// SPEC §4.4 special cases as exact (bitwise) properties of the operator.
#include "orthros_rc.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

using namespace orthros;
using namespace orthros::testing;

namespace {

// w >= every position in the call (w >= P+T): the base stream is plain causal attention, i.e.
// the output stream run with q_out = q (T_out = T). Bitwise, o and lse.
template <typename S>
void window_ge_T_is_causal() {
  OpCase c = draw_op_case();
  c.window = *rc::gen::element<std::int64_t>(c.P + c.T, c.P + c.T + 1, c.P + c.T + 7, std::int64_t(1) << 40);
  c.T_out = c.T;
  RC_LOG() << dtype_name<S>() << " " << c.describe() << "\n";
  auto in = make_inputs<S>(c);
  in.q_out = in.q;
  const auto r = orthros_attention<S>(in.q, in.k, in.v, in.q_out, c.dims, c.options());
  fail_if(bitwise_diff(r.o, r.o_out, "o (w >= P+T) vs causal o_out with q_out = q"));
  fail_if(bitwise_diff(r.lse, r.lse_out, "lse (w >= P+T) vs causal lse_out with q_out = q"));
}

// w = 1: each base token sees only itself, so o_t = v_t exactly (query head h reads KV head
// h / (H_q/H_kv)), and lse_t = s q_t.k_t (one key, log(1) = 0) within the dot-product
// rounding bound gamma_{D+1} s sum_d |q_d k_d| at the accumulator's unit roundoff.
template <typename S>
void window_one_gives_value() {
  OpCase c = draw_op_case();
  c.window = 1;
  RC_LOG() << dtype_name<S>() << " " << c.describe() << "\n";
  const auto in = make_inputs<S>(c);
  const auto r = orthros_attention<S>(in.q, in.k, in.v, in.q_out, c.dims, c.options());
  const int Hq = c.dims.num_q_heads, D = c.dims.head_dim, group = Hq / c.dims.num_kv_heads;
  using Acc = AccumT<S>;
  const long double u = unit_roundoff<Acc>();
  const long double s = c.scale_l();
  for (Index i = 0; i < c.T; ++i)
    for (int h = 0; h < Hq; ++h) {
      const Index kv_row = c.P + i, kv_col = Index(h / group) * D;
      long double dot = 0, absdot = 0;
      for (int d = 0; d < D; ++d) {
        RC_ASSERT(std::memcmp(&r.o(i, Index(h) * D + d), &in.v(kv_row, kv_col + d), sizeof(S)) == 0);
        const long double x = static_cast<double>(in.q(i, Index(h) * D + d)) * 1.0L *
                              static_cast<double>(in.k(kv_row, kv_col + d));
        dot += x;
        absdot += std::fabs(x);
      }
      // For bf16/f16 the score is also rounded to S before the softmax: add half an S-ulp.
      const long double uS = unit_roundoff<S>();
      const long double bound = (D + 1) * u * s * absdot + uS * std::fabs(s * dot) * 1.0001L + 1e-300L;
      RC_ASSERT(std::fabs(static_cast<long double>(r.lse(i, h)) - s * dot) <= bound);
    }
}

// H_kv = H_q with every KV head repeated H_q/H_kv times equals grouped-query attention, bitwise.
template <typename S>
void repeated_kv_equals_gqa() {
  OpCase c = draw_op_case();
  RC_LOG() << dtype_name<S>() << " " << c.describe() << "\n";
  const auto in = make_inputs<S>(c);
  const int Hq = c.dims.num_q_heads, D = c.dims.head_dim, group = Hq / c.dims.num_kv_heads;
  Mat<S> k_rep(in.k.rows(), Index(Hq) * D), v_rep(in.v.rows(), Index(Hq) * D);
  for (int h = 0; h < Hq; ++h) {
    k_rep.middleCols(Index(h) * D, D) = in.k.middleCols(Index(h / group) * D, D);
    v_rep.middleCols(Index(h) * D, D) = in.v.middleCols(Index(h / group) * D, D);
  }
  const auto gqa = orthros_attention<S>(in.q, in.k, in.v, in.q_out, c.dims, c.options());
  const auto mha = orthros_attention<S>(in.q, k_rep, v_rep, in.q_out, AttentionDims{Hq, Hq, D}, c.options());
  fail_if(bitwise_diff(mha.o, gqa.o, "o: MHA with repeated KV vs GQA"));
  fail_if(bitwise_diff(mha.o_out, gqa.o_out, "o_out: MHA with repeated KV vs GQA"));
  fail_if(bitwise_diff(mha.lse, gqa.lse, "lse: MHA with repeated KV vs GQA"));
  fail_if(bitwise_diff(mha.lse_out, gqa.lse_out, "lse_out: MHA with repeated KV vs GQA"));
}

// The output stream is full causal attention whatever the window: o_out / lse_out are
// bitwise identical for two different windows, and the base stream is unaffected by q_out.
template <typename S>
void output_stream_ignores_window() {
  OpCase c = draw_op_case();
  RC_LOG() << dtype_name<S>() << " " << c.describe() << "\n";
  const auto in = make_inputs<S>(c);
  AttentionOptions o1 = c.options(), o2 = c.options();
  o2.window = *rc::gen::inRange<std::int64_t>(1, c.P + c.T + 3);
  const auto r1 = orthros_attention<S>(in.q, in.k, in.v, in.q_out, c.dims, o1);
  const auto r2 = orthros_attention<S>(in.q, in.k, in.v, in.q_out, c.dims, o2);
  fail_if(bitwise_diff(r1.o_out, r2.o_out, "o_out under windows " + std::to_string(o1.window) + " / " +
                                                   std::to_string(o2.window)));
  fail_if(bitwise_diff(r1.lse_out, r2.lse_out, "lse_out under two windows"));
  // Base stream without any output queries (a non-last prefill chunk) is the same as with them.
  const Mat<S> none(0, in.q_out.cols());
  const auto r3 = orthros_attention<S>(in.q, in.k, in.v, none, c.dims, o1);
  fail_if(bitwise_diff(r3.o, r1.o, "o with T_out = 0 vs T_out = " + std::to_string(c.T_out)));
  fail_if(bitwise_diff(r3.lse, r1.lse, "lse with T_out = 0"));
}

}  // namespace

// Proves SPEC §4.4 "w >= T makes the base stream plain causal attention" (bitwise, incl. P > 0).
RC_GTEST_PROP(SpecialCases, WindowAtLeastTIsCausalDouble, ()) { window_ge_T_is_causal<double>(); }
RC_GTEST_PROP(SpecialCases, WindowAtLeastTIsCausalFloat, ()) { window_ge_T_is_causal<float>(); }

// Proves SPEC §4.4 / §8 "w = 1 gives o_t = v_t" exactly, in every dtype incl. bf16/f16, and lse = s q.k.
RC_GTEST_PROP(SpecialCases, WindowOneGivesValueDouble, ()) { window_one_gives_value<double>(); }
RC_GTEST_PROP(SpecialCases, WindowOneGivesValueFloat, ()) { window_one_gives_value<float>(); }
RC_GTEST_PROP(SpecialCases, WindowOneGivesValueBFloat16, ()) { window_one_gives_value<Eigen::bfloat16>(); }
RC_GTEST_PROP(SpecialCases, WindowOneGivesValueHalf, ()) { window_one_gives_value<Eigen::half>(); }

// Proves SPEC §4.4 "H_kv = H_q with KV heads repeated equals GQA" bitwise (ratios 1, 2, 3, 7).
RC_GTEST_PROP(SpecialCases, RepeatedKvEqualsGqaDouble, ()) { repeated_kv_equals_gqa<double>(); }
RC_GTEST_PROP(SpecialCases, RepeatedKvEqualsGqaFloat, ()) { repeated_kv_equals_gqa<float>(); }

// Proves the two streams are decoupled: o_out does not depend on w; o does not depend on q_out / T_out.
RC_GTEST_PROP(SpecialCases, OutputStreamIgnoresWindowDouble, ()) { output_stream_ignores_window<double>(); }
RC_GTEST_PROP(SpecialCases, OutputStreamIgnoresWindowFloat, ()) { output_stream_ignores_window<float>(); }
