// GPU suite (ctest label `gpu`): the full Orthros attention layer on the GPU
// (orthros::cuda::attention_layer_forward: cuBLAS projections, QK-norm + scale-offset, RoPE fused
// with the KV-cache append, attention_forward) against the CPU reference layer
// orthros::orthros_attention_layer_batch<double> under SPEC §6, on ragged batches, two calls per
// case (the second continues the cache: P > 0). Without a GPU the GPU tests skip.
#include "gpu_testing.hpp"
#include "layer_testing.hpp"
#include "orthros/check.hpp"
#include "orthros/cuda/layer.hpp"
#include "orthros/layer.hpp"
#include "orthros_testing.hpp"

#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>

using namespace orthros;
using namespace orthros::gputest;
using orthros::testing::nonzero_uniform;
using orthros::testing::random_mat;
using orthros::testing::Rng;

namespace {

struct Call {
  std::vector<int> T, T_out;  // per sequence
};

struct LayerCase {
  int Hq, Hkv, D;
  std::int64_t d_model, window;
  bool qk_norm;
  bool deterministic;
  std::vector<Call> calls;  // consecutive calls on the same caches
  std::uint64_t seed;
};

std::string describe(const LayerCase& c, const char* dt) {
  std::ostringstream os;
  os << dt << " H_q=" << c.Hq << " H_kv=" << c.Hkv << " D=" << c.D << " d_model=" << c.d_model << " w=" << c.window
     << " qk_norm=" << c.qk_norm << " det=" << c.deterministic << " seed=" << c.seed << " calls:";
  for (const auto& cl : c.calls) {
    os << " {T=";
    for (int t : cl.T) os << t << ",";
    os << " T_out=";
    for (int t : cl.T_out) os << t << ",";
    os << "}";
  }
  return os.str();
}

template <typename S>
AttentionWeights<S> random_weights(const LayerCase& c, Rng& rng) {
  return random_layer_weights<S>(c.Hq, c.Hkv, c.D, c.d_model, rng);
}

template <typename S>
void run_layer_case(const LayerCase& c) {
  const std::string dt = dtype_name<S>();
  const std::string what = describe(c, dt.c_str());
  SCOPED_TRACE(what);
  Rng rng(c.seed);
  const int B = static_cast<int>(c.calls[0].T.size());
  const Eigen::Index dkv = Eigen::Index(c.Hkv) * c.D, dm = c.d_model;
  const size_t es = sizeof(S);

  orthros::AttentionConfig rcfg;
  rcfg.num_q_heads = c.Hq;
  rcfg.num_kv_heads = c.Hkv;
  rcfg.head_dim = c.D;
  rcfg.window = c.window;
  rcfg.rope_theta = 1e4;
  rcfg.qk_norm = c.qk_norm;
  rcfg.rms_eps = 1e-6;
  cuda::LayerConfig gcfg;
  gcfg.dtype = dtype_of<S>();
  gcfg.d_model = dm;
  gcfg.num_q_heads = c.Hq;
  gcfg.num_kv_heads = c.Hkv;
  gcfg.head_dim = c.D;
  gcfg.window = c.window;
  gcfg.rope_theta = rcfg.rope_theta;
  gcfg.qk_norm = c.qk_norm;
  gcfg.rms_eps = rcfg.rms_eps;
  gcfg.deterministic = c.deterministic;

  const AttentionWeights<S> w = random_weights<S>(c, rng);
  const AttentionWeights<double> wd = cast_weights<double>(w);
  auto dwq = to_dev<S>("w_q", w.w_q), dwk = to_dev<S>("w_k", w.w_k), dwv = to_dev<S>("w_v", w.w_v),
       dwo = to_dev<S>("w_o", w.w_o);
  auto dal = to_dev<S>("alpha", w.alpha), dbe = to_dev<S>("beta", w.beta), dalo = to_dev<S>("alpha_out", w.alpha_out),
       dbeo = to_dev<S>("beta_out", w.beta_out);
  auto dqn = to_dev<S>("q_norm", w.q_norm), dkn = to_dev<S>("k_norm", w.k_norm);
  cuda::LayerWeightsDevice gw;
  gw.w_q = dwq->data();
  gw.w_k = dwk->data();
  gw.w_v = dwv->data();
  gw.w_o = dwo->data();
  gw.alpha = dal->data();
  gw.beta = dbe->data();
  gw.alpha_out = dalo->data();
  gw.beta_out = dbeo->data();
  gw.q_norm = c.qk_norm ? dqn->data() : nullptr;  // not needed when qk_norm is off
  gw.k_norm = c.qk_norm ? dkn->data() : nullptr;

  // Caches: capacity = all calls' tokens + slack rows that stay NaN (never written, never read).
  std::int64_t cap = 0;
  for (int b = 0; b < B; ++b) {
    std::int64_t s = 0;
    for (const auto& cl : c.calls) s += cl.T[b];
    cap = std::max(cap, s);
  }
  cap += 11;
  DeviceBuffer kc("kc", size_t(B) * cap * dkv * es), vc("vc", size_t(B) * cap * dkv * es);
  std::vector<KVCache<double>> cache_d(B);
  std::vector<KVCache<S>> cache_s(B);
  for (int b = 0; b < B; ++b) {
    cache_d[b].k.resize(0, dkv);
    cache_d[b].v.resize(0, dkv);
    cache_s[b].k.resize(0, dkv);
    cache_s[b].v.resize(0, dkv);
  }
  Cublas blas;
  Verdict v;
  std::vector<std::int64_t> P(B, 0);
  for (size_t ci = 0; ci < c.calls.size(); ++ci) {
    const Call& cl = c.calls[ci];
    std::vector<Segment> segs(B);
    cuda::BatchLayout lay;
    Eigen::Index tq = 0, to = 0;
    for (int b = 0; b < B; ++b) {
      segs[b] = Segment{tq, cl.T[b], to, cl.T_out[b]};
      tq += cl.T[b];
      to += cl.T_out[b];
      lay.q_lens.push_back(cl.T[b]);
      lay.out_lens.push_back(cl.T_out[b]);
      lay.cache_lens.push_back(P[b] + cl.T[b]);
    }
    const Mat<S> x = random_mat<S>(tq, dm, rng), x_out = random_mat<S>(to, dm, rng);
    // GPU
    auto dx = to_dev<S>("x", x), dxo = to_dev<S>("x_out", x_out);
    DeviceBuffer dy("dy", std::max<size_t>(1, size_t(tq) * dm * es)),
        dyo("dyo", std::max<size_t>(1, size_t(to) * dm * es));  // NaN
    const size_t wsb = cuda::attention_layer_workspace_bytes(gcfg, lay);
    DeviceBuffer ws("ws", std::max<size_t>(256, wsb));  // NaN-poisoned scratch
    cuda::LayerBuffers gb;
    gb.x = dx->data();
    gb.x_out = to ? dxo->data() : nullptr;
    gb.k_cache = kc.data();
    gb.v_cache = vc.data();
    gb.capacity = cap;
    gb.y = dy.data();
    gb.y_out = to ? dyo.data() : nullptr;
    gb.workspace = ws.data();
    gb.workspace_bytes = ws.bytes();
    cuda::attention_layer_forward(gcfg, lay, gw, gb, blas.h, nullptr);
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize after attention_layer_forward");
    gpu_harness::check_canaries({dwq.get(), dwk.get(), dwv.get(), dwo.get(), dal.get(), dbe.get(), dalo.get(),
                                 dbeo.get(), dqn.get(), dkn.get(), dx.get(), dxo.get(), &kc, &vc, &dy, &dyo, &ws});
    Mat<S> y(tq, dm), y_out(to, dm);
    dy.download(y.data(), size_t(y.size()) * es);
    if (to) dyo.download(y_out.data(), size_t(y_out.size()) * es);
    // CPU references: float64 (the oracle) and at S (for the max-abs bound E_S).
    std::vector<KVCache<double>*> pd;
    std::vector<KVCache<S>*> ps;
    for (int b = 0; b < B; ++b) {
      pd.push_back(&cache_d[b]);
      ps.push_back(&cache_s[b]);
    }
    Mat<double> yd, yod;
    Mat<S> ys, yos;
    orthros_attention_layer_batch<double>(wd, rcfg, x.template cast<double>(), x_out.template cast<double>(), segs, pd,
                                          yd, yod);
    orthros_attention_layer_batch<S>(w, rcfg, x, x_out, segs, ps, ys, yos);
    const std::string sfx = " (call " + std::to_string(ci + 1) + ")";
    v.add("y" + sfx, y, yd, ys, 1, int(dm), dt);
    v.add("y_out" + sfx, y_out, yod, yos, 1, int(dm), dt);
    for (int b = 0; b < B; ++b) P[b] += cl.T[b];
  }
  // Cache contents (post-RoPE keys, values) after the last call; slack rows still NaN.
  for (int b = 0; b < B; ++b) {
    Mat<S> kg(cap, dkv), vg(cap, dkv);
    kc.download(kg.data(), size_t(kg.size()) * es, size_t(b) * cap * dkv * es);
    vc.download(vg.data(), size_t(vg.size()) * es, size_t(b) * cap * dkv * es);
    ASSERT_EQ(P[b], cache_d[b].length());
    const Mat<S> kt = kg.topRows(P[b]), vt = vg.topRows(P[b]);
    v.add("k_cache[" + std::to_string(b) + "]", kt, cache_d[b].k, cache_s[b].k, c.Hkv, c.D, dt);
    v.add("v_cache[" + std::to_string(b) + "]", vt, cache_d[b].v, cache_s[b].v, c.Hkv, c.D, dt);
    for (std::int64_t r = P[b]; r < cap; ++r)
      ASSERT_TRUE(std::isnan(double(kg(r, 0))) && std::isnan(double(vg(r, dkv - 1))))
          << "cache row " << r << " of sequence " << b << " beyond P+T was written";
  }
  std::printf("[layer] %s\n%s  worst max_abs/abs_tol = %.3g, worst rel_fro/rel_tol = %.3g\n", what.c_str(),
              v.report.c_str(), v.worst_ratio, v.worst_rel);
  EXPECT_TRUE(v.pass) << v.report;
}

std::vector<LayerCase> cases() {
  std::vector<LayerCase> cs;
  // GQA 4, D = 64 (tensor cores), qk_norm, w = 16; T_out = T / 1 / 0; second call continues (P > 0).
  cs.push_back({8, 2, 64, 256, 16, true, false, {{{37, 5, 64}, {37, 1, 0}}, {{3, 1, 20}, {1, 1, 20}}}, 101});
  // MHA, D = 128, no qk_norm, w >= T (full causal), chunked continuation, one decode step.
  cs.push_back({4, 4, 128, 192, std::int64_t(1) << 40, false, false, {{{50, 17}, {1, 17}}, {{1, 9}, {1, 0}}}, 202});
  // GQA 3, D = 32 (SIMT kernel), w = 7, then a decode step for all three sequences.
  cs.push_back({6, 2, 32, 96, 7, true, false, {{{70, 2, 33}, {0, 2, 33}}, {{1, 1, 1}, {1, 1, 1}}}, 303});
  // GQA 3, D = 128, w = 128, deterministic mode, longer sequences.
  cs.push_back({12, 4, 128, 512, 128, true, true, {{{200, 130}, {200, 1}}, {{64, 1}, {0, 1}}}, 404});
  return cs;
}

}  // namespace

