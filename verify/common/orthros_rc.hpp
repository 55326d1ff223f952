/// \file orthros_rc.hpp
/// \brief rapidcheck helpers: drawing random attention-operator configurations inside a
/// property (every draw is part of the printed counterexample) and the rounding-error bound
/// used to compare the operator against the long-double transcription.
#pragma once

#include "orthros_testing.hpp"

#include <rapidcheck.h>

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>

namespace orthros::testing {

/// Fails the current rapidcheck property with the message of a comparison helper, if any.
inline void fail_if(const std::optional<std::string>& e) {
  if (e) RC_FAIL(*e);
}

/// One operator case: dims, lengths, window, optional scale and the seed of its tensors.
struct OpCase {
  AttentionDims dims;
  Index T = 0, T_out = 0, P = 0;
  std::int64_t window = 1;
  std::optional<double> scale;
  std::uint64_t seed = 0;

  long double scale_l() const { return scale ? static_cast<long double>(*scale) : default_scale(dims.head_dim); }
  AttentionOptions options() const {
    AttentionOptions o;
    o.window = window;
    o.scale = scale;
    return o;
  }
  std::string describe() const {
    std::ostringstream os;
    os << "H_q=" << dims.num_q_heads << " H_kv=" << dims.num_kv_heads << " D=" << dims.head_dim << " T=" << T
       << " T_out=" << T_out << " P=" << P << " w=" << window << " scale=" << (scale ? std::to_string(*scale) : "1/sqrt(D)")
       << " seed=" << seed;
    return os.str();
  }
};

/// Draws GQA dims: H_q/H_kv ratio in {1, 2, 3, 7}, H_kv in {1, 2}, D in a set with odd sizes.
inline AttentionDims draw_dims() {
  AttentionDims d;
  const int ratio = *rc::gen::element(1, 2, 3, 7);
  d.num_kv_heads = *rc::gen::inRange(1, 3);
  d.num_q_heads = ratio * d.num_kv_heads;
  d.head_dim = *rc::gen::element(1, 2, 3, 5, 8, 13, 16);
  return d;
}

/// Draws a window for a call that covers absolute positions up to `n`: w = 1, a random
/// w in [1, n+2] (so w < t, w = t and w > t all occur), or a huge w (plain causal).
inline std::int64_t draw_window(Index n) {
  const int kind = *rc::gen::inRange(0, 4);
  if (kind == 0) return 1;
  if (kind == 3) return std::int64_t(1) << 40;
  return *rc::gen::inRange<std::int64_t>(1, std::int64_t(n) + 3);
}

/// Draws a full operator case with T in [1, max_T], P in [0, max_P], T_out in [0, T],
/// and (with probability 1/3) a custom positive scale k/32, k in [1, 96].
inline OpCase draw_op_case(Index max_T = 12, Index max_P = 10) {
  OpCase c;
  c.dims = draw_dims();
  c.T = *rc::gen::inRange<Index>(1, max_T + 1);
  c.P = *rc::gen::inRange<Index>(0, max_P + 1);
  c.T_out = *rc::gen::inRange<Index>(0, c.T + 1);
  c.window = draw_window(c.P + c.T);
  if (*rc::gen::inRange(0, 3) == 0) c.scale = *rc::gen::inRange(1, 97) / 32.0;
  c.seed = *rc::gen::arbitrary<std::uint64_t>();
  return c;
}

/// Random inputs of an OpCase at scalar type S (queries with amplitude q_amp, k/v in [-1,1]).
template <typename S>
struct OpInputs {
  Mat<S> q, k, v, q_out;
};
template <typename S>
OpInputs<S> make_inputs(const OpCase& c, double q_amp = 2.0) {
  Rng rng(c.seed);
  const Index cq = Index(c.dims.num_q_heads) * c.dims.head_dim, ckv = Index(c.dims.num_kv_heads) * c.dims.head_dim;
  OpInputs<S> in;
  in.q = random_mat<S>(c.T, cq, rng, q_amp);
  in.k = random_mat<S>(c.P + c.T, ckv, rng);
  in.v = random_mat<S>(c.P + c.T, ckv, rng);
  in.q_out = random_mat<S>(c.T_out, cq, rng, q_amp);
  return in;
}

/// Forward rounding-error bound of one attention row computed with unit roundoff u
/// (u = 2^-53 double, 2^-24 float), relative to the exact result:
///   score error   e   <= scale * gamma_{D+1} * max_j sum_d |q_d k_jd|   (dot product + scale multiply)
///   probabilities p_j perturbed by a factor in [exp(-2e), exp(2e)], plus (n + 4) u from
///                 exp, the sum of n terms, the division and the rounding of p;
///   output        sum of n products (gamma_n) plus the final rounding.
/// => |o_hat - o| <= 2 * [(exp(2e) - 1) + (2n + 8) u] * max_j |v_j|   (factor 2: libm exp/log ulps)
///    |lse_hat - lse| <= 2 * [e + (n + 4) u + u |lse|]
struct RowBound {
  long double o, lse;
};
inline RowBound attention_row_bound(long double u, int D, Index n, long double score_abs_sum_max, long double vmax,
                                    long double scale, long double lse_abs) {
  const long double gamma = (D + 1) * u / (1 - (D + 1) * u);
  const long double e = std::fabs(scale) * gamma * score_abs_sum_max;
  RowBound b;
  b.o = 2 * ((std::exp(2 * e) - 1) + (2 * n + 8) * u) * vmax;
  b.lse = 2 * (e + (n + 4) * u + u * lse_abs);
  return b;
}

/// Compares an operator result against the transcription with the per-row bound above.
/// Returns nullopt on agreement, else a message naming the stream, row, head and values.
template <typename S>
std::optional<std::string> compare_to_transcription(const OpCase& c, const OpInputs<S>& in,
                                                    const AttentionResult<S>& r, const TranscriptionResult& ref,
                                                    long double u) {
  const int Hq = c.dims.num_q_heads, Hkv = c.dims.num_kv_heads, D = c.dims.head_dim, group = Hq / Hkv;
  const long double s = c.scale_l();
  auto check_stream = [&](bool base) -> std::optional<std::string> {
    const Index rows = base ? c.T : c.T_out;
    const Mat<S>& qm = base ? in.q : in.q_out;
    for (Index i = 0; i < rows; ++i) {
      const Index t = base ? c.P + i + 1 : c.P + (c.T - c.T_out) + i + 1;  // 1-based position
      const Index lo = base ? std::max<Index>(1, t - c.window + 1) : 1;
      for (int h = 0; h < Hq; ++h) {
        const int g = h / group;
        long double smax = 0, vmax = 0;
        for (Index j = lo; j <= t; ++j) {
          long double acc = 0;
          for (int d = 0; d < D; ++d) {
            acc += std::fabs(static_cast<long double>(static_cast<double>(qm(i, Index(h) * D + d))) *
                             static_cast<long double>(static_cast<double>(in.k(j - 1, Index(g) * D + d))));
            vmax = std::max(vmax, std::fabs(static_cast<long double>(static_cast<double>(in.v(j - 1, Index(g) * D + d)))));
          }
          smax = std::max(smax, acc);
        }
        const long double ref_lse = base ? ref.lse(i, h) : ref.lse_out(i, h);
        const RowBound b = attention_row_bound(u, D, t - lo + 1, smax, vmax, s, std::fabs(ref_lse));
        const long double got_lse = base ? r.lse(i, h) : r.lse_out(i, h);
        std::ostringstream os;
        os.precision(19);
        if (!(std::fabs(got_lse - ref_lse) <= b.lse)) {
          os << (base ? "lse" : "lse_out") << " row " << i << " (t=" << t << ") head " << h << ": " << got_lse
             << " vs transcription " << ref_lse << " (bound " << b.lse << ")";
          return os.str();
        }
        for (int d = 0; d < D; ++d) {
          const long double got = static_cast<double>((base ? r.o : r.o_out)(i, Index(h) * D + d));
          const long double want = (base ? ref.o : ref.o_out)(i, Index(h) * D + d);
          if (!(std::fabs(got - want) <= b.o)) {
            os << (base ? "o" : "o_out") << " row " << i << " (t=" << t << ") head " << h << " d " << d << ": " << got
               << " vs transcription " << want << " (bound " << b.o << ")";
            return os.str();
          }
        }
      }
    }
    return std::nullopt;
  };
  if (auto e = check_stream(true)) return e;
  return check_stream(false);
}

}  // namespace orthros::testing
