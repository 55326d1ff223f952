/// \file model.hpp
/// \brief The Orthros Transformer (paper Algorithm 2; SPEC §3): embedding, L pre-norm layers of
/// Orthros attention + SwiGLU FFN, the duplicated output stream, final RMSNorm, LM head.
#pragma once

#include "orthros/layer.hpp"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace orthros {

/// Model hyper-parameters. Tokens are bytes unless `vocab_size` says otherwise.
struct ModelConfig {
  std::string name = "tiny";  ///< configuration name (SPEC §7)
  int vocab_size = 256;   ///< V
  int d_model = 32;       ///< residual width
  int d_ff = 64;          ///< SwiGLU hidden width
  int num_layers = 2;     ///< L
  double rms_eps = 1e-6;  ///< epsilon of the pre-norms and the final norm
  AttentionConfig attn;   ///< attention shapes, window, RoPE, QK-norm
};

/// Weights of one decoder layer.
template <typename S>
struct LayerWeights {
  Vec<S> attn_norm;            ///< [d_model] pre-attention RMSNorm
  AttentionWeights<S> attn;    ///< Orthros attention
  Vec<S> ffn_norm;             ///< [d_model] pre-FFN RMSNorm
  Mat<S> w_gate;               ///< [d_model, d_ff] SwiGLU gate
  Mat<S> w_up;                 ///< [d_model, d_ff] SwiGLU up projection
  Mat<S> w_down;               ///< [d_ff, d_model]
};

/// All weights of the model.
template <typename S>
struct ModelWeights {
  Mat<S> embedding;                    ///< [V, d_model]
  std::vector<LayerWeights<S>> layers; ///< L layers
  Vec<S> final_norm;                   ///< [d_model]
  Mat<S> lm_head;                      ///< [d_model, V]
};

/// Per-sequence KV cache of every layer (never evicted).
template <typename S>
struct ModelCache {
  std::vector<KVCache<S>> layers;  ///< one KV cache per layer
  /// Number of positions already cached (P).
  Eigen::Index length() const { return layers.empty() ? 0 : layers.front().length(); }
};

/// Validates a model configuration. \throws orthros::Error naming the field and value.
inline void check_config(const ModelConfig& c) {
  require(c.vocab_size >= 1, "vocab_size must be >= 1 (got ", c.vocab_size, ")");
  require(c.d_model >= 1, "d_model must be >= 1 (got ", c.d_model, ")");
  require(c.d_ff >= 1, "d_ff must be >= 1 (got ", c.d_ff, ")");
  require(c.num_layers >= 1, "num_layers must be >= 1 (got ", c.num_layers, ")");
  require(c.attn.head_dim % 2 == 0, "head_dim must be even for RoPE (got ", c.attn.head_dim, ")");
  check_dims(c.attn.dims());
  check_window(c.attn.window);
  require(std::isfinite(c.rms_eps) && c.rms_eps > 0, "rms_eps must be finite and > 0 (got ", c.rms_eps, ")");
  require(std::isfinite(c.attn.rms_eps) && c.attn.rms_eps > 0, "attn.rms_eps must be finite and > 0 (got ",
          c.attn.rms_eps, ")");
}

/// Checks that every weight of `w` has the shape `c` gives it (SPEC §3), so a mismatch is an
/// orthros::Error naming the tensor and both shapes, never an out-of-bounds read.
/// \throws orthros::Error on a wrong layer count or any wrong shape.
template <typename S>
void check_model_weights(const ModelWeights<S>& w, const ModelConfig& c) {
  check_config(c);
  require(static_cast<int>(w.layers.size()) == c.num_layers, "weights have ", w.layers.size(), " layers, config ",
          c.num_layers);
  auto mat = [](const std::string& n, const Mat<S>& m, Eigen::Index r, Eigen::Index cols) {
    require(m.rows() == r && m.cols() == cols, n, " must be [", r, ", ", cols, "]; got [", m.rows(), ", ", m.cols(),
            "]");
  };
  auto vec = [](const std::string& n, const Vec<S>& v, Eigen::Index size) {
    require(v.size() == size, n, " must have ", size, " entries; got ", v.size());
  };
  mat("embedding", w.embedding, c.vocab_size, c.d_model);
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights<S>& lw = w.layers[static_cast<size_t>(l)];
    const std::string p = "layers." + std::to_string(l) + ".";
    vec(p + "attn_norm", lw.attn_norm, c.d_model);
    vec(p + "ffn_norm", lw.ffn_norm, c.d_model);
    mat(p + "w_gate", lw.w_gate, c.d_model, c.d_ff);
    mat(p + "w_up", lw.w_up, c.d_model, c.d_ff);
    mat(p + "w_down", lw.w_down, c.d_ff, c.d_model);
    try {
      check_weights(lw.attn, c.attn, c.d_model);
    } catch (const Error& e) {
      throw Error(p + "attn: " + e.what());
    }
  }
  vec("final_norm", w.final_norm, c.d_model);
  mat("lm_head", w.lm_head, c.d_model, c.vocab_size);
}

