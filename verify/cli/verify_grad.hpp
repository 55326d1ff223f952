/// \file verify_grad.hpp
/// \brief `orthros verify --grad`: the backward oracle checked against finite differences (central
/// differences with Richardson extrapolation) at a named configuration's real attention shapes,
/// and SFT = masked PT, bitwise.
///
///   1. The attention operator's backward (attention_backward.hpp) in every operator regime of
///      SPEC §4 (PT, SFT, prefill, a prefill chunk with P > 0 and T_out = 0, a last chunk, a
///      decode pair): dq, dq_out, dk, dv on sampled entries, plus the directional derivative
///      along a random direction of all four inputs (every entry at once).
///   2. One training step of the model (training.hpp) for PT and SFT at several splits: every
///      parameter kind on a sampled entry of one layer (rotating over the columns), the directional derivative over all
///      parameters, and SFT's loss and gradients against PT with the loss masked to the same rows.
/// Error of an entry: |g - fd| / (1 + |g|), fd = verify::richardson_derivative (h = 1e-5); it
/// passes at <= kTol (derived beside it). Float64 only: finite differences need it.
#pragma once

#include "orthros/attention_backward.hpp"
#include "orthros/regimes.hpp"
#include "orthros/training.hpp"
#include "finite_difference.hpp"
#include "orthros/seeded_inputs.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace orthros::cli {

