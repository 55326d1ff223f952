/// \file layer.hpp
/// \brief The Orthros attention layer (paper Algorithm 1; SPEC §2): shared W_Q/W_K/W_V/W_O,
/// scale-offset per stream, optional per-head QK RMSNorm, RoPE, GQA, a KV cache that is
/// never evicted.
///
/// Every operation here is token-wise or per query row, written as explicit loops with a
/// fixed order of operations, so one token's arithmetic never depends on how many tokens
/// (or sequences) share the call: the regimes agree bitwise (SPEC §4.2).
#pragma once

#include "orthros/attention.hpp"
#include "orthros/rope.hpp"

#include <cstdint>
#include <vector>

namespace orthros {

/// Attention hyper-parameters of one layer (SPEC §7 lists the named configurations).
struct AttentionConfig {
  int num_q_heads = 4;       ///< H_q
  int num_kv_heads = 2;      ///< H_kv (GQA: divides H_q)
  int head_dim = 16;         ///< D (even, for RoPE)
  std::int64_t window = 8;   ///< sliding window w >= 1, current token included
  double rope_theta = 1e4;   ///< RoPE base
  bool qk_norm = true;       ///< per-head RMSNorm of q and k (Qwen3); identity when false
  double rms_eps = 1e-6;     ///< epsilon of the QK RMSNorm
  /// The operator's head layout.
  AttentionDims dims() const { return {num_q_heads, num_kv_heads, head_dim}; }
};

/// Weights of one Orthros attention layer. `d` = H_q*D, `d_kv` = H_kv*D.
template <typename S>
struct AttentionWeights {
  Mat<S> w_q;        ///< [d_model, d]     shared by both streams
  Mat<S> w_k;        ///< [d_model, d_kv]
  Mat<S> w_v;        ///< [d_model, d_kv]
  Mat<S> w_o;        ///< [d, d_model]     shared output projection
  Vec<S> alpha;      ///< [d] scale of the base query (SPEC §2 scale-offset)
  Vec<S> beta;       ///< [d] offset of the base query
  Vec<S> alpha_out;  ///< [d] scale of the output-specific query (alpha')
  Vec<S> beta_out;   ///< [d] offset of the output-specific query (beta')
  Vec<S> q_norm;     ///< [D] RMSNorm weight of the queries (used when qk_norm)
  Vec<S> k_norm;     ///< [D] RMSNorm weight of the keys (used when qk_norm)
};

/// The same weights in another scalar type T (each value converted once, e.g. bf16 -> double to
/// run the float64 oracle on a kernel's weights).
template <typename T, typename S>
AttentionWeights<T> cast_weights(const AttentionWeights<S>& w) {
  AttentionWeights<T> r;
  r.w_q = w.w_q.template cast<T>();
  r.w_k = w.w_k.template cast<T>();
  r.w_v = w.w_v.template cast<T>();
  r.w_o = w.w_o.template cast<T>();
  r.alpha = w.alpha.template cast<T>();
  r.beta = w.beta.template cast<T>();
  r.alpha_out = w.alpha_out.template cast<T>();
  r.beta_out = w.beta_out.template cast<T>();
  r.q_norm = w.q_norm.template cast<T>();
  r.k_norm = w.k_norm.template cast<T>();
  return r;
}

/// Per-layer KV cache: rows are absolute positions 1..P (post-RoPE keys, values), [P, H_kv*D].
/// Only base tokens append to it; output-specific tokens never write it; nothing is evicted.
template <typename S>
struct KVCache {
  Mat<S> k;  ///< [P, H_kv*D] post-RoPE keys of positions 1..P
  Mat<S> v;  ///< [P, H_kv*D] values of positions 1..P
  /// Cached positions P.
  Eigen::Index length() const { return k.rows(); }
};

/// One sequence's slice of a (possibly ragged) batch: its base rows `[base_begin, base_begin+T)`
/// and output rows `[out_begin, out_begin+T_out)` in the stacked activations.
struct Segment {
  Eigen::Index base_begin = 0;  ///< first row of this sequence in the stacked base rows
  Eigen::Index T = 0;           ///< base tokens of this sequence
  Eigen::Index out_begin = 0;   ///< first row of this sequence in the stacked output rows
  Eigen::Index T_out = 0;       ///< output-specific tokens (the last T_out base positions)
};

/// Row-wise projection y = x W with a fixed summation order (i ascending) for every row.
/// \param x [N, in]; \param w [in, out]; returns [N, out]. \throws orthros::Error on shape mismatch.
template <typename S>
Mat<S> project(const Mat<S>& x, const Mat<S>& w) {
  using Acc = AccumT<S>;
  require(x.cols() == w.rows(), "projection: x has ", x.cols(), " columns but W has ", w.rows(), " rows");
  Mat<S> y(x.rows(), w.cols());
  // Threads only pay off for many rows (decode steps project 1-2 rows per sequence).
#pragma omp parallel for schedule(static) if (x.rows() >= 8)
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    std::vector<Acc> acc(static_cast<size_t>(w.cols()), Acc(0));
    for (Eigen::Index i = 0; i < w.rows(); ++i) {
      const Acc xi = static_cast<Acc>(x(r, i));
      const S* wi = w.data() + i * w.cols();
      for (Eigen::Index j = 0; j < w.cols(); ++j) acc[j] += xi * static_cast<Acc>(wi[j]);
    }
    for (Eigen::Index j = 0; j < w.cols(); ++j) y(r, j) = static_cast<S>(acc[j]);
  }
  return y;
}