TEST(GpuLayer, MatchesFloat64ReferenceBf16) {
  ORTHROS_REQUIRE_GPU();
  for (const auto& c : cases()) run_layer_case<Eigen::bfloat16>(c);
}
TEST(GpuLayer, MatchesFloat64ReferenceF16) {
  ORTHROS_REQUIRE_GPU();
  for (const auto& c : cases()) run_layer_case<Eigen::half>(c);
}
TEST(GpuLayer, MatchesFloat64ReferenceF32) {
  ORTHROS_REQUIRE_GPU();
  for (const auto& c : cases()) run_layer_case<float>(c);
}

// The handle's stream and math mode are restored after the call.
TEST(GpuLayer, RestoresCublasHandleState) {
  ORTHROS_REQUIRE_GPU();
  LayerCase c{2, 1, 16, 32, 4, true, false, {{{3}, {1}}}, 7};
  Cublas blas;
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreate(&s), "cudaStreamCreate");
  ASSERT_EQ(cublasSetMathMode(blas.h, CUBLAS_TF32_TENSOR_OP_MATH), CUBLAS_STATUS_SUCCESS);
  Rng rng(c.seed);
  const auto w = random_weights<float>(c, rng);
  auto dwq = to_dev<float>("w_q", w.w_q), dwk = to_dev<float>("w_k", w.w_k), dwv = to_dev<float>("w_v", w.w_v),
       dwo = to_dev<float>("w_o", w.w_o);
  auto dal = to_dev<float>("alpha", w.alpha), dbe = to_dev<float>("beta", w.beta),
       dqn = to_dev<float>("q_norm", w.q_norm);
  cuda::LayerWeightsDevice gw{dwq->data(), dwk->data(), dwv->data(), dwo->data(), dal->data(),
                              dbe->data(), dal->data(), dbe->data(), dqn->data(), dqn->data()};
  cuda::LayerConfig g;
  g.dtype = cuda::DType::f32;
  g.d_model = 32;
  g.num_q_heads = 2;
  g.num_kv_heads = 1;
  g.head_dim = 16;
  g.window = 4;
  const auto lay = cuda::BatchLayout::single(3, 0, 1);
  const auto x = random_mat<float>(3, 32, rng), xo = random_mat<float>(1, 32, rng);
  auto dx = to_dev<float>("x", x), dxo = to_dev<float>("xo", xo);
  DeviceBuffer kc("kc", 8 * 16 * 4), vc("vc", 8 * 16 * 4), y("y", 3 * 32 * 4), yo("yo", 32 * 4),
      ws("ws", std::max<size_t>(256, cuda::attention_layer_workspace_bytes(g, lay)));
  cuda::LayerBuffers b{dx->data(), dxo->data(), kc.data(), vc.data(), 8, y.data(), yo.data(), ws.data(), ws.bytes()};
  cuda::attention_layer_forward(g, lay, gw, b, blas.h, s);
  check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  cudaStream_t got_s = reinterpret_cast<cudaStream_t>(1);
  cublasMath_t got_m = CUBLAS_DEFAULT_MATH;
  ASSERT_EQ(cublasGetStream(blas.h, &got_s), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasGetMathMode(blas.h, &got_m), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(got_s, nullptr);
  EXPECT_EQ(got_m, CUBLAS_TF32_TENSOR_OP_MATH);
  Mat<float> yh(3, 32);
  y.download(yh.data(), yh.size() * 4);
  EXPECT_TRUE(yh.allFinite());
  // Bad arguments that need the device-side plan (attention_workspace_bytes asks the device).
  auto expect_error = [&](cuda::LayerWeightsDevice ww, cuda::LayerBuffers bb, cublasHandle_t h, const char* needle) {
    try {
      cuda::attention_layer_forward(g, lay, ww, bb, h, s);
      ADD_FAILURE() << "no error; expected one naming '" << needle << "'";
    } catch (const orthros::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto gw2 = gw;
  gw2.w_q = nullptr;
  expect_error(gw2, b, blas.h, "w_q");
  gw2 = gw;
  gw2.k_norm = nullptr;
  expect_error(gw2, b, blas.h, "k_norm");
  auto b2 = b;
  b2.x_out = nullptr;
  expect_error(gw, b2, blas.h, "x_out");
  b2 = b;
  b2.workspace_bytes = 0;
  expect_error(gw, b2, blas.h, "workspace");
  b2 = b;
  b2.capacity = 2;
  expect_error(gw, b2, blas.h, "capacity");
  expect_error(gw, b, nullptr, "cuBLAS handle");
  check_cuda(cudaStreamDestroy(s), "cudaStreamDestroy");
}

// Host-side validation that needs no device (runs everywhere).
TEST(GpuLayer, RejectsBadConfigBeforeAnyLaunch) {
  cuda::LayerConfig g;
  g.dtype = cuda::DType::bf16;
  g.d_model = 64;
  g.num_q_heads = 4;
  g.num_kv_heads = 2;
  g.head_dim = 64;
  const auto lay = cuda::BatchLayout::single(4, 0, 1);
  auto expect_error = [&](cuda::LayerConfig c, const char* needle) {
    try {
      (void)cuda::attention_layer_workspace_bytes(c, lay);
      ADD_FAILURE() << "no error; expected one naming '" << needle << "'";
    } catch (const orthros::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto c = g;
  c.d_model = 0;
  expect_error(c, "d_model");
  c = g;
  c.rope_theta = 0;
  expect_error(c, "rope_theta");
  c = g;
  c.rms_eps = -1;
  expect_error(c, "rms_eps");
  c = g;
  c.head_dim = 7;
  expect_error(c, "head_dim");
  c = g;
  c.num_kv_heads = 0;
  expect_error(c, "num_kv_heads");
}