namespace grad_detail {

using Index = Eigen::Index;
// Pass criterion |g - R| / (1 + |g|) <= kTol with R = verify::richardson_derivative, h = 1e-5
// (error terms derived in finite_difference.hpp):
//   truncation  <= h^4/18 max|L^(5)| = 5.6e-22 max|L^(5)|: negligible, L being a smooth function
//               (softmax, RMSNorm, SwiGLU) of O(1) inputs.
//   rounding    <= 1.5 eps/h, eps the float64 rounding error of one loss evaluation. The operator's
//               loss sums n = (T + T_out) H_q D products dO * o, |dO| < 1, |o| ~ 0.05 (an average of
//               ~w values of random sign): n <= 1.2e6 at qwen3-8b (T = T_out = 141, H_q D = 4096),
//               partial sums ~ sqrt(n) 0.05 ~ 50, each addition rounding by <= ulp(50)/2 = 3.6e-15,
//               ~sqrt(n) of them adding up as a random walk: eps ~ 1.1e3 * 3.6e-15 / sqrt(3) = 2.3e-12,
//               1.5 eps/h ~ 3.4e-7. The training loss (a mean cross-entropy, |L| ~ log 256 = 5.5, summed
//               over T_out V <= 31 * 256 terms) has eps ~ 1e2 u |L| ~ 6e-14, 1.5 eps/h ~ 1e-8.
// So kTol = 1e-6 stays above both, while a wrong or missing term of a gradient is of the order of
// |g| itself.
constexpr double kTol = 1e-6;

inline double entry_error(double fd, double g) { return std::fabs(fd - g) / (1 + std::fabs(g)); }

/// `r x c` matrix of verify::nonzero_uniform values (|x| in [0.05, 1), random sign) from `rng`.
inline Mat<double> random_mat(Index r, Index c, std::mt19937_64& rng) { return verify::nonzero_mat(r, c, rng); }

struct OpRow {
  std::string regime;
  Index T = 0, P = 0, T_out = 0;
  double err[5] = {0, 0, 0, 0, 0};  // dq, dq_out, dk, dv, directional
  bool has_out = true;
  double seconds = 0;
};

/// Section 1: the operator's backward in each regime, on slices of one sequence.
inline std::vector<OpRow> operator_rows(const AttentionConfig& cfg, std::uint64_t seed) {
  const AttentionDims dims = cfg.dims();
  const Index w = cfg.window, N = w + 13;  // crosses the window, not a multiple of it
  std::mt19937_64 rng(seed);
  const Index cq = Index(dims.num_q_heads) * dims.head_dim, ckv = Index(dims.num_kv_heads) * dims.head_dim;
  const Mat<double> q_all = random_mat(N, cq, rng), k_all = random_mat(N, ckv, rng), v_all = random_mat(N, ckv, rng),
                    qo_all = random_mat(N, cq, rng), do_all = random_mat(N, cq, rng), doo_all = random_mat(N, cq, rng);
  struct Slice {
    std::string name;
    Index P, T, T_out;
  };
  const std::vector<Slice> slices{{"PT (T_out = T)", 0, N, N},
                                  {"SFT (T_out = T/4)", 0, N, N / 4},
                                  {"prefill (T_out = 1)", 0, N, 1},
                                  {"prefill chunk (P > 0, T_out = 0)", w / 2 + 1, w / 2, 0},
                                  {"last prefill chunk (P > 0)", w + 1, N - (w + 1), 1},
                                  {"decode pair (T = 1, P = t - 1)", N - 1, 1, 1}};
  std::vector<OpRow> rows;
  for (const Slice& s : slices) {
    const auto t0 = std::chrono::steady_clock::now();
    OpRow row;
    row.regime = s.name;
    row.T = s.T;
    row.P = s.P;
    row.T_out = s.T_out;
    row.has_out = s.T_out > 0;
    Mat<double> q = q_all.middleRows(s.P, s.T), k = k_all.topRows(s.P + s.T), v = v_all.topRows(s.P + s.T),
                qo = qo_all.middleRows(s.P + s.T - s.T_out, s.T_out);
    const Mat<double> dO = do_all.middleRows(s.P, s.T), dOo = doo_all.middleRows(s.P + s.T - s.T_out, s.T_out);
    const AttentionOptions opt{cfg.window, std::nullopt};
    auto loss = [&]() {
      const auto r = orthros_attention<double>(q, k, v, qo, dims, opt);
      return (r.o.array() * dO.array()).sum() + (r.o_out.array() * dOo.array()).sum();
    };
    const AttentionGrads<double> g = orthros_attention_backward<double>(q, k, v, qo, dO, dOo, dims, opt);
    Mat<double>* inputs[4] = {&q, &qo, &k, &v};
    const Mat<double>* grads[4] = {&g.dq, &g.dq_out, &g.dk, &g.dv};
    for (int t = 0; t < 4; ++t) {
      if (inputs[t]->size() == 0) continue;
      for (int n = 0; n < 3; ++n) {  // 3 random entries per tensor
        const Index i = static_cast<Index>(rng() % static_cast<std::uint64_t>(inputs[t]->size()));
        row.err[t] = std::max(row.err[t], entry_error(verify::richardson_partial(inputs[t]->data()[i], loss),
                                                      grads[t]->data()[i]));
      }
    }
    // directional derivative along u over all four inputs: d/ds L(x + s u) at s = 0 equals Σ g·u
    std::vector<Mat<double>> u;
    double g_dot_u = 0, norm2 = 0;
    for (int t = 0; t < 4; ++t) {
      u.push_back(random_mat(inputs[t]->rows(), inputs[t]->cols(), rng));
      norm2 += u.back().squaredNorm();
    }
    for (int t = 0; t < 4; ++t) {
      u[size_t(t)] /= std::sqrt(norm2);  // |u| = 1
      g_dot_u += (grads[t]->array() * u[size_t(t)].array()).sum();
    }
    const Mat<double> x0[4] = {q, qo, k, v};
    const double fd = verify::richardson_derivative([&](double s) {
      for (int t = 0; t < 4; ++t) *inputs[t] = x0[t] + s * u[size_t(t)];
      return loss();
    });
    for (int t = 0; t < 4; ++t) *inputs[t] = x0[t];
    row.err[4] = entry_error(fd, g_dot_u);
    row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "  operator %-34s done (%.1f s)\n", s.name.c_str(), row.seconds);
    rows.push_back(row);
  }
  return rows;
}

/// Parameter kinds: the name of a parameter without its "layers.<l>." prefix.
inline std::string kind_of(const std::string& name) {
  if (name.rfind("layers.", 0) != 0) return name;
  return name.substr(name.find('.', 7) + 1);
}

struct ModelColumn {
  std::string regime;
  Index T_out = 0;
  std::vector<std::pair<std::string, double>> err;  // parameter kind -> max entry error
  double directional = 0;
  int sft_equals_masked_pt = -1;  // -1: not applicable (PT), 0: differs, 1: bitwise equal
  double seconds = 0;
};

