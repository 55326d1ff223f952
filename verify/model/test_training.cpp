// Training backward of the layer and the model (layer_backward.hpp, training.hpp): analytic
// gradients against finite differences (Richardson-extrapolated central differences) in float64,
// SFT = masked PT bitwise, the training forward equal to the inference forward bitwise, and the
// layer's equal-stream special case.
#include "finite_difference.hpp"
#include "orthros_model_rc.hpp"

#include "orthros/regimes.hpp"
#include "orthros/training.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstring>

using namespace orthros;
using namespace orthros::testing;

namespace {

// Derivatives by verify::richardson_derivative (finite_difference.hpp: central differences with
// one Richardson step, h = 1e-5; the plain central difference is not enough here, a q/k RMSNorm over
// D = 2 near a vector of small RMS r having |L'''| ~ 1/r^3). Tolerance, from the error terms derived
// there: truncation <= h^4/18 max|L^(5)| = 5.6e-22 max|L^(5)| (|L^(5)| ~ 1/r^5: < 1e-9 unless r < 4e-3); rounding
// <= 1.5 eps/h with eps ~ 1e3 u |L| (|L| ~ log V = 3.5, or a sum of O(1) outputs): ~2e-8 |L|, below
// 1e-7; the bound 1e-6 (1 + |g|) keeps that margin while a wrong or missing term is of the order of |g|.
bool fd_agrees(double fd, double analytic) { return std::fabs(fd - analytic) <= 1e-6 * (1 + std::fabs(analytic)); }
/// Fails unless the analytic gradient of p[i] agrees with the Richardson difference of loss() in p[i].
template <typename Loss>
void check_coordinate(const std::string& name, double* p, Index i, double analytic, Loss&& loss) {
  const double fd = verify::richardson_partial(p[i], loss);
  if (!fd_agrees(fd, analytic))
    RC_FAIL(detail::cat(name, "[", i, "]: analytic ", analytic, " vs finite difference ", fd, " (difference ",
                        fd - analytic, ")"));
}

/// Up to `per_tensor` coordinates of a tensor of n values (all of them when n is small).
std::vector<Index> draw_coordinates(Index n, int per_tensor) {
  if (n <= per_tensor) {
    std::vector<Index> all(static_cast<size_t>(n));
    for (Index i = 0; i < n; ++i) all[size_t(i)] = i;
    return all;
  }
  return *rc::gen::container<std::vector<Index>>(static_cast<size_t>(per_tensor), rc::gen::inRange<Index>(0, n));
}

/// Perturbs the weights away from the initialisation so scale-offsets are not ~1/~0 and the
/// q/k-norm gains differ per dim (a wrong index in their gradients then shows).
void spread_weights(ModelWeights<double>& w, std::uint64_t seed) {
  Rng rng(seed);
  for_each_parameter(w, [&](const std::string&, double* p, Index n) {
    for (Index i = 0; i < n; ++i) p[i] += 0.3 * nonzero_uniform(rng);
  });
}

// Every parameter tensor of the model: analytic gradient vs finite differences of the loss on up
// to 4 coordinates per tensor, PT or SFT, plus the directional derivative along a random
// direction of ALL parameters at once.
void model_finite_differences(bool pt) {
  const Index T = *rc::gen::inRange<Index>(1, 7);
  const ModelConfig c = draw_tiny_model_config(T);
  const Index T_out = pt ? T : *rc::gen::inRange<Index>(1, T + 1);
  const std::uint64_t wseed = *rc::gen::arbitrary<std::uint64_t>(), dseed = *rc::gen::arbitrary<std::uint64_t>();
  const std::vector<int> seq = draw_tokens(T + 1, c.vocab_size);
  RC_LOG() << describe(c) << " T=" << T << " T_out=" << T_out << " weight seed=" << wseed << "\n";
  ModelWeights<double> w = random_weights<double>(c, wseed);
  spread_weights(w, wseed ^ 0x5eedULL);
  auto loss = [&](const ModelWeights<double>& ww) {
    return pt ? pretrain_step(ww, c, seq).loss : sft_step(ww, c, seq, T_out).loss;
  };
  const TrainingStep<double> step = pt ? pretrain_step(w, c, seq) : sft_step(w, c, seq, T_out);
  std::vector<std::pair<std::string, const double*>> grads;
  for_each_parameter(step.grads, [&](const std::string& n, const double* p, Index) { grads.emplace_back(n, p); });
  size_t t = 0;
  for_each_parameter(w, [&](const std::string& name, double* p, Index n) {
    const double* g = grads[t++].second;
    std::vector<Index> coords = draw_coordinates(n, 4);
    if (name == "embedding")  // entries of rows of tokens in the sequence (other rows have no gradient)
      for (Index& i : coords) i = Index(seq[size_t(*rc::gen::inRange<Index>(0, T))]) * c.d_model + i % c.d_model;
    for (Index i : coords) check_coordinate(name, p, i, g[i], [&] { return loss(w); });
  });
  // Directional derivative: d/ds L(θ + s u) at s = 0 equals g·u for a random u with |u| = 1.
  Rng rng(dseed);
  std::vector<std::vector<double>> u;
  double norm2 = 0, g_dot_u = 0;
  for_each_parameter(w, [&](const std::string&, double*, Index n) {
    u.emplace_back();
    for (Index i = 0; i < n; ++i) {
      u.back().push_back(nonzero_uniform(rng));
      norm2 += u.back().back() * u.back().back();
    }
  });
  for (t = 0; t < u.size(); ++t)
    for (size_t i = 0; i < u[t].size(); ++i) {
      u[t][i] /= std::sqrt(norm2);
      g_dot_u += grads[t].second[i] * u[t][i];
    }
  const double fd = verify::richardson_derivative([&](double s) {
    ModelWeights<double> ws = w;
    size_t k = 0;
    for_each_parameter(ws, [&](const std::string&, double* p, Index n) {
      for (Index i = 0; i < n; ++i) p[i] += s * u[k][size_t(i)];
      ++k;
    });
    return loss(ws);
  });
  if (!fd_agrees(fd, g_dot_u))
    RC_FAIL(detail::cat("directional derivative: analytic ", g_dot_u, " vs finite difference ", fd, " (difference ",
                        fd - g_dot_u, ")"));
}

/// A random tiny model, T in [1, 9], T_out in [1, T], T+1 tokens (inputs + next tokens), weights.
struct TrainingCase {
  ModelConfig c;
  Index T, T_out;
  std::vector<int> seq;
  ModelWeights<double> w;
};
TrainingCase draw_training_case() {
  TrainingCase tc;
  tc.T = *rc::gen::inRange<Index>(1, 10);
  tc.c = draw_tiny_model_config(tc.T);
  tc.T_out = *rc::gen::inRange<Index>(1, tc.T + 1);
  const std::uint64_t wseed = *rc::gen::arbitrary<std::uint64_t>();
  tc.seq = draw_tokens(tc.T + 1, tc.c.vocab_size);
  RC_LOG() << describe(tc.c) << " T=" << tc.T << " T_out=" << tc.T_out << " weight seed=" << wseed << "\n";
  tc.w = random_weights<double>(tc.c, wseed);
  return tc;
}

// SFT = PT with the loss masked to the last T_out positions: same loss, same gradients, bitwise.
void sft_equals_masked_pt() {
  const auto [c, T, T_out, seq, w] = draw_training_case();
  const TrainingStep<double> s = sft_step(w, c, seq, T_out), m = pretrain_step_masked(w, c, seq, T_out);
  RC_ASSERT(std::memcmp(&s.loss, &m.loss, sizeof(double)) == 0);
  fail_if(bitwise_diff(Mat<double>(m.logits.bottomRows(T_out)), s.logits, "logits (kept rows)"));
  std::vector<std::pair<std::string, std::vector<double>>> a;
  for_each_parameter(s.grads, [&](const std::string& n, const double* p, Index k) { a.emplace_back(n, std::vector<double>(p, p + k)); });
  size_t t = 0;
  for_each_parameter(m.grads, [&](const std::string& n, const double* p, Index k) {
    RC_ASSERT(a[t].first == n);
    if (std::memcmp(a[t].second.data(), p, size_t(k) * sizeof(double)) != 0)
      RC_FAIL("gradient of " + n + " differs between SFT and masked PT");
    ++t;
  });
}

// The training forward computes the inference forward's logits bitwise (pretrain / sft).
void training_forward_equals_inference() {
  const auto [c, T, T_out, seq, w] = draw_training_case();
  const std::vector<int> inputs(seq.begin(), seq.end() - 1);
  fail_if(bitwise_diff(pretrain_step(w, c, seq).logits, pretrain(w, c, inputs), "PT logits"));
  fail_if(bitwise_diff(sft_step(w, c, seq, T_out).logits, sft(w, c, inputs, T_out), "SFT logits"));
}

/// A random layer: weights with scale-offsets away from 1 and 0, inputs x, x'.
struct LayerCase {
  AttentionConfig cfg;
  AttentionWeights<double> w;
  Mat<double> x, x_out, dy, dy_out;
};
LayerCase draw_layer_case(Index T, Index T_out, Index d_model) {
  LayerCase lc;
  const ModelConfig mc = draw_tiny_model_config(T);
  lc.cfg = mc.attn;
  const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
  RC_LOG() << describe(mc) << " T=" << T << " T_out=" << T_out << " d_model=" << d_model << " seed=" << seed << "\n";
  Rng rng(seed);
  const Index d = Index(lc.cfg.num_q_heads) * lc.cfg.head_dim, dkv = Index(lc.cfg.num_kv_heads) * lc.cfg.head_dim;
  lc.w.w_q = random_mat<double>(d_model, d, rng);
  lc.w.w_k = random_mat<double>(d_model, dkv, rng);
  lc.w.w_v = random_mat<double>(d_model, dkv, rng);
  lc.w.w_o = random_mat<double>(d, d_model, rng);
  auto vec = [&](Index n, double center) {
    Vec<double> v(n);
    for (Index i = 0; i < n; ++i) v[i] = center + 0.5 * nonzero_uniform(rng);
    return v;
  };
  lc.w.alpha = vec(d, 1.0);
  lc.w.beta = vec(d, 0.0);
  lc.w.alpha_out = vec(d, 1.0);
  lc.w.beta_out = vec(d, 0.0);
  lc.w.q_norm = vec(lc.cfg.head_dim, 1.0);
  lc.w.k_norm = vec(lc.cfg.head_dim, 1.0);
  lc.x = random_mat<double>(T, d_model, rng);
  lc.x_out = random_mat<double>(T_out, d_model, rng);
  lc.dy = random_mat<double>(T, d_model, rng);
  lc.dy_out = random_mat<double>(T_out, d_model, rng);
  return lc;
}

// The layer alone: dx, dx', and every weight's gradient vs finite differences of
// L = Σ dy ⊙ y + Σ dy' ⊙ y'; and the training forward's y, y' equal orthros_attention_layer's.
void layer_finite_differences() {
  const Index T = *rc::gen::inRange<Index>(1, 7), T_out = *rc::gen::inRange<Index>(0, T + 1);
  LayerCase lc = draw_layer_case(T, T_out, *rc::gen::element<Index>(4, 8));
  KVCache<double> cache;
  cache.k.resize(0, lc.w.w_k.cols());
  cache.v.resize(0, lc.w.w_v.cols());
  const auto ref = orthros_attention_layer<double>(lc.w, lc.cfg, lc.x, lc.x_out, cache);
  const LayerActivations<double> a = orthros_attention_layer_training_forward(lc.w, lc.cfg, lc.x, lc.x_out);
  fail_if(bitwise_diff(a.y, ref.first, "y: training forward vs orthros_attention_layer"));
  fail_if(bitwise_diff(a.y_out, ref.second, "y_out: training forward vs orthros_attention_layer"));
  auto loss = [&]() {
    const LayerActivations<double> f = orthros_attention_layer_training_forward(lc.w, lc.cfg, lc.x, lc.x_out);
    return (f.y.array() * lc.dy.array()).sum() + (f.y_out.array() * lc.dy_out.array()).sum();
  };
  const LayerGrads<double> g = orthros_attention_layer_backward(lc.w, lc.cfg, lc.x, lc.x_out, lc.dy, lc.dy_out);
  auto check = [&](const char* name, double* p, const double* gp, Index n) {
    for (Index i = 0; i < n; ++i) check_coordinate(name, p, i, gp[i], loss);
  };
  check("dx", lc.x.data(), g.dx.data(), lc.x.size());
  check("dx_out", lc.x_out.data(), g.dx_out.data(), lc.x_out.size());
  check("w_q", lc.w.w_q.data(), g.dw.w_q.data(), lc.w.w_q.size());
  check("w_k", lc.w.w_k.data(), g.dw.w_k.data(), lc.w.w_k.size());
  check("w_v", lc.w.w_v.data(), g.dw.w_v.data(), lc.w.w_v.size());
  check("w_o", lc.w.w_o.data(), g.dw.w_o.data(), lc.w.w_o.size());
  check("alpha", lc.w.alpha.data(), g.dw.alpha.data(), lc.w.alpha.size());
  check("beta", lc.w.beta.data(), g.dw.beta.data(), lc.w.beta.size());
  check("alpha_out", lc.w.alpha_out.data(), g.dw.alpha_out.data(), lc.w.alpha_out.size());
  check("beta_out", lc.w.beta_out.data(), g.dw.beta_out.data(), lc.w.beta_out.size());
  check("q_norm", lc.w.q_norm.data(), g.dw.q_norm.data(), lc.w.q_norm.size());
  check("k_norm", lc.w.k_norm.data(), g.dw.k_norm.data(), lc.w.k_norm.size());
}

// α = α', β = β', w >= T, x' = x, dy' = dy (T_out = T): both query streams are the same function,
// so their gradients are equal bitwise: dα = dα', dβ = dβ' (and the operator's dq = dq').
void layer_equal_streams() {
  const Index T = *rc::gen::inRange<Index>(1, 7);
  LayerCase lc = draw_layer_case(T, T, 8);
  lc.cfg.window = *rc::gen::element<std::int64_t>(std::int64_t(T), std::int64_t(T) + 2, std::int64_t(1) << 40);
  lc.w.alpha_out = lc.w.alpha;
  lc.w.beta_out = lc.w.beta;
  lc.x_out = lc.x;
  lc.dy_out = lc.dy;
  const LayerGrads<double> g = orthros_attention_layer_backward(lc.w, lc.cfg, lc.x, lc.x_out, lc.dy, lc.dy_out);
  RC_ASSERT(std::memcmp(g.dw.alpha.data(), g.dw.alpha_out.data(), size_t(g.dw.alpha.size()) * sizeof(double)) == 0);
  RC_ASSERT(std::memcmp(g.dw.beta.data(), g.dw.beta_out.data(), size_t(g.dw.beta.size()) * sizeof(double)) == 0);
}

}  // namespace

