/// \file layer_backward.hpp
/// \brief The backward of the Orthros attention layer (layer.hpp; paper Algorithm 1) for a training
/// call (one sequence, empty KV cache: PT or SFT): from dL/dy and dL/dy' to dL/dx, dL/dx' and the
/// gradient of every weight — W_O, the shared W_Q/W_K/W_V, the scale-offsets α β α' β' and the
/// QK-norm gains.
///
/// The forward, stage by stage (SPEC §2), and the backward of each stage, applied in reverse:
/// \code{.unparsed}
///   y = o W_O, y' = o' W_O          dW_O = oᵀdy + o'ᵀdy',  do = dy W_Oᵀ,  do' = dy' W_Oᵀ
///   (o, o') = attention(q, k, v, q')  attention_backward.hpp: dq, dq', dk, dv
///   q = RoPE(q̂, i), k = RoPE(k̂, i)   dq̂ = RoPE⁻¹(dq): rope.hpp apply_rope_backward
///   q̂ = α ⊙ n + β (q̂' with α', β') dα = Σ_rows dq̂ ⊙ n,  dβ = Σ_rows dq̂,  dn = α ⊙ dq̂
///   n = norm_q(x W_Q), k̂ = norm_k(x W_K)  rms_norm_groups_backward (below); the q gain sums both streams
///   x W_Q, x' W_Q, x W_K, x W_V     dW = xᵀ d(·) (+ x'ᵀ d(·) for W_Q),  dx = Σ d(·) Wᵀ,  dx' = d(q-lin') W_Qᵀ
/// \endcode
/// Every sum has a fixed order (rows ascending, base rows before output rows), so an output row
/// whose upstream gradient is zero adds exact zeros: what makes SFT equal masked PT bitwise.
#pragma once

#include "orthros/attention_backward.hpp"
#include "orthros/layer.hpp"

#include <cstdint>
#include <vector>

