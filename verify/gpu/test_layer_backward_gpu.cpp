// GPU suite (ctest label `gpu`): the backward of the Orthros attention layer on the GPU
// (orthros::cuda::attention_layer_backward: recomputed forward, cuBLAS projection gradients,
// attention_backward, RoPE / scale-offset / QK-norm backward kernels) against the CPU oracle
// orthros::orthros_attention_layer_backward<double> under SPEC §6, for ragged batches of training
// sequences (PT, SFT, T_out = 0). Every gradient is checked: dx, dx', dW_Q, dW_K, dW_V, dW_O,
// dα, dβ, dα', dβ', the QK-norm gains. The weight gradients of a batch are the sum over its
// sequences (float64 for the oracle; the oracle at the dtype summed in float64 for E_X).
// Without a GPU the GPU tests skip.
#include "gpu_testing.hpp"
#include "layer_testing.hpp"
#include "orthros/cuda/layer_backward.hpp"
#include "orthros/layer_backward.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <sstream>

using namespace orthros;
using namespace orthros::gputest;

namespace {

struct BwdCase {
  int Hq, Hkv, D;
  std::int64_t d_model, window;
  bool qk_norm, deterministic;
  std::vector<int> T, T_out;  // per sequence (P = 0)
  std::uint64_t seed;
};

std::string describe(const BwdCase& c, const std::string& dt) {
  std::ostringstream os;
  os << dt << " H_q=" << c.Hq << " H_kv=" << c.Hkv << " D=" << c.D << " d_model=" << c.d_model << " w=" << c.window
     << " qk_norm=" << c.qk_norm << " det=" << c.deterministic << " seed=" << c.seed << " T={";
  for (int t : c.T) os << t << ",";
  os << "} T_out={";
  for (int t : c.T_out) os << t << ",";
  os << "}";
  return os.str();
}

template <typename S>
Mat<S> row_of(const Vec<S>& v) {
  return Mat<S>(v.transpose());
}

// Host copies of every gradient, one layout for GPU results and references.
template <typename S>
struct Grads {
  Mat<S> dx, dx_out;
  AttentionWeights<S> dw;
};

// The GPU call on device copies of the inputs; returns the downloaded gradients.
template <typename S>
struct GpuRun {
  const cuda::LayerConfig& cfg;
  const cuda::BatchLayout& lay;
  const AttentionWeights<S>& w;
  Eigen::Index tq, to;