/// RMSNorm of each contiguous group of `group` values in each row: `x / sqrt(mean(x^2) + eps) * weight`.
/// \param x      [N, k*group], normalized in place
/// \param weight [group] gain
/// \param group  width of each normalized group (D for per-head QK-norm, d_model for a row)
/// \param eps    added to the mean square
/// \throws orthros::Error if weight has not `group` entries or group does not divide the row.
template <typename S>
void rms_norm_groups(Mat<S>& x, const Vec<S>& weight, int group, double eps) {
  using Acc = AccumT<S>;
  require(weight.size() == group && x.cols() % group == 0, "rms_norm: weight has ", weight.size(),
          " entries, expected ", group, " (row width ", x.cols(), ")");
#pragma omp parallel for schedule(static) if (x.rows() >= 64)
  for (Eigen::Index r = 0; r < x.rows(); ++r)
    for (Eigen::Index g = 0; g < x.cols(); g += group) {
      S* p = x.data() + r * x.cols() + g;
      Acc ss = 0;
      for (int i = 0; i < group; ++i) ss += static_cast<Acc>(p[i]) * static_cast<Acc>(p[i]);
      const Acc inv = Acc(1) / std::sqrt(ss / static_cast<Acc>(group) + static_cast<Acc>(eps));
      for (int i = 0; i < group; ++i) p[i] = static_cast<S>(static_cast<Acc>(p[i]) * inv * static_cast<Acc>(weight[i]));
    }
}

namespace detail {

/// The stages of one stream's queries (SPEC §2), kept so the backward can reuse them.
template <typename S>
struct QueryStages {
  Mat<S> lin;     ///< x W_Q                            [N, H_q*D]
  Mat<S> normed;  ///< norm_q(x W_Q) (= lin without QK-norm)
  Mat<S> q;       ///< RoPE(alpha ⊙ normed + beta, pos)
};

/// Queries of one stream, stage by stage: q = RoPE(alpha ⊙ norm_q(x W_Q) + beta, pos)  (SPEC §2).
template <typename S>
QueryStages<S> query_stages(const AttentionWeights<S>& w, const AttentionConfig& cfg, const Mat<S>& x,
                            const Vec<S>& alpha, const Vec<S>& beta, const std::vector<std::int64_t>& pos) {
  using Acc = AccumT<S>;
  QueryStages<S> st;
  st.lin = project(x, w.w_q);
  st.normed = st.lin;
  if (cfg.qk_norm) rms_norm_groups(st.normed, w.q_norm, cfg.head_dim, cfg.rms_eps);
  Mat<S>& q = st.q = st.normed;
  for (Eigen::Index r = 0; r < q.rows(); ++r) {
    for (Eigen::Index c = 0; c < q.cols(); ++c)
      q(r, c) = static_cast<S>(static_cast<Acc>(alpha[c]) * static_cast<Acc>(q(r, c)) + static_cast<Acc>(beta[c]));
    for (int h = 0; h < cfg.num_q_heads; ++h)
      apply_rope(q.data() + r * q.cols() + Eigen::Index(h) * cfg.head_dim, cfg.head_dim, pos[r], cfg.rope_theta);
  }
  return st;
}

/// The stages of the keys (SPEC §2): lin = x W_K, normed = norm_k(lin), k = RoPE(normed, pos).
template <typename S>
struct KeyStages {
  Mat<S> lin;     ///< x W_K      [N, H_kv*D]
  Mat<S> normed;  ///< norm_k(lin) (= lin without QK-norm)
  Mat<S> k;       ///< post-RoPE keys, as stored in the KV cache
};

/// Keys of base tokens, stage by stage: k_i = RoPE(norm_k(x_i W_K), i)  (SPEC §2).
template <typename S>
KeyStages<S> key_stages(const AttentionWeights<S>& w, const AttentionConfig& cfg, const Mat<S>& x,
                        const std::vector<std::int64_t>& pos) {
  KeyStages<S> st;
  st.lin = project(x, w.w_k);
  st.normed = st.lin;
  if (cfg.qk_norm) rms_norm_groups(st.normed, w.k_norm, cfg.head_dim, cfg.rms_eps);
  st.k = st.normed;
  for (Eigen::Index r = 0; r < st.k.rows(); ++r)
    for (int h = 0; h < cfg.num_kv_heads; ++h)
      apply_rope(st.k.data() + r * st.k.cols() + Eigen::Index(h) * cfg.head_dim, cfg.head_dim, pos[r], cfg.rope_theta);
  return st;
}

}  // namespace detail