RC_GTEST_PROP(TrainingGradients, PretrainFiniteDifferences, ()) { model_finite_differences(true); }
RC_GTEST_PROP(TrainingGradients, SftFiniteDifferences, ()) { model_finite_differences(false); }
RC_GTEST_PROP(TrainingGradients, SftEqualsMaskedPretrainBitwise, ()) { sft_equals_masked_pt(); }
RC_GTEST_PROP(TrainingGradients, TrainingForwardEqualsInference, ()) { training_forward_equals_inference(); }
RC_GTEST_PROP(LayerBackward, FiniteDifferences, ()) { layer_finite_differences(); }
RC_GTEST_PROP(LayerBackward, EqualStreamsGiveEqualScaleOffsetGradients, ()) { layer_equal_streams(); }

// One SGD step along the gradient lowers the loss by about lr |g|^2 (first order), on the real
// qwen3-8b head shape at a small width; checks the gradient's scale and sign end to end.
TEST(TrainingStep, SgdStepLowersTheLossAsPredicted) {
  const std::uint64_t seed = 20261201;
  SCOPED_TRACE("seed " + std::to_string(seed));
  ModelConfig c;
  c.vocab_size = 64;
  c.d_model = 32;
  c.d_ff = 48;
  c.num_layers = 2;
  c.attn.num_q_heads = 4;
  c.attn.num_kv_heads = 2;
  c.attn.head_dim = 8;
  c.attn.window = 4;
  ModelWeights<double> w = random_weights<double>(c, seed);
  std::vector<int> seq;
  Rng rng(seed);
  for (int i = 0; i < 13; ++i) seq.push_back(static_cast<int>(rng() % 64));
  const TrainingStep<double> s = pretrain_step(w, c, seq);
  double g2 = 0;
  for_each_parameter(s.grads, [&](const std::string&, const double* p, Index n) {
    for (Index i = 0; i < n; ++i) g2 += p[i] * p[i];
  });
  ASSERT_GT(g2, 0);
  // L(θ - lr g) = L - lr |g|^2 + O(lr^2 |g|^2 |H|): with lr |H| << 1 the predicted drop holds to a few %.
  const double lr = 1e-4;
  sgd_update(w, s.grads, lr);
  const double drop = s.loss - pretrain_step(w, c, seq).loss;
  EXPECT_GT(drop, 0);
  EXPECT_NEAR(drop / (lr * g2), 1.0, 0.05) << "loss " << s.loss << ", |g|^2 " << g2 << ", drop " << drop;
}