/// Section 2: a training step of the model, PT and SFT at several splits.
inline std::vector<ModelColumn> model_columns(const ModelConfig& c, const std::vector<int>& seq, std::uint64_t seed) {
  ModelWeights<double> w = random_weights<double>(c, seed);
  const Index T = static_cast<Index>(seq.size()) - 1;
  const std::vector<int> inputs(seq.begin(), seq.end() - 1);
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ULL);
  std::vector<ModelColumn> cols;
  for (Index T_out : {T, Index(1), T / 4, T - 1}) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool pt = T_out == T;
    ModelColumn col;
    col.regime = pt ? "PT" : "SFT T_out=" + std::to_string(T_out);
    col.T_out = T_out;
    const std::vector<int> targets(seq.end() - T_out, seq.end());
    auto loss = [&]() {
      ModelCache<double> cache = empty_cache<double>(c);
      return next_token_cross_entropy(forward(w, c, inputs, T_out, cache), targets);
    };
    const TrainingStep<double> step = pt ? pretrain_step(w, c, seq) : sft_step(w, c, seq, T_out);
    // one random entry of each parameter kind
    std::vector<std::pair<std::string, std::pair<double*, Index>>> params;
    std::vector<const double*> grads;
    for_each_parameter(w, [&](const std::string& n, double* p, Index k) { params.push_back({n, {p, k}}); });
    for_each_parameter(step.grads, [&](const std::string&, const double* p, Index) { grads.push_back(p); });
    // the layer rotates with the column, so every layer is sampled (the last layer's α, β get exactly
    // 0: its base stream reaches no logit)
    const int layer = static_cast<int>(cols.size() % static_cast<size_t>(c.num_layers));
    const std::string prefix = "layers." + std::to_string(layer) + ".";
    for (size_t t = 0; t < params.size(); ++t) {
      const std::string& name = params[t].first;
      if (name.rfind("layers.", 0) == 0 && name.rfind(prefix, 0) != 0) continue;
      if (!c.attn.qk_norm && (kind_of(name) == "attn.q_norm" || kind_of(name) == "attn.k_norm")) continue;
      Index i = static_cast<Index>(rng() % static_cast<std::uint64_t>(params[t].second.second));
      if (name == "embedding")  // a row of a token of the text (other rows have no gradient)
        i = Index(inputs[rng() % inputs.size()]) * c.d_model + Index(rng() % std::uint64_t(c.d_model));
      col.err.push_back(
          {kind_of(name), entry_error(verify::richardson_partial(params[t].second.first[i], loss), grads[t][i])});
    }
    // directional derivative over every parameter
    // (u normalized to |u| = 1, so the truncation error h^4/18 max|d^5L/du^5| stays that of one entry)
    std::vector<std::vector<double>> u(params.size());
    double g_dot_u = 0, norm2 = 0;
    for (size_t t = 0; t < params.size(); ++t)
      for (Index i = 0; i < params[t].second.second; ++i) {
        u[t].push_back(verify::nonzero_uniform(rng));
        norm2 += u[t].back() * u[t].back();
      }
    for (size_t t = 0; t < params.size(); ++t)
      for (Index i = 0; i < params[t].second.second; ++i) {
        u[t][size_t(i)] /= std::sqrt(norm2);
        g_dot_u += grads[t][i] * u[t][size_t(i)];
      }
    auto shift = [&](double by) {
      for (size_t t = 0; t < params.size(); ++t)
        for (Index i = 0; i < params[t].second.second; ++i) params[t].second.first[i] += by * u[t][size_t(i)];
    };
    const ModelWeights<double> saved = w;
    const double fd = verify::richardson_derivative([&](double s) {
      w = saved;
      shift(s);
      const double l = loss();
      w = saved;
      return l;
    });
    col.directional = entry_error(fd, g_dot_u);
    if (!pt) {  // SFT vs PT with the loss masked to the same rows: loss and every gradient, bitwise
      const TrainingStep<double> m = pretrain_step_masked(w, c, seq, T_out);
      bool same = std::memcmp(&m.loss, &step.loss, sizeof(double)) == 0;
      std::vector<const double*> mg;
      for_each_parameter(m.grads, [&](const std::string&, const double* p, Index) { mg.push_back(p); });
      for (size_t t = 0; t < params.size(); ++t)
        same = same && std::memcmp(mg[t], grads[t], size_t(params[t].second.second) * sizeof(double)) == 0;
      col.sft_equals_masked_pt = same ? 1 : 0;
    }
    col.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "  training step %-27s done (%.1f s)\n", col.regime.c_str(), col.seconds);
    cols.push_back(col);
  }
  return cols;
}

}  // namespace grad_detail

