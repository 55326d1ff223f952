/// \file training.hpp
/// \brief One training step of the Orthros Transformer (paper Algorithm 2; SPEC §3, §4 PT and SFT):
/// the next-token cross-entropy on the output stream's logits and its gradient with respect to
/// every parameter, by hand-written backward passes (model.hpp forward, layer_backward.hpp,
/// attention_backward.hpp).
///
/// Loss (natural log, mean over the predicted positions that the mask keeps):
/// \code{.unparsed}
///   L = (1/N) Σ_{r kept} ( logsumexp(logits_r) - logits_r[target_r] ),   N = number of kept rows
///   dL/dlogits_r = (softmax(logits_r) - onehot(target_r)) / N   for kept rows, exactly 0 otherwise
/// \endcode
/// PT predicts every position (T_out = T); SFT the last T_out. A PT loss masked to the last T_out
/// rows is the SFT loss: the masked output rows get exact-zero gradients all the way down (an
/// output row influences only its own logits; output rows never write the KV cache), and every
/// gradient sum adds rows in a fixed order, so SFT and masked PT give the same bits.
#pragma once

#include "orthros/layer_backward.hpp"
#include "orthros/model.hpp"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace orthros {

/// Zero-filled model gradients with the shapes of `w`.
template <typename S>
ModelWeights<S> zeros_like(const ModelWeights<S>& w) {
  ModelWeights<S> z;
  z.embedding = Mat<S>::Zero(w.embedding.rows(), w.embedding.cols());
  for (const LayerWeights<S>& lw : w.layers) {
    LayerWeights<S> g;
    g.attn_norm = Vec<S>::Zero(lw.attn_norm.size());
    g.attn = zeros_like(lw.attn);
    g.ffn_norm = Vec<S>::Zero(lw.ffn_norm.size());
    g.w_gate = Mat<S>::Zero(lw.w_gate.rows(), lw.w_gate.cols());
    g.w_up = Mat<S>::Zero(lw.w_up.rows(), lw.w_up.cols());
    g.w_down = Mat<S>::Zero(lw.w_down.rows(), lw.w_down.cols());
    z.layers.push_back(std::move(g));
  }
  z.final_norm = Vec<S>::Zero(w.final_norm.size());
  z.lm_head = Mat<S>::Zero(w.lm_head.rows(), w.lm_head.cols());
  return z;
}

/// Calls `f(name, data, size)` for every parameter tensor of `w`, in a fixed order: "embedding",
/// "layers.<l>.attn_norm", "layers.<l>.attn.w_q", ... "final_norm", "lm_head". `data` points to
/// the tensor's `size` values (row-major). Works on weights and on gradients alike.
template <typename W, typename F>
void for_each_parameter(W& w, F&& f) {
  f(std::string("embedding"), w.embedding.data(), w.embedding.size());
  for (size_t l = 0; l < w.layers.size(); ++l) {
    auto& lw = w.layers[l];
    const std::string p = "layers." + std::to_string(l) + ".";
    f(p + "attn_norm", lw.attn_norm.data(), lw.attn_norm.size());
    f(p + "attn.w_q", lw.attn.w_q.data(), lw.attn.w_q.size());
    f(p + "attn.w_k", lw.attn.w_k.data(), lw.attn.w_k.size());
    f(p + "attn.w_v", lw.attn.w_v.data(), lw.attn.w_v.size());
    f(p + "attn.w_o", lw.attn.w_o.data(), lw.attn.w_o.size());
    f(p + "attn.alpha", lw.attn.alpha.data(), lw.attn.alpha.size());
    f(p + "attn.beta", lw.attn.beta.data(), lw.attn.beta.size());
    f(p + "attn.alpha_out", lw.attn.alpha_out.data(), lw.attn.alpha_out.size());
    f(p + "attn.beta_out", lw.attn.beta_out.data(), lw.attn.beta_out.size());
    f(p + "attn.q_norm", lw.attn.q_norm.data(), lw.attn.q_norm.size());
    f(p + "attn.k_norm", lw.attn.k_norm.data(), lw.attn.k_norm.size());
    f(p + "ffn_norm", lw.ffn_norm.data(), lw.ffn_norm.size());
    f(p + "w_gate", lw.w_gate.data(), lw.w_gate.size());
    f(p + "w_up", lw.w_up.data(), lw.w_up.size());
    f(p + "w_down", lw.w_down.data(), lw.w_down.size());
  }
  f(std::string("final_norm"), w.final_norm.data(), w.final_norm.size());
  f(std::string("lm_head"), w.lm_head.data(), w.lm_head.size());
}