TEST(TrainingStep, BadTargetsAndMasksAreNamed) {
  ModelConfig c;
  const ModelWeights<double> w = random_weights<double>(c, 1);
  auto msg = [](auto f) { return error_message(f); };
  EXPECT_NE(msg([&] { loss_and_gradients(w, c, {1, 2, 3}, {1, 2, 3, 4}); }).find("1 <= T_out <= T next tokens (got T_out = 4, T = 3)"),
            std::string::npos);
  EXPECT_NE(msg([&] { loss_and_gradients(w, c, {1, 2, 3}, {1, 999}); }).find("target id 999 at 1 outside [0, 256)"),
            std::string::npos);
  EXPECT_NE(msg([&] { loss_and_gradients(w, c, {1, 2, 3}, {1, 2}, {false, false}); }).find("loss_mask keeps no row"),
            std::string::npos);
  EXPECT_NE(msg([&] { loss_and_gradients(w, c, {1, 2, 3}, {1, 2}, {true}); }).find("loss_mask must have T_out = 2"),
            std::string::npos);
  EXPECT_NE(msg([&] { sft_step(w, c, {1, 2, 3}, 3); }).find("1 <= T_out <= T (got T_out = 3, T = 2)"), std::string::npos);
  // weights of another configuration: a named shape error, never an out-of-bounds read
  ModelConfig wide = c;
  wide.d_model = 2 * c.d_model;
  EXPECT_NE(msg([&] { pretrain_step(w, wide, {1, 2, 3}); }).find("embedding must be [256, 64]; got [256, 32]"),
            std::string::npos);
  ModelConfig big_vocab = c;
  big_vocab.vocab_size = 300;
  EXPECT_NE(msg([&] { pretrain_step(w, big_vocab, {280, 2, 3}); }).find("embedding must be [300, 32]; got [256, 32]"),
            std::string::npos);
  ModelWeights<double> broken = w;
  broken.layers[1].w_up.resize(3, 3);
  EXPECT_NE(msg([&] { pretrain_step(broken, c, {1, 2, 3}); }).find("layers.1.w_up must be [32, 64]; got [3, 3]"),
            std::string::npos);
  ModelConfig bad_eps = c;
  bad_eps.rms_eps = -1;
  EXPECT_NE(msg([&] { pretrain_step(w, bad_eps, {1, 2, 3}); }).find("rms_eps must be finite and > 0 (got -1)"),
            std::string::npos);
}