/// Checks that `w` matches `cfg` and `d_model`. \throws orthros::Error naming the tensor and shapes.
template <typename S>
void check_weights(const AttentionWeights<S>& w, const AttentionConfig& cfg, Eigen::Index d_model) {
  check_dims(cfg.dims());
  check_window(cfg.window);
  const Eigen::Index d = Eigen::Index(cfg.num_q_heads) * cfg.head_dim, dkv = Eigen::Index(cfg.num_kv_heads) * cfg.head_dim;
  auto shape = [](const char* n, const Mat<S>& m, Eigen::Index r, Eigen::Index c) {
    require(m.rows() == r && m.cols() == c, n, " must be [", r, ", ", c, "]; got [", m.rows(), ", ", m.cols(), "]");
  };
  shape("w_q", w.w_q, d_model, d);
  shape("w_k", w.w_k, d_model, dkv);
  shape("w_v", w.w_v, d_model, dkv);
  shape("w_o", w.w_o, d, d_model);
  for (auto* p : {&w.alpha, &w.beta, &w.alpha_out, &w.beta_out})
    require(p->size() == d, "scale-offset vectors (alpha, beta, alpha', beta') must have H_q*D = ", d, " entries; got ",
            p->size());
  if (cfg.qk_norm)
    require(w.q_norm.size() == cfg.head_dim && w.k_norm.size() == cfg.head_dim, "q_norm/k_norm must have D = ",
            cfg.head_dim, " entries; got ", w.q_norm.size(), "/", w.k_norm.size());
}