/// Seeded random weights, identical for every scalar type S (drawn in double with a portable
/// generator, then rounded). Matrices ~ U(-a, a) with a = sqrt(3/fan_in) (unit variance
/// propagation); norm weights and alpha ~ 1 + U(-0.1, 0.1); beta ~ U(-0.1, 0.1), drawn
/// separately for each stream so the two streams differ (as after training).
template <typename S>
ModelWeights<S> random_weights(const ModelConfig& c, std::uint64_t seed) {
  check_config(c);
  std::mt19937_64 rng(seed);  // mt19937_64 is fully specified by the standard: same bits everywhere
  auto uniform = [&rng]() { return static_cast<double>(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0; };  // U(-1, 1)
  auto mat = [&](Eigen::Index r, Eigen::Index cols) {
    const double a = std::sqrt(3.0 / static_cast<double>(r));
    Mat<S> m(r, cols);
    for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<S>(a * uniform());
    return m;
  };
  auto vec = [&](Eigen::Index n, double center, double spread) {
    Vec<S> v(n);
    for (Eigen::Index i = 0; i < n; ++i) v[i] = static_cast<S>(center + spread * uniform());
    return v;
  };
  const Eigen::Index d = Eigen::Index(c.attn.num_q_heads) * c.attn.head_dim;
  const Eigen::Index dkv = Eigen::Index(c.attn.num_kv_heads) * c.attn.head_dim;
  ModelWeights<S> w;
  w.embedding = mat(c.vocab_size, c.d_model) * static_cast<S>(std::sqrt(static_cast<double>(c.vocab_size)));
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights<S> lw;
    lw.attn_norm = vec(c.d_model, 1.0, 0.1);
    lw.attn.w_q = mat(c.d_model, d);
    lw.attn.w_k = mat(c.d_model, dkv);
    lw.attn.w_v = mat(c.d_model, dkv);
    lw.attn.w_o = mat(d, c.d_model);
    lw.attn.alpha = vec(d, 1.0, 0.1);
    lw.attn.beta = vec(d, 0.0, 0.1);
    lw.attn.alpha_out = vec(d, 1.0, 0.1);
    lw.attn.beta_out = vec(d, 0.0, 0.1);
    lw.attn.q_norm = vec(c.attn.head_dim, 1.0, 0.1);
    lw.attn.k_norm = vec(c.attn.head_dim, 1.0, 0.1);
    lw.ffn_norm = vec(c.d_model, 1.0, 0.1);
    lw.w_gate = mat(c.d_model, c.d_ff);
    lw.w_up = mat(c.d_model, c.d_ff);
    lw.w_down = mat(c.d_ff, c.d_model);
    w.layers.push_back(std::move(lw));
  }
  w.final_norm = vec(c.d_model, 1.0, 0.1);
  w.lm_head = mat(c.d_model, c.vocab_size);
  return w;
}

/// Empty cache for a model with `c.num_layers` layers.
template <typename S>
ModelCache<S> empty_cache(const ModelConfig& c) {
  ModelCache<S> m;
  m.layers.resize(static_cast<size_t>(c.num_layers));
  const Eigen::Index dkv = Eigen::Index(c.attn.num_kv_heads) * c.attn.head_dim;
  for (auto& l : m.layers) l.k.resize(0, dkv), l.v.resize(0, dkv);
  return m;
}

/// One sequence of a (ragged) batch: its new base tokens and how many of the last ones predict.
struct SequenceInput {
  std::vector<int> tokens;  ///< T new base tokens (ids in [0, V))
  Eigen::Index T_out = 1;   ///< output-specific tokens for the last T_out positions, 0 <= T_out <= T
};

/// Optional per-layer record of the output stream's attention output y' (SPEC §4.1).
template <typename S>
struct ForwardTrace {
  std::vector<Mat<S>> y_out;  ///< per layer, [sum T_out, d_model]
};

namespace detail {

/// The stages of the SwiGLU FFN, kept for the backward: gate = x W_gate, up = x W_up,
/// act = silu(gate) ⊙ up, out = act W_down.
template <typename S>
struct SwigluStages {
  Mat<S> gate, up, act, out;
};

template <typename S>
SwigluStages<S> swiglu_stages(const LayerWeights<S>& lw, const Mat<S>& x) {
  using Acc = AccumT<S>;
  SwigluStages<S> st;
  st.gate = project(x, lw.w_gate);
  st.up = project(x, lw.w_up);
  st.act.resize(st.gate.rows(), st.gate.cols());
  for (Eigen::Index i = 0; i < st.gate.size(); ++i) {
    const Acc z = static_cast<Acc>(st.gate.data()[i]);
    st.act.data()[i] = static_cast<S>(z / (Acc(1) + std::exp(-z)) * static_cast<Acc>(st.up.data()[i]));  // silu(z) * u
  }
  st.out = project(st.act, lw.w_down);
  return st;
}

template <typename S>
Mat<S> swiglu(const LayerWeights<S>& lw, const Mat<S>& x) {
  return swiglu_stages(lw, x).out;
}

template <typename S>
Mat<S> rms_norm_rows(Mat<S> x, const Vec<S>& w, double eps) {
  rms_norm_groups(x, w, static_cast<int>(x.cols()), eps);
  return x;
}

}  // namespace detail