  Grads<S> operator()(const Mat<S>& x, const Mat<S>& x_out, const Mat<S>& dy, const Mat<S>& dy_out,
                      cublasHandle_t h) const {
    auto dwq = to_dev<S>("w_q", w.w_q), dwk = to_dev<S>("w_k", w.w_k), dwv = to_dev<S>("w_v", w.w_v),
         dwo = to_dev<S>("w_o", w.w_o);
    auto dal = to_dev<S>("alpha", w.alpha), dbe = to_dev<S>("beta", w.beta), dalo = to_dev<S>("alpha_out", w.alpha_out),
         dbeo = to_dev<S>("beta_out", w.beta_out);
    auto dqn = to_dev<S>("q_norm", w.q_norm), dkn = to_dev<S>("k_norm", w.k_norm);
    cuda::LayerWeightsDevice gw{dwq->data(),
                                dwk->data(),
                                dwv->data(),
                                dwo->data(),
                                dal->data(),
                                dbe->data(),
                                dalo->data(),
                                dbeo->data(),
                                cfg.qk_norm ? dqn->data() : nullptr,
                                cfg.qk_norm ? dkn->data() : nullptr};
    auto dx_in = to_dev<S>("x", x), dxo_in = to_dev<S>("x_out", x_out), ddy = to_dev<S>("dy", dy),
         ddyo = to_dev<S>("dy_out", dy_out);
    Grads<S> g;
    g.dw = zeros_like(w);
    g.dx.resize(tq, x.cols());
    g.dx_out.resize(to, x.cols());
    // Outputs NaN-poisoned by DeviceBuffer: anything the call does not write shows up as NaN.
    const size_t es = sizeof(S);
    auto out = [&](const char* name, const auto& m) {
      return std::make_unique<DeviceBuffer>(name, std::max<size_t>(1, size_t(m.size()) * es));
    };
    auto o_dx = out("dx", g.dx), o_dxo = out("dx_out", g.dx_out), o_wq = out("dw_q", g.dw.w_q),
         o_wk = out("dw_k", g.dw.w_k), o_wv = out("dw_v", g.dw.w_v), o_wo = out("dw_o", g.dw.w_o),
         o_al = out("dalpha", g.dw.alpha), o_be = out("dbeta", g.dw.beta), o_alo = out("dalpha_out", g.dw.alpha_out),
         o_beo = out("dbeta_out", g.dw.beta_out), o_qn = out("dq_norm", g.dw.q_norm),
         o_kn = out("dk_norm", g.dw.k_norm);
    DeviceBuffer ws("ws", std::max<size_t>(256, cuda::attention_layer_backward_workspace_bytes(cfg, lay)));
    cuda::LayerBackwardBuffers b;
    b.x = dx_in->data();
    b.x_out = to ? dxo_in->data() : nullptr;
    b.dy = ddy->data();
    b.dy_out = to ? ddyo->data() : nullptr;
    b.grads = {o_dx->data(),  to ? o_dxo->data() : nullptr,
               o_wq->data(),  o_wk->data(),
               o_wv->data(),  o_wo->data(),
               o_al->data(),  o_be->data(),
               o_alo->data(), o_beo->data(),
               o_qn->data(),  o_kn->data()};
    b.workspace = ws.data();
    b.workspace_bytes = ws.bytes();
    cuda::attention_layer_backward(cfg, lay, gw, b, h, nullptr);
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize after attention_layer_backward");
    gpu_harness::check_canaries({dwq.get(),  dwk.get(),  dwv.get(),  dwo.get(),   dal.get(),   dbe.get(),
                                 dalo.get(), dbeo.get(), dqn.get(),  dkn.get(),   dx_in.get(), dxo_in.get(),
                                 ddy.get(),  ddyo.get(), o_dx.get(), o_dxo.get(), o_wq.get(),  o_wk.get(),
                                 o_wv.get(), o_wo.get(), o_al.get(), o_be.get(),  o_alo.get(), o_beo.get(),
                                 o_qn.get(), o_kn.get(), &ws});
    auto down = [&](const DeviceBuffer& d, auto& m) {
      if (m.size()) d.download(m.data(), size_t(m.size()) * es);
    };
    down(*o_dx, g.dx);
    down(*o_dxo, g.dx_out);
    down(*o_wq, g.dw.w_q);
    down(*o_wk, g.dw.w_k);
    down(*o_wv, g.dw.w_v);
    down(*o_wo, g.dw.w_o);
    down(*o_al, g.dw.alpha);
    down(*o_be, g.dw.beta);
    down(*o_alo, g.dw.alpha_out);
    down(*o_beo, g.dw.beta_out);
    down(*o_qn, g.dw.q_norm);
    down(*o_kn, g.dw.k_norm);
    return g;
  }
};

// Adds b's weight gradients to a (float64).
void accumulate(AttentionWeights<double>& a, const AttentionWeights<double>& b) {
  a.w_q += b.w_q;
  a.w_k += b.w_k;
  a.w_v += b.w_v;
  a.w_o += b.w_o;
  a.alpha += b.alpha;
  a.beta += b.beta;
  a.alpha_out += b.alpha_out;
  a.beta_out += b.beta_out;
  a.q_norm += b.q_norm;
  a.k_norm += b.k_norm;
}

cuda::LayerConfig gpu_config(const BwdCase& c, cuda::DType dt) {
  cuda::LayerConfig g;
  g.dtype = dt;
  g.d_model = c.d_model;
  g.num_q_heads = c.Hq;
  g.num_kv_heads = c.Hkv;
  g.head_dim = c.D;
  g.window = c.window;
  g.rope_theta = 1e4;
  g.qk_norm = c.qk_norm;
  g.rms_eps = 1e-6;
  g.deterministic = c.deterministic;
  return g;
}

template <typename S>
void run_case(const BwdCase& c) {
  const std::string dt = dtype_name<S>();
  const std::string what = describe(c, dt);
  SCOPED_TRACE(what);
  Rng rng(c.seed);
  const int B = static_cast<int>(c.T.size());
  orthros::AttentionConfig rcfg;
  rcfg.num_q_heads = c.Hq;
  rcfg.num_kv_heads = c.Hkv;
  rcfg.head_dim = c.D;
  rcfg.window = c.window;
  rcfg.rope_theta = 1e4;
  rcfg.qk_norm = c.qk_norm;
  rcfg.rms_eps = 1e-6;
  const cuda::LayerConfig gcfg = gpu_config(c, dtype_of<S>());
  cuda::BatchLayout lay;
  Eigen::Index tq = 0, to = 0;
  for (int b = 0; b < B; ++b) {
    lay.q_lens.push_back(c.T[b]);
    lay.out_lens.push_back(c.T_out[b]);
    lay.cache_lens.push_back(c.T[b]);
    tq += c.T[b];
    to += c.T_out[b];
  }
  const auto w = random_layer_weights<S>(c.Hq, c.Hkv, c.D, c.d_model, rng);
  const auto wd = cast_weights<double>(w);
  const Mat<S> x = random_mat<S>(tq, c.d_model, rng), x_out = random_mat<S>(to, c.d_model, rng);
  const Mat<S> dy = random_mat<S>(tq, c.d_model, rng), dy_out = random_mat<S>(to, c.d_model, rng);

  Cublas blas;
  const GpuRun<S> run{gcfg, lay, w, tq, to};
  const Grads<S> g = run(x, x_out, dy, dy_out, blas.h);

  // References per sequence: float64 (the oracle) and at S (E_S), concatenated / summed.
  Grads<double> ref, at;
  ref.dw = zeros_like(wd);
  at.dw = zeros_like(wd);
  ref.dx.resize(tq, c.d_model);
  at.dx.resize(tq, c.d_model);
  ref.dx_out.resize(to, c.d_model);
  at.dx_out.resize(to, c.d_model);
  Eigen::Index qo = 0, oo = 0;
  for (int b = 0; b < B; ++b) {
    const Eigen::Index T = c.T[b], To = c.T_out[b];
    const Mat<S> xb = x.middleRows(qo, T), xob = x_out.middleRows(oo, To), dyb = dy.middleRows(qo, T),
                 dyob = dy_out.middleRows(oo, To);
    const auto gd = orthros_attention_layer_backward<double>(wd, rcfg, xb.template cast<double>(),
                                                             xob.template cast<double>(), dyb.template cast<double>(),
                                                             dyob.template cast<double>());
    const auto gs = orthros_attention_layer_backward<S>(w, rcfg, xb, xob, dyb, dyob);
    ref.dx.middleRows(qo, T) = gd.dx;
    ref.dx_out.middleRows(oo, To) = gd.dx_out;
    at.dx.middleRows(qo, T) = gs.dx.template cast<double>();
    at.dx_out.middleRows(oo, To) = gs.dx_out.template cast<double>();
    accumulate(ref.dw, gd.dw);
    accumulate(at.dw, cast_weights<double>(gs.dw));
    qo += T;
    oo += To;
  }
  Verdict v;
  const int dm = int(c.d_model), d = c.Hq * c.D, dkv = c.Hkv * c.D;
  auto add = [&](const std::string& name, const Mat<S>& got, const Mat<double>& r, const Mat<double>& a, int inner) {
    v.add(name, Mat<double>(got.template cast<double>()), r, a, 1, inner, dt);
  };
  add("dx", g.dx, ref.dx, at.dx, dm);
  add("dx_out", g.dx_out, ref.dx_out, at.dx_out, dm);
  add("dW_Q", g.dw.w_q, ref.dw.w_q, at.dw.w_q, d);
  add("dW_K", g.dw.w_k, ref.dw.w_k, at.dw.w_k, dkv);
  add("dW_V", g.dw.w_v, ref.dw.w_v, at.dw.w_v, dkv);
  add("dW_O", g.dw.w_o, ref.dw.w_o, at.dw.w_o, dm);
  add("dalpha", row_of(g.dw.alpha), row_of(ref.dw.alpha), row_of(at.dw.alpha), d);
  add("dbeta", row_of(g.dw.beta), row_of(ref.dw.beta), row_of(at.dw.beta), d);
  if (to > 0) {
    add("dalpha_out", row_of(g.dw.alpha_out), row_of(ref.dw.alpha_out), row_of(at.dw.alpha_out), d);
    add("dbeta_out", row_of(g.dw.beta_out), row_of(ref.dw.beta_out), row_of(at.dw.beta_out), d);
  } else {
    for (Eigen::Index i = 0; i < d; ++i)
      ASSERT_TRUE(double(g.dw.alpha_out[i]) == 0.0 && double(g.dw.beta_out[i]) == 0.0)
          << "dalpha_out/dbeta_out must be exactly 0 without output rows (index " << i << ")";
  }
  if (c.qk_norm) {
    add("dq_norm", row_of(g.dw.q_norm), row_of(ref.dw.q_norm), row_of(at.dw.q_norm), c.D);
    add("dk_norm", row_of(g.dw.k_norm), row_of(ref.dw.k_norm), row_of(at.dw.k_norm), c.D);
  } else {
    for (int i = 0; i < c.D; ++i)
      ASSERT_TRUE(double(g.dw.q_norm[i]) == 0.0 && double(g.dw.k_norm[i]) == 0.0)
          << "QK-norm gain gradients must be exactly 0 when qk_norm is off (index " << i << ")";
  }
  std::printf("[layer backward] %s\n%s  worst max_abs/abs_tol = %.3g, worst rel_fro/rel_tol = %.3g\n", what.c_str(),
              v.report.c_str(), v.worst_ratio, v.worst_rel);
  EXPECT_TRUE(v.pass) << v.report;

  // Run to run: bitwise the same gradients (fixed reduction orders) wherever the attention
  // backward is reproducible (not the Hopper fast mode's dq, added in no fixed order: attention_backward.hpp).
  if (!cuda::attention_backward_is_reproducible(gpu_config(c, dtype_of<S>()).attention(), lay)) return;
  const Grads<S> g2 = run(x, x_out, dy, dy_out, blas.h);
  auto same = [](const auto& a, const auto& b) {
    return a.size() == b.size() && (a.size() == 0 || std::memcmp(a.data(), b.data(), a.size() * sizeof(S)) == 0);
  };
  EXPECT_TRUE(same(g.dx, g2.dx) && same(g.dx_out, g2.dx_out) && same(g.dw.w_q, g2.dw.w_q) &&
              same(g.dw.w_k, g2.dw.w_k) && same(g.dw.w_v, g2.dw.w_v) && same(g.dw.w_o, g2.dw.w_o) &&
              same(g.dw.alpha, g2.dw.alpha) && same(g.dw.beta, g2.dw.beta) && same(g.dw.alpha_out, g2.dw.alpha_out) &&
              same(g.dw.beta_out, g2.dw.beta_out) && same(g.dw.q_norm, g2.dw.q_norm) &&
              same(g.dw.k_norm, g2.dw.k_norm))
      << "a second call gave different bits";
}

std::vector<BwdCase> cases() {
  std::vector<BwdCase> cs;
  // GQA 4, D = 64 (tensor cores), QK-norm, w = 16; PT, SFT T_out = 1, T_out = 0 in one batch.
  cs.push_back({8, 2, 64, 256, 16, true, false, {37, 5, 64}, {37, 1, 0}, 1101});
  // MHA, D = 128, no QK-norm, w >= T (full causal), SFT.
  cs.push_back({4, 4, 128, 192, std::int64_t(1) << 40, false, false, {50}, {17}, 1202});
  // GQA 3, D = 32 (SIMT kernels), w = 7, T = 2 and a sequence without output rows.
  cs.push_back({6, 2, 32, 96, 7, true, false, {70, 2, 33}, {0, 2, 33}, 1303});
  // GQA 7, D = 64, w = 128, deterministic forward, T not a tile multiple.
  cs.push_back({7, 1, 64, 128, 128, true, true, {200, 130}, {200, 1}, 1404});
  // w = 1 (each token attends only to itself), GQA 2, D = 128.
  cs.push_back({4, 2, 128, 64, 1, true, false, {19, 40}, {19, 3}, 1505});
  return cs;
}

}  // namespace