/// The result of one training step's forward and backward.
template <typename S>
struct TrainingStep {
  double loss = 0;         ///< mean next-token cross-entropy over the kept rows (nats)
  Mat<S> logits;           ///< [T_out, V] the output stream's logits
  ModelWeights<S> grads;   ///< dL/dθ for every parameter, shapes of the weights
};

namespace detail {

/// Backward of the SwiGLU FFN: accumulates dW_gate, dW_up, dW_down; returns dL/dx.
/// silu(z) = z σ(z), silu'(z) = σ(z) (1 + z (1 - σ(z))).
template <typename S>
Mat<S> swiglu_backward(const LayerWeights<S>& lw, const Mat<S>& x, const SwigluStages<S>& st, const Mat<S>& dout,
                       LayerWeights<S>& g) {
  using Acc = AccumT<S>;
  project_backward_weight(g.w_down, st.act, dout);
  const Mat<S> dact = project_backward_input(dout, lw.w_down);
  Mat<S> dgate(dact.rows(), dact.cols()), dup(dact.rows(), dact.cols());
  for (Eigen::Index i = 0; i < dact.size(); ++i) {
    const Acc z = static_cast<Acc>(st.gate.data()[i]), u = static_cast<Acc>(st.up.data()[i]);
    const Acc sig = Acc(1) / (Acc(1) + std::exp(-z)), da = static_cast<Acc>(dact.data()[i]);
    dgate.data()[i] = static_cast<S>(da * u * sig * (Acc(1) + z * (Acc(1) - sig)));
    dup.data()[i] = static_cast<S>(da * z * sig);
  }
  project_backward_weight(g.w_gate, x, dgate);
  project_backward_weight(g.w_up, x, dup);
  return add(project_backward_input(dgate, lw.w_gate), project_backward_input(dup, lw.w_up));
}

/// What one decoder layer keeps for the backward, per stream.
template <typename S>
struct StreamSaved {
  Mat<S> h_in;        ///< residual entering the layer
  Mat<S> attn_in;     ///< RMSNorm(h_in), the attention layer's input
  Mat<S> h_mid;       ///< h_in + attention output
  Mat<S> ffn_in;      ///< RMSNorm(h_mid)
  SwigluStages<S> ffn;
};

}  // namespace detail

namespace detail {

/// Validates next-token targets (R ids in [0, V)) and a loss mask (empty or R flags, one true at
/// least); returns the number of kept rows. \throws orthros::Error naming the value.
inline Eigen::Index kept_rows(const std::vector<int>& targets, const std::vector<bool>& loss_mask, Eigen::Index R,
                              Eigen::Index V) {
  require(static_cast<Eigen::Index>(targets.size()) == R, "targets must have one id per logits row (", R, "); got ",
          targets.size());
  require(loss_mask.empty() || static_cast<Eigen::Index>(loss_mask.size()) == R, "loss_mask must have T_out = ", R,
          " entries (got ", loss_mask.size(), ")");
  Eigen::Index kept = 0;
  for (Eigen::Index r = 0; r < R; ++r) {
    require(targets[size_t(r)] >= 0 && targets[size_t(r)] < V, "target id ", targets[size_t(r)], " at ", r,
            " outside [0, ", V, ")");
    kept += (loss_mask.empty() || loss_mask[size_t(r)]) ? 1 : 0;
  }
  require(kept >= 1, "loss_mask keeps no row: nothing to train on");
  return kept;
}

}  // namespace detail