namespace orthros {

namespace detail {

/// dL/dx of y = x W: `dy W^T`, [N, in], each entry summed over the output features ascending.
template <typename S>
Mat<S> project_backward_input(const Mat<S>& dy, const Mat<S>& w) {
  using Acc = AccumT<S>;
  require(dy.cols() == w.cols(), "projection backward: dy has ", dy.cols(), " columns but W has ", w.cols());
  Mat<S> dx(dy.rows(), w.rows());
#pragma omp parallel for schedule(static) if (dy.rows() >= 8)
  for (Eigen::Index r = 0; r < dy.rows(); ++r)
    for (Eigen::Index i = 0; i < w.rows(); ++i) {
      Acc acc = 0;
      for (Eigen::Index j = 0; j < w.cols(); ++j) acc += static_cast<Acc>(dy(r, j)) * static_cast<Acc>(w(i, j));
      dx(r, i) = static_cast<S>(acc);
    }
  return dx;
}

/// dW += x^T dy for y = x W: dW(i, j) += Σ_r x(r, i) dy(r, j), rows r ascending. Call it for the
/// base rows, then the output rows, to sum both streams in the fixed order.
template <typename S>
void project_backward_weight(Mat<S>& dw, const Mat<S>& x, const Mat<S>& dy) {
  using Acc = AccumT<S>;
  require(x.rows() == dy.rows() && dw.rows() == x.cols() && dw.cols() == dy.cols(),
          "projection backward: dW [", dw.rows(), ", ", dw.cols(), "], x [", x.rows(), ", ", x.cols(), "], dy [",
          dy.rows(), ", ", dy.cols(), "] do not match");
#pragma omp parallel for schedule(static) if (dw.rows() >= 8 && x.rows() >= 8)
  for (Eigen::Index i = 0; i < dw.rows(); ++i)
    for (Eigen::Index r = 0; r < x.rows(); ++r) {
      const Acc xi = static_cast<Acc>(x(r, i));
      for (Eigen::Index j = 0; j < dw.cols(); ++j)
        dw(i, j) = static_cast<S>(static_cast<Acc>(dw(i, j)) + xi * static_cast<Acc>(dy(r, j)));
    }
}

/// Elementwise a + b.
template <typename S>
Mat<S> add(const Mat<S>& a, const Mat<S>& b) {
  require(a.rows() == b.rows() && a.cols() == b.cols(), "add: shapes differ");
  Mat<S> c(a.rows(), a.cols());
  for (Eigen::Index i = 0; i < a.size(); ++i)
    c.data()[i] = static_cast<S>(static_cast<AccumT<S>>(a.data()[i]) + static_cast<AccumT<S>>(b.data()[i]));
  return c;
}

}  // namespace detail

/// Backward of rms_norm_groups (layer.hpp): for each group of `group` values x with
/// `r = 1/sqrt(mean(x^2) + eps)` and `y_i = x_i r g_i`,
///   dL/dx_k = r g_k dy_k - x_k r^3 / group · Σ_i dy_i g_i x_i
///   dL/dg_i += Σ_groups dy_i x_i r                                   (rows, then groups, ascending)
/// \param x      [N, k*group] the norm's INPUT (before normalization)
/// \param weight [group] gain g; \param group width of a group; \param eps as in the forward
/// \param dy     [N, k*group] dL/dy
/// \param dweight [group] gain gradient, accumulated into (+=)
/// \returns dL/dx [N, k*group]. \throws orthros::Error on shapes that do not match.
template <typename S>
Mat<S> rms_norm_groups_backward(const Mat<S>& x, const Vec<S>& weight, int group, double eps, const Mat<S>& dy,
                                Vec<S>& dweight) {
  using Acc = AccumT<S>;
  require(weight.size() == group && dweight.size() == group && x.cols() % group == 0 && dy.rows() == x.rows() &&
              dy.cols() == x.cols(),
          "rms_norm backward: weight ", weight.size(), ", dweight ", dweight.size(), ", x [", x.rows(), ", ", x.cols(),
          "], dy [", dy.rows(), ", ", dy.cols(), "] for groups of ", group);
  Mat<S> dx(x.rows(), x.cols());
  std::vector<Acc> dg(static_cast<size_t>(group), Acc(0));
  for (Eigen::Index r = 0; r < x.rows(); ++r)
    for (Eigen::Index c0 = 0; c0 < x.cols(); c0 += group) {
      const S* xp = x.data() + r * x.cols() + c0;
      const S* dyp = dy.data() + r * dy.cols() + c0;
      Acc ss = 0, dot = 0;
      for (int i = 0; i < group; ++i) ss += static_cast<Acc>(xp[i]) * static_cast<Acc>(xp[i]);
      const Acc inv = Acc(1) / std::sqrt(ss / static_cast<Acc>(group) + static_cast<Acc>(eps));  // r
      for (int i = 0; i < group; ++i)
        dot += static_cast<Acc>(dyp[i]) * static_cast<Acc>(weight[i]) * static_cast<Acc>(xp[i]);
      const Acc coef = inv * inv * inv * dot / static_cast<Acc>(group);
      for (int i = 0; i < group; ++i) {
        const Acc xi = static_cast<Acc>(xp[i]), dyi = static_cast<Acc>(dyp[i]);
        dx(r, c0 + i) = static_cast<S>(inv * static_cast<Acc>(weight[i]) * dyi - xi * coef);
        dg[static_cast<size_t>(i)] += dyi * xi * inv;
      }
    }
  for (int i = 0; i < group; ++i) dweight[i] = static_cast<S>(static_cast<Acc>(dweight[i]) + dg[static_cast<size_t>(i)]);
  return dx;
}

/// Every intermediate of one layer's training forward (one sequence, empty cache), kept for the
/// backward. `y`/`y_out` are bitwise those of orthros_attention_layer on an empty cache.
template <typename S>
struct LayerActivations {
  std::vector<std::int64_t> pos;      ///< 0-based RoPE positions of the base rows
  std::vector<std::int64_t> pos_out;  ///< 0-based RoPE positions of the output rows
  detail::QueryStages<S> q;           ///< base query stages
  detail::QueryStages<S> q_out;       ///< output-specific query stages
  detail::KeyStages<S> k;             ///< key stages
  Mat<S> v;                           ///< [T, H_kv*D] values
  AttentionResult<S> attn;            ///< o, o_out, lse, lse_out
  Mat<S> y;                           ///< [T, d_model]
  Mat<S> y_out;                       ///< [T_out, d_model]
};

/// Training forward of one layer (paper Algorithm 1 with P = 0), keeping every intermediate.
/// \param w     layer weights; \param cfg its configuration
/// \param x     [T, d_model] base rows (positions 1..T)
/// \param x_out [T_out, d_model] output rows (positions T-T_out+1..T)
/// \throws orthros::Error as orthros_attention_layer.
template <typename S>
LayerActivations<S> orthros_attention_layer_training_forward(const AttentionWeights<S>& w, const AttentionConfig& cfg,
                                                             const Mat<S>& x, const Mat<S>& x_out) {
  using Index = Eigen::Index;
  check_weights(w, cfg, x.cols());
  require(x_out.cols() == x.cols(), "x_out must have d_model = ", x.cols(), " columns; got ", x_out.cols());
  const Index T = x.rows(), T_out = x_out.rows();
  require(T_out <= T, "T_out must be <= T (got T_out = ", T_out, ", T = ", T, ")");
  LayerActivations<S> a;
  for (Index i = 0; i < T; ++i) a.pos.push_back(i);
  for (Index i = 0; i < T_out; ++i) a.pos_out.push_back(T - T_out + i);
  a.k = detail::key_stages(w, cfg, x, a.pos);
  a.v = project(x, w.w_v);
  a.q = detail::query_stages(w, cfg, x, w.alpha, w.beta, a.pos);
  a.q_out = detail::query_stages(w, cfg, x_out, w.alpha_out, w.beta_out, a.pos_out);
  a.attn = orthros_attention<S>(a.q.q, a.k.k, a.v, a.q_out.q, cfg.dims(), AttentionOptions{cfg.window, std::nullopt});
  a.y = project(a.attn.o, w.w_o);
  a.y_out = project(a.attn.o_out, w.w_o);
  return a;
}

/// Gradients of one layer: dL/dx, dL/dx' and dL/dW for every weight (`dw` has the shapes of
/// AttentionWeights; q_norm/k_norm gradients are 0 when QK-norm is off).
template <typename S>
struct LayerGrads {
  Mat<S> dx;               ///< [T, d_model]
  Mat<S> dx_out;           ///< [T_out, d_model]
  AttentionWeights<S> dw;  ///< dL/dw_q, dL/dw_k, ..., dL/dalpha_out, dL/dq_norm, dL/dk_norm
};

/// Zero-filled gradients with the shapes of `w`.
template <typename S>
AttentionWeights<S> zeros_like(const AttentionWeights<S>& w) {
  AttentionWeights<S> z;
  z.w_q = Mat<S>::Zero(w.w_q.rows(), w.w_q.cols());
  z.w_k = Mat<S>::Zero(w.w_k.rows(), w.w_k.cols());
  z.w_v = Mat<S>::Zero(w.w_v.rows(), w.w_v.cols());
  z.w_o = Mat<S>::Zero(w.w_o.rows(), w.w_o.cols());
  for (auto [dst, src] : {std::pair{&z.alpha, &w.alpha}, {&z.beta, &w.beta}, {&z.alpha_out, &w.alpha_out},
                          {&z.beta_out, &w.beta_out}, {&z.q_norm, &w.q_norm}, {&z.k_norm, &w.k_norm}})
    *dst = Vec<S>::Zero(src->size());
  return z;
}

namespace detail {

/// Backward of one query stream from dL/dq (post-RoPE) to dL/d(x W_Q); accumulates dα, dβ and
/// the q-norm gain gradient.
template <typename S>
Mat<S> query_stages_backward(const AttentionWeights<S>& w, const AttentionConfig& cfg, const QueryStages<S>& st,
                             const Vec<S>& alpha, const std::vector<std::int64_t>& pos, Mat<S> dq, Vec<S>& dalpha,
                             Vec<S>& dbeta, Vec<S>& dq_norm) {
  using Acc = AccumT<S>;
  const int D = cfg.head_dim;
  for (Eigen::Index r = 0; r < dq.rows(); ++r)  // q = RoPE(q̂): dq̂ = RoPE^-1(dq)
    for (int h = 0; h < cfg.num_q_heads; ++h)
      apply_rope_backward(dq.data() + r * dq.cols() + Eigen::Index(h) * D, D, pos[static_cast<size_t>(r)],
                          cfg.rope_theta);
  // q̂ = α ⊙ n + β: dα += dq̂ ⊙ n, dβ += dq̂ (rows ascending), dn = α ⊙ dq̂
  for (Eigen::Index c = 0; c < dq.cols(); ++c) {
    Acc da = static_cast<Acc>(dalpha[c]), db = static_cast<Acc>(dbeta[c]);
    for (Eigen::Index r = 0; r < dq.rows(); ++r) {
      da += static_cast<Acc>(dq(r, c)) * static_cast<Acc>(st.normed(r, c));
      db += static_cast<Acc>(dq(r, c));
    }
    dalpha[c] = static_cast<S>(da);
    dbeta[c] = static_cast<S>(db);
  }
  Mat<S> dn(dq.rows(), dq.cols());
  for (Eigen::Index r = 0; r < dq.rows(); ++r)
    for (Eigen::Index c = 0; c < dq.cols(); ++c)
      dn(r, c) = static_cast<S>(static_cast<Acc>(alpha[c]) * static_cast<Acc>(dq(r, c)));
  if (!cfg.qk_norm) return dn;
  return rms_norm_groups_backward(st.lin, w.q_norm, D, cfg.rms_eps, dn, dq_norm);
}

}  // namespace detail

/// Backward of the Orthros attention layer for a training call (paper Algorithm 1, P = 0; the
/// stages and their derivatives are listed in the file comment).
///
/// \param w, cfg  layer weights and configuration
/// \param x       [T, d_model] base rows (absolute positions 1..T, empty KV cache)
/// \param x_out   [T_out, d_model] output-specific rows (positions T-T_out+1..T), 0 <= T_out <= T
/// \param dy      [T, d_model] dL/dy;  \param dy_out [T_out, d_model] dL/dy'
/// \returns dL/dx, dL/dx' and every weight's gradient (LayerGrads). The forward is recomputed
///   (orthros_attention_layer_training_forward).
/// \throws orthros::Error on bad weights/config (check_weights), `T_out > T`, or dy/dy_out shapes.
template <typename S>
LayerGrads<S> orthros_attention_layer_backward(const AttentionWeights<S>& w, const AttentionConfig& cfg,
                                               const Mat<S>& x, const Mat<S>& x_out, const Mat<S>& dy,
                                               const Mat<S>& dy_out) {
  return orthros_attention_layer_backward(w, cfg, x, x_out, orthros_attention_layer_training_forward(w, cfg, x, x_out),
                                          dy, dy_out);
}

/// The same backward from the activations the caller already holds: `a` must be
/// orthros_attention_layer_training_forward(w, cfg, x, x_out) (not recomputed here).
/// Shapes and errors as the overload above.
template <typename S>
LayerGrads<S> orthros_attention_layer_backward(const AttentionWeights<S>& w, const AttentionConfig& cfg,
                                               const Mat<S>& x, const Mat<S>& x_out, const LayerActivations<S>& a,
                                               const Mat<S>& dy, const Mat<S>& dy_out) {
  require(dy.rows() == x.rows() && dy.cols() == x.cols(), "dy must be [T, d_model] = [", x.rows(), ", ", x.cols(),
          "]; got [", dy.rows(), ", ", dy.cols(), "]");
  require(dy_out.rows() == x_out.rows() && dy_out.cols() == x.cols(), "dy_out must be [T_out, d_model] = [",
          x_out.rows(), ", ", x.cols(), "]; got [", dy_out.rows(), ", ", dy_out.cols(), "]");
  LayerGrads<S> g;
  g.dw = zeros_like(w);
  // y = o W_O, y' = o' W_O (one shared W_O)
  detail::project_backward_weight(g.dw.w_o, a.attn.o, dy);
  detail::project_backward_weight(g.dw.w_o, a.attn.o_out, dy_out);
  const Mat<S> d_o = detail::project_backward_input(dy, w.w_o), d_o_out = detail::project_backward_input(dy_out, w.w_o);
  // attention operator (attention_backward.hpp)
  const AttentionGrads<S> ga = orthros_attention_backward<S>(a.q.q, a.k.k, a.v, a.q_out.q, a.attn, d_o, d_o_out,
                                                             cfg.dims(), AttentionOptions{cfg.window, std::nullopt});
  // queries of both streams -> d(x W_Q), d(x' W_Q); the q-norm gain is shared: base rows first
  const Mat<S> dq_lin = detail::query_stages_backward(w, cfg, a.q, w.alpha, a.pos, ga.dq, g.dw.alpha, g.dw.beta,
                                                      g.dw.q_norm);
  const Mat<S> dq_out_lin = detail::query_stages_backward(w, cfg, a.q_out, w.alpha_out, a.pos_out, ga.dq_out,
                                                          g.dw.alpha_out, g.dw.beta_out, g.dw.q_norm);
  // keys: k = RoPE(norm_k(x W_K))
  Mat<S> dk = ga.dk;
  for (Eigen::Index r = 0; r < dk.rows(); ++r)
    for (int h = 0; h < cfg.num_kv_heads; ++h)
      apply_rope_backward(dk.data() + r * dk.cols() + Eigen::Index(h) * cfg.head_dim, cfg.head_dim,
                          a.pos[static_cast<size_t>(r)], cfg.rope_theta);
  const Mat<S> dk_lin =
      cfg.qk_norm ? rms_norm_groups_backward(a.k.lin, w.k_norm, cfg.head_dim, cfg.rms_eps, dk, g.dw.k_norm) : dk;
  // shared projections: dW_Q sums both streams (base rows first); dx sums q, k, v in that order
  detail::project_backward_weight(g.dw.w_q, x, dq_lin);
  detail::project_backward_weight(g.dw.w_q, x_out, dq_out_lin);
  detail::project_backward_weight(g.dw.w_k, x, dk_lin);
  detail::project_backward_weight(g.dw.w_v, x, ga.dv);
  g.dx = detail::add(detail::add(detail::project_backward_input(dq_lin, w.w_q), detail::project_backward_input(dk_lin, w.w_k)),
                     detail::project_backward_input(ga.dv, w.w_v));
  g.dx_out = detail::project_backward_input(dq_out_lin, w.w_q);
  return g;
}

}  // namespace orthros