/// Runs both sections and prints their tables; returns 0 when every error is <= 1e-6 and every
/// SFT = masked-PT check is bitwise, 1 otherwise.
/// \param c    model configuration (attention shapes of a named config, small width/depth)
/// \param seq  T+1 byte tokens of real text (inputs are the first T)
/// \param seed seed of the weights and of the operator's random inputs
inline int run_verify_grad(const ModelConfig& c, const std::string& config_name, const std::vector<int>& seq,
                           std::uint64_t seed) {
  using namespace grad_detail;
  const Index T = static_cast<Index>(seq.size()) - 1;
  std::fprintf(stderr, "orthros verify --grad: operator regimes, then training steps (%s, T=%lld)...\n",
               config_name.c_str(), static_cast<long long>(T));
  const std::vector<OpRow> ops = operator_rows(c.attn, seed);
  const std::vector<ModelColumn> cols = model_columns(c, seq, seed);
  int failures = 0;
  auto mark = [&](double e) {
    failures += e <= kTol ? 0 : 1;
    return e;
  };
  std::printf("\northros verify --grad: config=%s (H_q=%d H_kv=%d D=%d w=%lld theta=%g qk_norm=%s) d_model=%d "
              "layers=%d T=%lld f64 seed=%llu\n",
              config_name.c_str(), c.attn.num_q_heads, c.attn.num_kv_heads, c.attn.head_dim,
              static_cast<long long>(c.attn.window), c.attn.rope_theta, c.attn.qk_norm ? "yes" : "no", c.d_model,
              c.num_layers, static_cast<long long>(T), static_cast<unsigned long long>(seed));
  std::printf("error = max |analytic - finite difference| / (1 + |analytic|); finite difference = (4 D(h) - D(2h)) / 3, "
              "D(s) = (L(x+s) - L(x-s)) / 2s, h = %.0e; pass <= %.0e\n\n",
              verify::kRichardsonStep, kTol);
  std::printf("attention operator backward (3 random entries per tensor; 'all' = derivative along a random unit direction of all inputs)\n");
  std::printf("%-36s %5s %5s %5s %10s %10s %10s %10s %10s %8s\n", "regime", "T", "P", "T_out", "dq", "dq_out", "dk",
              "dv", "all", "time (s)");
  for (const OpRow& r : ops) {
    char out[16];
    std::snprintf(out, sizeof out, "%.2e", mark(r.err[1]));
    std::printf("%-36s %5lld %5lld %5lld %10.2e %10s %10.2e %10.2e %10.2e %8.2f\n", r.regime.c_str(), (long long)r.T,
                (long long)r.P, (long long)r.T_out, mark(r.err[0]), r.has_out ? out : "-", mark(r.err[2]),
                mark(r.err[3]), mark(r.err[4]), r.seconds);
  }
  std::printf("\ntraining step: next-token cross-entropy on the output stream (one random entry per parameter kind in "
              "layer column %% L; the last layer's attn.alpha/beta have gradient 0 exactly)\n%-24s", "parameter");
  for (const ModelColumn& col : cols) std::printf(" %14s", col.regime.c_str());
  std::printf("\n");
  for (size_t k = 0; k < cols.front().err.size(); ++k) {
    std::printf("%-24s", cols.front().err[k].first.c_str());
    for (const ModelColumn& col : cols) std::printf(" %14.2e", mark(col.err[k].second));
    std::printf("\n");
  }
  std::printf("%-24s", "all (directional)");
  for (const ModelColumn& col : cols) std::printf(" %14.2e", mark(col.directional));
  std::printf("\n%-24s", "SFT = masked PT bitwise");
  for (const ModelColumn& col : cols) {
    std::printf(" %14s", col.sft_equals_masked_pt < 0 ? "-" : (col.sft_equals_masked_pt ? "yes" : "NO"));
    failures += col.sft_equals_masked_pt == 0 ? 1 : 0;
  }
  std::printf("\n%-24s", "time (s)");
  for (const ModelColumn& col : cols) std::printf(" %14.2f", col.seconds);
  std::printf("\n");
  if (failures)
    std::printf("FAIL: %d gradient check(s) failed\n", failures);
  else
    std::printf("PASS: every gradient agrees with finite differences; SFT = masked PT bitwise\n");
  return failures ? 1 : 0;
}

}  // namespace orthros::cli