/// Mean next-token cross-entropy of `logits` (natural log), and optionally its gradient:
///   L = (1/N) Σ_{r kept} ( logsumexp(logits_r) - logits_r[target_r] )   (max-subtracted logsumexp)
///   dL/dlogits_r = (softmax(logits_r) - onehot(target_r)) / N for kept rows, exactly 0 for the others
/// \param logits    [R, V] (row r predicts targets[r])
/// \param targets   R ids in [0, V)
/// \param loss_mask empty (every row kept) or R flags, at least one true; N = number kept
/// \param dlogits   if not null, receives dL/dlogits [R, V]
/// 	hrows orthros::Error on a count mismatch, an id outside [0, V), or a mask keeping no row.
template <typename S>
double next_token_cross_entropy(const Mat<S>& logits, const std::vector<int>& targets,
                                const std::vector<bool>& loss_mask = {}, Mat<S>* dlogits = nullptr) {
  using Acc = AccumT<S>;
  using Index = Eigen::Index;
  const Index R = logits.rows(), V = logits.cols();
  const Index kept = detail::kept_rows(targets, loss_mask, R, V);
  if (dlogits) *dlogits = Mat<S>::Zero(R, V);
  double loss = 0;
  for (Index r = 0; r < R; ++r) {
    if (!(loss_mask.empty() || loss_mask[size_t(r)])) continue;  // masked: exact-zero gradient row
    Acc m = -std::numeric_limits<Acc>::infinity(), sum = 0;
    for (Index j = 0; j < V; ++j) m = std::max(m, static_cast<Acc>(logits(r, j)));
    for (Index j = 0; j < V; ++j) sum += std::exp(static_cast<Acc>(logits(r, j)) - m);
    const Acc lse = m + std::log(sum);
    loss += static_cast<double>(lse - static_cast<Acc>(logits(r, targets[size_t(r)])));
    if (!dlogits) continue;
    for (Index j = 0; j < V; ++j) {
      const Acc p = std::exp(static_cast<Acc>(logits(r, j)) - lse);
      const Acc onehot = j == targets[size_t(r)] ? Acc(1) : Acc(0);
      (*dlogits)(r, j) = static_cast<S>((p - onehot) / static_cast<Acc>(kept));
    }
  }
  return loss / static_cast<double>(kept);
}