/// Orthros attention layer over a ragged batch (paper Algorithm 1, batched):
/// \f[
///   k_i = \mathrm{RoPE}(\mathrm{norm}_k(x_i W_K), i),\;
///   q_i = \mathrm{RoPE}(\alpha \odot \mathrm{norm}_q(x_i W_Q) + \beta, i),\;
///   q'_i = \mathrm{RoPE}(\alpha' \odot \mathrm{norm}_q(x'_i W_Q) + \beta', i),\;
///   [y; y'] = [o; o'] W_O .
/// \f]
///
/// \param w      layer weights; \param cfg attention shapes, window, RoPE, QK-norm
/// \param x      [sum T_b, d_model]      normed hidden states of the base tokens, sequences stacked
/// \param x_out  [sum T_out_b, d_model]  normed hidden states of the output-specific tokens
/// \param segs   one Segment per sequence (its rows in x and x_out)
/// \param caches one KVCache per sequence; sequence b's base tokens sit at absolute positions
///               P_b+1 .. P_b+T_b with P_b = caches[b]->length(), and are appended to it
/// \param y,y_out outputs [sum T_b, d_model] and [sum T_out_b, d_model]: `[o ; o'] W_O`
/// \throws orthros::Error on shape mismatches, `T_out > T`, bad config (see check_weights).
template <typename S>
void orthros_attention_layer_batch(const AttentionWeights<S>& w, const AttentionConfig& cfg, const Mat<S>& x,
                                   const Mat<S>& x_out, const std::vector<Segment>& segs,
                                   const std::vector<KVCache<S>*>& caches, Mat<S>& y, Mat<S>& y_out) {
  using Index = Eigen::Index;
  check_weights(w, cfg, x.cols());
  require(segs.size() == caches.size(), "segments (", segs.size(), ") and caches (", caches.size(), ") differ in count");
  require(x_out.cols() == x.cols(), "x_out must have d_model = ", x.cols(), " columns; got ", x_out.cols());
  const int D = cfg.head_dim;
  const Index d = Index(cfg.num_q_heads) * D;
  // Absolute 0-based RoPE positions of every stacked row (Algorithm 1: positions of base tokens;
  // an output-specific token takes its base token's position).
  std::vector<std::int64_t> pos(static_cast<size_t>(x.rows())), pos_out(static_cast<size_t>(x_out.rows()));
  for (size_t b = 0; b < segs.size(); ++b) {
    const Segment& s = segs[b];
    require(s.T_out <= s.T, "T_out must be <= T (got T_out = ", s.T_out, ", T = ", s.T, ") for sequence ", b);
    require(s.base_begin + s.T <= x.rows() && s.out_begin + s.T_out <= x_out.rows(), "segment ", b,
            " lies outside the stacked rows");
    const Index P = caches[b]->length();
    for (Index i = 0; i < s.T; ++i) pos[s.base_begin + i] = P + i;
    for (Index i = 0; i < s.T_out; ++i) pos_out[s.out_begin + i] = P + (s.T - s.T_out) + i;
  }
  // k_i = RoPE(norm_k(x_i W_K), i), v_i = x_i W_V           (SPEC §2; base tokens only)
  const Mat<S> k = detail::key_stages(w, cfg, x, pos).k, v = project(x, w.w_v);
  // q_i = RoPE(alpha ⊙ norm_q(x_i W_Q) + beta, i);  q'_i with alpha', beta'
  const Mat<S> q = detail::query_stages(w, cfg, x, w.alpha, w.beta, pos).q;
  const Mat<S> q_out = detail::query_stages(w, cfg, x_out, w.alpha_out, w.beta_out, pos_out).q;

  Mat<S> o(x.rows(), d), o_out(x_out.rows(), d);
  for (size_t b = 0; b < segs.size(); ++b) {
    const Segment& s = segs[b];
    KVCache<S>& c = *caches[b];
    const Index P = c.length();
    // Append this call's keys/values: the cache grows, never shrinks (Algorithm 1, "KV cache").
    c.k.conservativeResize(P + s.T, k.cols());
    c.v.conservativeResize(P + s.T, v.cols());
    c.k.bottomRows(s.T) = k.middleRows(s.base_begin, s.T);
    c.v.bottomRows(s.T) = v.middleRows(s.base_begin, s.T);
    const AttentionResult<S> r = orthros_attention<S>(q.middleRows(s.base_begin, s.T), c.k, c.v,
                                                      q_out.middleRows(s.out_begin, s.T_out), cfg.dims(),
                                                      AttentionOptions{cfg.window, std::nullopt});
    o.middleRows(s.base_begin, s.T) = r.o;
    o_out.middleRows(s.out_begin, s.T_out) = r.o_out;
  }
  // y = [o ; o'] W_O  (one shared W_O)
  y = project(o, w.w_o);
  y_out = project(o_out, w.w_o);
}

/// Orthros attention layer for one sequence (paper Algorithm 1).
/// \param w     layer weights
/// \param cfg   attention shapes, window, RoPE, QK-norm
/// \param x     [T, d_model] base tokens at positions P+1..P+T (P = cache.length())
/// \param x_out [T_out, d_model] output-specific tokens of the last T_out positions
/// \param cache this layer's KV cache, extended by T rows
/// \throws orthros::Error as orthros_attention_layer_batch.
/// Returns y [T, d_model] in `.first`, y' [T_out, d_model] in `.second`; appends T rows to `cache`.
template <typename S>
std::pair<Mat<S>, Mat<S>> orthros_attention_layer(const AttentionWeights<S>& w, const AttentionConfig& cfg,
                                                  const Mat<S>& x, const Mat<S>& x_out, KVCache<S>& cache) {
  std::pair<Mat<S>, Mat<S>> y;
  orthros_attention_layer_batch<S>(w, cfg, x, x_out, {Segment{0, x.rows(), 0, x_out.rows()}}, {&cache}, y.first,
                                   y.second);
  return y;
}

}  // namespace orthros
