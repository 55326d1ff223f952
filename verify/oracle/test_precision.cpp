// Precision modes (SPEC §6 "oracle at the kernel's own precision"): orthros_attention at
// bf16 / f16 (fp32 accumulation) and at f32, against the double oracle on the same rounded inputs.
#include "orthros_rc.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

using namespace orthros;
using namespace orthros::testing;

namespace {

// Rigorous per-element error bound of the oracle at storage type S (unit roundoff u_S:
// 2^-8 bf16, 2^-11 f16, 2^-24 f32) with fp32 accumulation (unit roundoff u_A = 2^-24), relative
// to the exact attention of the same (rounded) inputs:
//   score  s_j = S(fl32(q.k_j) * s):  |Δs_j| <= δ := u_S max|s_j| + (D+2) u_A s max_j sum|q k_j|
//   softmax weights: factor in [exp(-2δ), exp(2δ)], then exp, sum of n, division, S-rounding of
//          p_j: relative (n+3) u_A + u_S
//   output: fp32 sum of n products (n u_A) and S-rounding (u_S |o|)
//   => |o_S - o| <= [(exp(2δ) - 1) + 2 u_S + (2n + 4) u_A] * sum_j p_j |v_jd|
//      |lse_S - lse| <= δ + (n + 4 + |lse|) u_A
// sum_j p_j |v_jd| is the exact attention of |v| (long-double transcription with v -> |v|).
// A factor 1.5 covers libm exp/log (< 1 ulp each) and second-order terms.
template <typename S>
void low_precision_within_derived_bound() {
  OpCase c = draw_op_case(16, 10);
  RC_LOG() << dtype_name<S>() << " " << c.describe() << "\n";
  const auto in = make_inputs<S>(c, 2.0);  // drawn in double, rounded to S
  const auto lo = orthros_attention<S>(in.q, in.k, in.v, in.q_out, c.dims, c.options());
  RC_ASSERT(all_finite(lo.o) && all_finite(lo.o_out) && all_finite(lo.lse) && all_finite(lo.lse_out));
  const Mat<S> v_abs = in.v.cwiseAbs();
  const auto ref = transcribe_attention(in.q, in.k, in.v, in.q_out, c.dims, c.window, c.scale_l());
  const auto mag = transcribe_attention(in.q, in.k, v_abs, in.q_out, c.dims, c.window, c.scale_l());
  const long double uS = unit_roundoff<S>(), uA = unit_roundoff<AccumT<S>>(), s = c.scale_l();
  // Global maxima over every query row / key (conservative: the bound per row uses the worst row).
  long double smax = 0, sabs = 0;
  const int Hq = c.dims.num_q_heads, D = c.dims.head_dim, group = Hq / c.dims.num_kv_heads;
  for (const Mat<S>* qm : {&in.q, &in.q_out})
    for (Index i = 0; i < qm->rows(); ++i)
      for (int h = 0; h < Hq; ++h)
        for (Index j = 0; j < in.k.rows(); ++j) {
          long double dot = 0, ad = 0;
          for (int d = 0; d < D; ++d) {
            const long double x = (long double)(double)(*qm)(i, Index(h) * D + d) *
                                  (long double)(double)in.k(j, Index(h / group) * D + d);
            dot += x;
            ad += std::fabs(x);
          }
          smax = std::max(smax, std::fabs(s * dot));
          sabs = std::max(sabs, ad);
        }
  const long double n = static_cast<long double>(c.P + c.T);
  const long double delta = uS * smax + (D + 2) * uA * std::fabs(s) * sabs;
  const long double factor = 1.5L * ((std::exp(2 * delta) - 1) + 2 * uS + (2 * n + 4) * uA);
  for (int stream = 0; stream < 2; ++stream) {
    const Mat<S>& got = stream == 0 ? lo.o : lo.o_out;
    const MatL& want = stream == 0 ? ref.o : ref.o_out;
    const MatL& amag = stream == 0 ? mag.o : mag.o_out;
    for (Index i = 0; i < got.rows(); ++i)
      for (Index col = 0; col < got.cols(); ++col) {
        const long double err = std::fabs((long double)(double)got(i, col) - want(i, col));
        if (!(err <= factor * amag(i, col)))
          RC_FAIL((stream == 0 ? "o" : "o_out") + std::string(" [") + std::to_string(i) + ", " + std::to_string(col) +
                  "]: error " + std::to_string((double)err) + " > bound " + std::to_string((double)(factor * amag(i, col))));
      }
    const auto& glse = stream == 0 ? lo.lse : lo.lse_out;
    const MatL& wlse = stream == 0 ? ref.lse : ref.lse_out;
    for (Index i = 0; i < glse.rows(); ++i)
      for (int h = 0; h < Hq; ++h) {
        const long double err = std::fabs((long double)glse(i, h) - wlse(i, h));
        RC_ASSERT(err <= 1.5L * (delta + (n + 4 + std::fabs(wlse(i, h))) * uA));
      }
  }
}

// SPEC §6's relative tolerances (1e-2 bf16, 2e-3 f16, 1e-5 f32) are statistics over a whole
// output; the naive oracle at kernel precision must meet them at kernel-like shapes (else no
// kernel could). Expected: errors of independent roundings average to ~u_S in relative
// Frobenius norm (o is a weighted average of values of random sign, and the p_j roundings are
// independent over j), i.e. ~4e-3 bf16, ~5e-4 f16, ~6e-8 f32, all below the thresholds.
// Shapes: D in {32, 64, 128}, GQA 4/2, 8/2, 7/1, P+T in [24, 96], w in [1, 64] or huge.
template <typename S>
void low_precision_meets_spec_tolerance(long double rel_tol) {
  OpCase c;
  c.dims.head_dim = *rc::gen::element(32, 64, 128);
  const int pick = *rc::gen::inRange(0, 3);
  c.dims.num_q_heads = pick == 0 ? 4 : pick == 1 ? 8 : 7;
  c.dims.num_kv_heads = pick == 2 ? 1 : 2;
  c.T = *rc::gen::inRange<Index>(16, 65);
  c.P = *rc::gen::inRange<Index>(0, 33);
  c.T_out = *rc::gen::inRange<Index>(8, c.T + 1);
  c.window = *rc::gen::element<std::int64_t>(1, 4, 16, 64, std::int64_t(1) << 40);
  c.seed = *rc::gen::arbitrary<std::uint64_t>();
  RC_LOG() << dtype_name<S>() << " " << c.describe() << "\n";
  const auto in = make_inputs<S>(c, 1.0);
  const OpInputs<double> wide{to_double(in.q), to_double(in.k), to_double(in.v), to_double(in.q_out)};
  const auto lo = orthros_attention<S>(in.q, in.k, in.v, in.q_out, c.dims, c.options());
  const auto hi = orthros_attention<double>(wide.q, wide.k, wide.v, wide.q_out, c.dims, c.options());
  RC_ASSERT(all_finite(lo.o) && all_finite(lo.o_out));
  const long double e_o = rel_frobenius(lo.o, hi.o), e_out = rel_frobenius(lo.o_out, hi.o_out);
  RC_LOG() << "rel err o = " << (double)e_o << ", o_out = " << (double)e_out << "\n";
  RC_ASSERT(e_o <= rel_tol);
  RC_ASSERT(e_out <= rel_tol);
}

}  // namespace