/// Forward and backward of one training sequence (paper Algorithm 2 with P = 0).
///
/// \param w        model weights; \param c its configuration
/// \param tokens   T input token ids (positions 1..T), each in [0, V)
/// \param targets  T_out next-token ids, one per output position T-T_out+1..T (1 <= T_out <= T)
/// \param loss_mask optional, T_out flags: the loss averages over the rows flagged true (at least
///                 one); empty = every row. PT masked to its last T_out rows equals SFT bitwise.
/// \returns loss, logits [T_out, V] (bitwise those of `forward`) and every parameter's gradient.
/// \throws orthros::Error on a bad config, token/target ids outside [0, V), T_out outside [1, T],
///   a mask of the wrong length or with no true entry, weights whose shapes do not match `c`
///   (check_model_weights).
template <typename S>
TrainingStep<S> loss_and_gradients(const ModelWeights<S>& w, const ModelConfig& c, const std::vector<int>& tokens,
                                   const std::vector<int>& targets, const std::vector<bool>& loss_mask = {}) {
  using Index = Eigen::Index;
  using Acc = AccumT<S>;
  check_model_weights(w, c);
  const Index T = static_cast<Index>(tokens.size()), T_out = static_cast<Index>(targets.size());
  require(T_out >= 1 && T_out <= T, "targets must hold 1 <= T_out <= T next tokens (got T_out = ", T_out, ", T = ", T,
          ")");
  for (Index i = 0; i < T; ++i)
    require(tokens[size_t(i)] >= 0 && tokens[size_t(i)] < c.vocab_size, "token id ", tokens[size_t(i)], " at ", i,
            " outside [0, ", c.vocab_size, ")");
  detail::kept_rows(targets, loss_mask, T_out, c.vocab_size);  // validated before the forward

  // ---- forward (Algorithm 2), keeping what the backward needs ----
  Mat<S> h(T, c.d_model), h_out(T_out, c.d_model);
  for (Index i = 0; i < T; ++i) h.row(i) = w.embedding.row(tokens[size_t(i)]);
  for (Index i = 0; i < T_out; ++i) h_out.row(i) = w.embedding.row(tokens[size_t(T - T_out + i)]);
  std::vector<detail::StreamSaved<S>> base(size_t(c.num_layers)), out(size_t(c.num_layers));
  std::vector<LayerActivations<S>> attn(size_t(c.num_layers));  // each layer's attention, both streams
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights<S>& lw = w.layers[size_t(l)];
    detail::StreamSaved<S>& b = base[size_t(l)];
    detail::StreamSaved<S>& o = out[size_t(l)];
    b.h_in = h;
    o.h_in = h_out;
    b.attn_in = detail::rms_norm_rows(h, lw.attn_norm, c.rms_eps);
    o.attn_in = detail::rms_norm_rows(h_out, lw.attn_norm, c.rms_eps);
    const LayerActivations<S>& a = attn[size_t(l)] =
        orthros_attention_layer_training_forward(lw.attn, c.attn, b.attn_in, o.attn_in);
    h += a.y;
    h_out += a.y_out;
    b.h_mid = h;
    o.h_mid = h_out;
    b.ffn_in = detail::rms_norm_rows(h, lw.ffn_norm, c.rms_eps);
    o.ffn_in = detail::rms_norm_rows(h_out, lw.ffn_norm, c.rms_eps);
    b.ffn = detail::swiglu_stages(lw, b.ffn_in);
    o.ffn = detail::swiglu_stages(lw, o.ffn_in);
    h += b.ffn.out;
    h_out += o.ffn.out;
  }
  const Mat<S> z = detail::rms_norm_rows(h_out, w.final_norm, c.rms_eps);
  TrainingStep<S> step;
  step.logits = project(z, w.lm_head);

  // ---- loss and dL/dlogits ----
  Mat<S> dlogits;
  step.loss = next_token_cross_entropy(step.logits, targets, loss_mask, &dlogits);

  // ---- backward, in reverse; each weight's gradient sums the base rows, then the output rows ----
  ModelWeights<S>& g = step.grads = zeros_like(w);
  detail::project_backward_weight(g.lm_head, z, dlogits);
  Mat<S> dh_out = rms_norm_groups_backward(h_out, w.final_norm, c.d_model, c.rms_eps,
                                           detail::project_backward_input(dlogits, w.lm_head), g.final_norm);
  Mat<S> dh = Mat<S>::Zero(T, c.d_model);  // the base stream reaches the loss only through K/V
  for (int l = c.num_layers - 1; l >= 0; --l) {
    const LayerWeights<S>& lw = w.layers[size_t(l)];
    LayerWeights<S>& gl = g.layers[size_t(l)];
    const detail::StreamSaved<S>& b = base[size_t(l)];
    const detail::StreamSaved<S>& o = out[size_t(l)];
    // h = h_mid + SwiGLU(RMSNorm(h_mid)), both streams, shared weights
    const Mat<S> df_b = detail::swiglu_backward(lw, b.ffn_in, b.ffn, dh, gl);
    const Mat<S> df_o = detail::swiglu_backward(lw, o.ffn_in, o.ffn, dh_out, gl);
    const Mat<S> dmid_b = detail::add(dh, rms_norm_groups_backward(b.h_mid, lw.ffn_norm, c.d_model, c.rms_eps, df_b, gl.ffn_norm));
    const Mat<S> dmid_o =
        detail::add(dh_out, rms_norm_groups_backward(o.h_mid, lw.ffn_norm, c.d_model, c.rms_eps, df_o, gl.ffn_norm));
    // h_mid = h_in + Attn(RMSNorm(h_in))
    const LayerGrads<S> ga = orthros_attention_layer_backward(lw.attn, c.attn, b.attn_in, o.attn_in, attn[size_t(l)],
                                                               dmid_b, dmid_o);
    gl.attn = ga.dw;
    dh = detail::add(dmid_b, rms_norm_groups_backward(b.h_in, lw.attn_norm, c.d_model, c.rms_eps, ga.dx, gl.attn_norm));
    dh_out = detail::add(dmid_o,
                         rms_norm_groups_backward(o.h_in, lw.attn_norm, c.d_model, c.rms_eps, ga.dx_out, gl.attn_norm));
  }
  // embedding: h and h' start as rows of it (Algorithm 2, "duplicate"); base rows first
  auto scatter = [&](Index tok, const S* d) {
    for (Index j = 0; j < c.d_model; ++j)
      g.embedding(tok, j) = static_cast<S>(static_cast<Acc>(g.embedding(tok, j)) + static_cast<Acc>(d[j]));
  };
  for (Index i = 0; i < T; ++i) scatter(tokens[size_t(i)], dh.data() + i * c.d_model);
  for (Index i = 0; i < T_out; ++i) scatter(tokens[size_t(T - T_out + i)], dh_out.data() + i * c.d_model);
  return step;
}