TEST(GpuLayerBackward, MatchesFloat64OracleBf16) {
  ORTHROS_REQUIRE_GPU();
  for (const auto& c : cases()) run_case<Eigen::bfloat16>(c);
}
TEST(GpuLayerBackward, MatchesFloat64OracleF16) {
  ORTHROS_REQUIRE_GPU();
  for (const auto& c : cases()) run_case<Eigen::half>(c);
}
TEST(GpuLayerBackward, MatchesFloat64OracleF32) {
  ORTHROS_REQUIRE_GPU();
  for (const auto& c : cases()) run_case<float>(c);
}

// Host-side validation (runs everywhere: no device needed before the first launch).
TEST(GpuLayerBackward, RejectsNonTrainingLayoutsAndBadConfigs) {
  BwdCase c{4, 2, 64, 64, 8, true, false, {4}, {1}, 1};
  const auto g = gpu_config(c, cuda::DType::bf16);
  auto expect_error = [&](cuda::LayerConfig cfg, cuda::BatchLayout lay, const char* needle) {
    try {
      (void)cuda::attention_layer_backward_workspace_bytes(cfg, lay);
      ADD_FAILURE() << "no error; expected one naming '" << needle << "'";
    } catch (const orthros::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(g, cuda::BatchLayout::single(4, 3, 1), "cache_lens[0] must equal q_lens[0]");
  expect_error(g, cuda::BatchLayout{{4, 2}, {1, 3}, {4, 2}}, "T_out");
  auto bad = g;
  bad.d_model = 0;
  expect_error(bad, cuda::BatchLayout::single(4, 0, 1), "d_model");
  bad = g;
  bad.rms_eps = -1;
  expect_error(bad, cuda::BatchLayout::single(4, 0, 1), "rms_eps");
}

// Null pointers are named before any launch.
TEST(GpuLayerBackward, NamesMissingBuffers) {
  ORTHROS_REQUIRE_GPU();
  BwdCase c{4, 2, 64, 64, 8, true, false, {4}, {1}, 2};
  const auto cfg = gpu_config(c, cuda::DType::f32);
  const auto lay = cuda::BatchLayout::single(4, 0, 1);
  Rng rng(c.seed);
  const auto w = random_layer_weights<float>(c.Hq, c.Hkv, c.D, c.d_model, rng);
  auto dwq = to_dev<float>("w_q", w.w_q), dwk = to_dev<float>("w_k", w.w_k), dwv = to_dev<float>("w_v", w.w_v),
       dwo = to_dev<float>("w_o", w.w_o);
  auto dal = to_dev<float>("alpha", w.alpha), dqn = to_dev<float>("q_norm", w.q_norm);
  const cuda::LayerWeightsDevice gw{dwq->data(), dwk->data(), dwv->data(), dwo->data(), dal->data(),
                                    dal->data(), dal->data(), dal->data(), dqn->data(), dqn->data()};
  DeviceBuffer big("big", 1 << 20),
      ws("ws", std::max<size_t>(256, cuda::attention_layer_backward_workspace_bytes(cfg, lay)));
  cuda::LayerBackwardBuffers b;
  b.x = b.x_out = b.dy = b.dy_out = big.data();
  b.grads = {big.data(), big.data(), big.data(), big.data(), big.data(), big.data(),
             big.data(), big.data(), big.data(), big.data(), big.data(), big.data()};
  b.workspace = ws.data();
  b.workspace_bytes = ws.bytes();
  Cublas blas;
  auto expect_error = [&](cuda::LayerWeightsDevice ww, cuda::LayerBackwardBuffers bb, cublasHandle_t h,
                          const char* needle) {
    try {
      cuda::attention_layer_backward(cfg, lay, ww, bb, h, nullptr);
      ADD_FAILURE() << "no error; expected one naming '" << needle << "'";
    } catch (const orthros::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto b2 = b;
  b2.grads.w_k = nullptr;
  expect_error(gw, b2, blas.h, "grads.w_k");
  b2 = b;
  b2.grads.k_norm = nullptr;
  expect_error(gw, b2, blas.h, "grads.k_norm");
  b2 = b;
  b2.dy_out = nullptr;
  expect_error(gw, b2, blas.h, "buffers.dy_out");
  b2 = b;
  b2.workspace_bytes = 16;
  expect_error(gw, b2, blas.h, "workspace");
  auto gw2 = gw;
  gw2.w_o = nullptr;
  expect_error(gw2, b, blas.h, "weights.w_o");
  expect_error(gw, b, nullptr, "cuBLAS handle");
}