// Proves: the bf16 / f16 / f32 oracles (fp32 accumulation for bf16/f16) are within the derived
// per-element rounding bound of the exact attention of the same rounded inputs, for every random
// configuration (GQA 1/2/3/7, odd D, P > 0, any w, custom scale), with finite outputs.
RC_GTEST_PROP(OraclePrecision, BFloat16WithinDerivedBound, ()) { low_precision_within_derived_bound<Eigen::bfloat16>(); }
RC_GTEST_PROP(OraclePrecision, HalfWithinDerivedBound, ()) { low_precision_within_derived_bound<Eigen::half>(); }
RC_GTEST_PROP(OraclePrecision, FloatWithinDerivedBound, ()) { low_precision_within_derived_bound<float>(); }

// Proves: at kernel-like shapes the oracle at kernel precision meets SPEC §6's relative
// Frobenius tolerance against the double oracle (1e-2 bf16, 2e-3 f16, 1e-5 f32).
RC_GTEST_PROP(OraclePrecision, BFloat16MeetsSpecTolerance, ()) { low_precision_meets_spec_tolerance<Eigen::bfloat16>(1e-2L); }
RC_GTEST_PROP(OraclePrecision, HalfMeetsSpecTolerance, ()) { low_precision_meets_spec_tolerance<Eigen::half>(2e-3L); }
RC_GTEST_PROP(OraclePrecision, FloatMeetsSpecTolerance, ()) { low_precision_meets_spec_tolerance<float>(1e-5L); }