/// Pre-training step: `sequence` holds T+1 tokens; inputs are the first T, every position t
/// predicts token t+1 (T_out = T). \throws orthros::Error if the sequence has < 2 tokens.
template <typename S>
TrainingStep<S> pretrain_step(const ModelWeights<S>& w, const ModelConfig& c, const std::vector<int>& sequence) {
  require(sequence.size() >= 2, "pretrain_step needs a sequence of >= 2 tokens (got ", sequence.size(), ")");
  return loss_and_gradients(w, c, std::vector<int>(sequence.begin(), sequence.end() - 1),
                            std::vector<int>(sequence.begin() + 1, sequence.end()));
}

/// SFT step: `sequence` holds T+1 tokens (prompt + response); inputs are the first T and only the
/// last T_out positions predict (their targets are the last T_out tokens of `sequence`).
/// \throws orthros::Error unless 1 <= T_out <= T.
template <typename S>
TrainingStep<S> sft_step(const ModelWeights<S>& w, const ModelConfig& c, const std::vector<int>& sequence,
                         Eigen::Index T_out) {
  require(sequence.size() >= 2, "sft_step needs a sequence of >= 2 tokens (got ", sequence.size(), ")");
  const Eigen::Index T = static_cast<Eigen::Index>(sequence.size()) - 1;
  require(T_out >= 1 && T_out <= T, "sft_step needs 1 <= T_out <= T (got T_out = ", T_out, ", T = ", T, ")");
  return loss_and_gradients(w, c, std::vector<int>(sequence.begin(), sequence.end() - 1),
                            std::vector<int>(sequence.end() - T_out, sequence.end()));
}

/// Pre-training step whose loss is masked to the last T_out positions (the SFT loss computed by
/// the PT graph): every position still has its output-specific token. Equals sft_step bitwise.
template <typename S>
TrainingStep<S> pretrain_step_masked(const ModelWeights<S>& w, const ModelConfig& c, const std::vector<int>& sequence,
                                     Eigen::Index T_out) {
  require(sequence.size() >= 2, "pretrain_step_masked needs a sequence of >= 2 tokens (got ", sequence.size(), ")");
  const Eigen::Index T = static_cast<Eigen::Index>(sequence.size()) - 1;
  require(T_out >= 1 && T_out <= T, "pretrain_step_masked needs 1 <= T_out <= T (got T_out = ", T_out, ", T = ", T, ")");
  std::vector<bool> mask(static_cast<size_t>(T), false);
  for (Eigen::Index r = T - T_out; r < T; ++r) mask[size_t(r)] = true;
  return loss_and_gradients(w, c, std::vector<int>(sequence.begin(), sequence.end() - 1),
                            std::vector<int>(sequence.begin() + 1, sequence.end()), mask);
}

/// Plain SGD update θ <- θ - lr · g on every parameter (the "one training step" of verify/).
/// \throws orthros::Error if `g` does not have the shapes of `w`.
template <typename S>
void sgd_update(ModelWeights<S>& w, const ModelWeights<S>& g, double lr) {
  std::vector<std::pair<S*, Eigen::Index>> params;
  for_each_parameter(w, [&](const std::string&, S* p, Eigen::Index n) { params.emplace_back(p, n); });
  size_t i = 0;
  for_each_parameter(g, [&](const std::string& name, const S* p, Eigen::Index n) {
    require(i < params.size() && params[i].second == n, "sgd_update: gradient ", name, " has ", n,
            " values, the weights differ");
    for (Eigen::Index k = 0; k < n; ++k)
      params[i].first[k] = static_cast<S>(static_cast<double>(params[i].first[k]) - lr * static_cast<double>(p[k]));
    ++i;
  });
}

}  // namespace orthros
