// The Orthros attention layer against an independent long-double transcription of SPEC §2:
//   k_i = RoPE(norm_k(x_i W_K), i), v_i = x_i W_V,
//   q_i = RoPE(alpha ⊙ norm_q(x_i W_Q) + beta, i), q'_i = RoPE(alpha' ⊙ norm_q(x'_i W_Q) + beta', i),
//   [o; o'] from the masked-softmax transcription, y = o W_O, y' = o' W_O.
// RoPE here is the complex rotation of pair (x_j, x_{j+D/2}) by pos * theta^(-2j/D), with the
// 0-based position pos = t - 1 of absolute position t; the output token uses its base position.
#include "orthros_model_rc.hpp"

#include "orthros/layer.hpp"
#include "orthros/model.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <complex>

using namespace orthros;
using namespace orthros::testing;

namespace {

MatL widen(const Mat<double>& m) { return m.cast<long double>(); }

// Per-head RMSNorm (weight g) of every row, in long double.
void rms_heads(MatL& a, const Vec<double>& g, int D, double eps) {
  for (Index r = 0; r < a.rows(); ++r)
    for (Index h = 0; h < a.cols() / D; ++h) {
      long double ms = 0;
      for (int d = 0; d < D; ++d) ms += a(r, h * D + d) * a(r, h * D + d);
      const long double inv = 1.0L / std::sqrt(ms / D + eps);
      for (int d = 0; d < D; ++d) a(r, h * D + d) *= inv * g[d];
    }
}

// RoPE as complex multiplication, row r at 0-based position pos[r].
void rope_complex(MatL& a, int D, const std::vector<Index>& pos, double theta) {
  for (Index r = 0; r < a.rows(); ++r)
    for (Index h = 0; h < a.cols() / D; ++h)
      for (int j = 0; j < D / 2; ++j) {
        const long double ang = static_cast<long double>(pos[size_t(r)]) * std::pow((long double)theta, -2.0L * j / D);
        const std::complex<long double> z(a(r, h * D + j), a(r, h * D + j + D / 2));
        const std::complex<long double> zr = z * std::polar(1.0L, ang);
        a(r, h * D + j) = zr.real();
        a(r, h * D + j + D / 2) = zr.imag();
      }
}

MatL queries(const AttentionWeights<double>& w, const AttentionConfig& cfg, const Mat<double>& x,
             const Vec<double>& alpha, const Vec<double>& beta, const std::vector<Index>& pos) {
  MatL q = widen(x) * widen(w.w_q);
  if (cfg.qk_norm) rms_heads(q, w.q_norm, cfg.head_dim, cfg.rms_eps);
  for (Index r = 0; r < q.rows(); ++r)
    for (Index c = 0; c < q.cols(); ++c) q(r, c) = alpha[c] * q(r, c) + beta[c];
  rope_complex(q, cfg.head_dim, pos, cfg.rope_theta);
  return q;
}

}  // namespace

// Proves the layer computes SPEC §2 (QK-norm before scale-offset, scale-offset before RoPE,
// output token at its base token's position, GQA, window, shared W_O), after a cached prefix of
// P tokens: relative Frobenius error of y and y' against the long-double transcription <= 1e-11
// (double rounding through projections of width <= 16, RMSNorm, RoPE and softmax with |scores|
// of order sqrt(D) accumulates ~1e-14; the bound leaves 1000x).
RC_GTEST_PROP(LayerTranscription, DoubleMatchesSpec, ()) {
  const Index P = *rc::gen::inRange<Index>(0, 6), T = *rc::gen::inRange<Index>(1, 9);
  const Index T_out = *rc::gen::inRange<Index>(0, T + 1);
  ModelConfig c = draw_tiny_model_config(P + T);
  c.num_layers = 1;
  const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
  RC_LOG() << describe(c) << " P=" << P << " T=" << T << " T_out=" << T_out << " seed=" << seed << "\n";
  const AttentionWeights<double> w = random_weights<double>(c, seed).layers[0].attn;
  const AttentionConfig& a = c.attn;
  Rng rng(seed + 1);
  const Mat<double> x_all = random_mat<double>(P + T, c.d_model, rng), x_out = random_mat<double>(T_out, c.d_model, rng);
  const Mat<double> x_prev = x_all.topRows(P), x = x_all.bottomRows(T), none(0, c.d_model);

  KVCache<double> cache{Mat<double>(0, Index(a.num_kv_heads) * a.head_dim), Mat<double>(0, Index(a.num_kv_heads) * a.head_dim)};
  if (P > 0) orthros_attention_layer<double>(w, a, x_prev, none, cache);
  const auto got = orthros_attention_layer<double>(w, a, x, x_out, cache);

  std::vector<Index> pos_all(static_cast<size_t>(P + T)), pos_base(static_cast<size_t>(T)),
      pos_out(static_cast<size_t>(T_out));
  for (Index i = 0; i < P + T; ++i) pos_all[size_t(i)] = i;
  for (Index i = 0; i < T; ++i) pos_base[size_t(i)] = P + i;
  for (Index i = 0; i < T_out; ++i) pos_out[size_t(i)] = P + T - T_out + i;  // base token's position
  MatL k = widen(x_all) * widen(w.w_k);
  if (a.qk_norm) rms_heads(k, w.k_norm, a.head_dim, a.rms_eps);
  rope_complex(k, a.head_dim, pos_all, a.rope_theta);
  const MatL v = widen(x_all) * widen(w.w_v);
  const MatL q = queries(w, a, x, w.alpha, w.beta, pos_base);
  const MatL qo = queries(w, a, x_out, w.alpha_out, w.beta_out, pos_out);
  const auto att = transcribe_attention(q, k, v, qo, a.dims(), a.window, default_scale(a.head_dim));
  const MatL y = att.o * widen(w.w_o), yo = att.o_out * widen(w.w_o);

  RC_ASSERT(all_finite(got.first) && all_finite(got.second));
  RC_ASSERT(got.first.rows() == T && got.second.rows() == T_out);
  const long double ey = rel_frobenius(got.first, Mat<double>(y.cast<double>()));
  RC_LOG() << "rel err y = " << (double)ey << "\n";
  RC_ASSERT(ey <= 1e-11L);
  if (T_out > 0) {
    const long double eo = rel_frobenius(got.second, Mat<double>(yo.cast<double>()));
    RC_LOG() << "rel err y' = " << (double)eo << "\n";
    RC_ASSERT(eo <= 1e-11L);
  }
  // The cache holds post-RoPE keys and values of all P+T positions.
  RC_ASSERT(rel_frobenius(cache.k, Mat<double>(k.cast<double>())) <= 1e-12L);
  RC_ASSERT(rel_frobenius(cache.v, Mat<double>(v.cast<double>())) <= 1e-12L);
}