/// Forward pass of the Orthros Transformer over a ragged batch (paper Algorithm 2).
///
/// For sequence b with cache length P_b, its tokens sit at absolute positions P_b+1..P_b+T_b;
/// the output stream h' starts as a copy of the embeddings of the last T_out_b positions and
/// goes through the same layers; logits come from h' only.
///
/// \returns one logits matrix per sequence, [T_out_b, V] (natural-scale logits, no softmax).
/// Appends T_b rows to every layer of `*caches[b]`.
/// \throws orthros::Error on a bad config, token ids outside [0, V), T_out > T, count mismatch.
template <typename S>
std::vector<Mat<S>> forward_batch(const ModelWeights<S>& w, const ModelConfig& c, const std::vector<SequenceInput>& seqs,
                                  const std::vector<ModelCache<S>*>& caches, ForwardTrace<S>* trace = nullptr) {
  using Index = Eigen::Index;
  check_model_weights(w, c);
  require(seqs.size() == caches.size(), "sequences (", seqs.size(), ") and caches (", caches.size(), ") differ in count");
  std::vector<Segment> segs;
  Index n = 0, n_out = 0;
  for (size_t b = 0; b < seqs.size(); ++b) {
    const Index T = static_cast<Index>(seqs[b].tokens.size()), T_out = seqs[b].T_out;
    require(T_out >= 0 && T_out <= T, "T_out must be in [0, T] (got T_out = ", T_out, ", T = ", T, ") for sequence ", b);
    require(caches[b]->layers.size() == static_cast<size_t>(c.num_layers), "cache of sequence ", b, " has ",
            caches[b]->layers.size(), " layers, model has ", c.num_layers);
    segs.push_back(Segment{n, T, n_out, T_out});
    n += T;
    n_out += T_out;
  }
  // Embedding; h' = copy of the embeddings of the last T_out positions (Algorithm 2, "duplicate").
  Mat<S> h(n, c.d_model), h_out(n_out, c.d_model);
  for (size_t b = 0; b < seqs.size(); ++b)
    for (Index i = 0; i < segs[b].T; ++i) {
      const int tok = seqs[b].tokens[static_cast<size_t>(i)];
      require(tok >= 0 && tok < c.vocab_size, "token id ", tok, " outside [0, ", c.vocab_size, ") in sequence ", b);
      h.row(segs[b].base_begin + i) = w.embedding.row(tok);
      const Index first_out = segs[b].T - segs[b].T_out;
      if (i >= first_out) h_out.row(segs[b].out_begin + i - first_out) = w.embedding.row(tok);
    }
  std::vector<KVCache<S>*> layer_caches(seqs.size());
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights<S>& lw = w.layers[static_cast<size_t>(l)];
    for (size_t b = 0; b < seqs.size(); ++b) layer_caches[b] = &caches[b]->layers[static_cast<size_t>(l)];
    // h += Attn(RMSNorm(h)); h' += its cross stream
    Mat<S> y, y_out;
    orthros_attention_layer_batch<S>(lw.attn, c.attn, detail::rms_norm_rows(h, lw.attn_norm, c.rms_eps),
                                     detail::rms_norm_rows(h_out, lw.attn_norm, c.rms_eps), segs, layer_caches, y, y_out);
    if (trace) trace->y_out.push_back(y_out);
    h += y;
    h_out += y_out;
    // h += SwiGLU(RMSNorm(h)), token-wise, same weights for both streams
    h += detail::swiglu(lw, detail::rms_norm_rows(h, lw.ffn_norm, c.rms_eps));
    h_out += detail::swiglu(lw, detail::rms_norm_rows(h_out, lw.ffn_norm, c.rms_eps));
  }
  const Mat<S> logits = project(detail::rms_norm_rows(h_out, w.final_norm, c.rms_eps), w.lm_head);
  std::vector<Mat<S>> out;
  for (const Segment& s : segs) out.push_back(logits.middleRows(s.out_begin, s.T_out));
  return out;
}

/// Forward pass of one sequence: `forward_batch` with a batch of one. Returns [T_out, V].
template <typename S>
Mat<S> forward(const ModelWeights<S>& w, const ModelConfig& c, const std::vector<int>& tokens, Eigen::Index T_out,
               ModelCache<S>& cache, ForwardTrace<S>* trace = nullptr) {
  return forward_batch<S>(w, c, {SequenceInput{tokens, T_out}}, {&cache}, trace).front();
}

}  // namespace orthros
