// `orthros verify --grad --device cuda`: the backward on the GPU against the float64
// oracle under SPEC §6 (§9 for gradients), in bf16: the attention operator's dq, dq', dk, dv and
// a training step of the attention layer (every parameter gradient and dx, dx'), for PT, SFT and
// window-only training sequences, each alone and all four in one ragged batch. Compiled only in
// CUDA builds.
#ifdef ORTHROS_HAVE_CUDA

#include "attention_case.hpp"
#include "device_buffer.hpp"
#include "verify_cuda.hpp"

#include "orthros/attention_backward.hpp"
#include "orthros/check.hpp"
#include "orthros/configs.hpp"
#include "orthros/cuda/attention_backward.hpp"
#include "orthros/cuda/layer_backward.hpp"
#include "orthros/layer_backward.hpp"
#include "orthros/model.hpp"
#include "orthros/seeded_inputs.hpp"

#include <cublas_v2.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using orthros::Mat;
using orthros::Vec;
using orthros::gpu_harness::check_cuda;
using orthros::gpu_harness::DeviceBuffer;
namespace gh = orthros::gpu_harness;
using BF = Eigen::bfloat16;
namespace oc = orthros::cuda;
namespace check = orthros::check;

// One training sequence of the table: T tokens, the last T_out with output queries (P = 0).
struct SeqShape {
  std::string regime;
  int T, T_out;
};

// SPEC §6 verdict over several tensors: worst ratios to the two bounds, failures listed.
struct Verdict {
  bool pass = true;
  double worst_abs = 0, worst_rel = 0;
  double oracle_rel = 0;  // the same relative criterion for the oracle run in bf16 (context, not judged)
  std::string failures;
  void add(const std::string& name, const Mat<double>& got, const Mat<double>& ref, const Mat<double>& at, int heads,
           int inner) {
    if (ref.size() == 0) return;
    const auto r = check::compare(name, got, ref, heads, inner, "bf16", check::max_abs_diff(at, ref));
    worst_abs = std::max(worst_abs, r.max_abs / r.abs_tol);
    worst_rel = std::max(worst_rel, r.rel_fro / r.rel_tol);
    const auto ro = check::compare(name, at, ref, heads, inner, "bf16", check::max_abs_diff(at, ref));
    oracle_rel = std::max(oracle_rel, ro.rel_fro / ro.rel_tol);
    if (!r.pass) {
      pass = false;
      char buf[256];
      std::snprintf(buf, sizeof buf, "      %s: rel_fro=%.3g (tol %.3g) max_abs=%.3g (tol %.3g) nan=%lld\n", name.c_str(),
                    r.rel_fro, r.rel_tol, r.max_abs, r.abs_tol, static_cast<long long>(r.nan_count));
      failures += buf;
    }
  }
};

template <typename S>
Mat<double> f64(const Mat<S>& m) {
  return m.template cast<double>();
}
template <typename S>
Mat<double> f64(const Vec<S>& v) {
  return Mat<double>(v.template cast<double>().transpose());
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

oc::BatchLayout layout_of(const std::vector<SeqShape>& s) {
  oc::BatchLayout l;
  for (const auto& x : s) {
    l.q_lens.push_back(x.T);
    l.out_lens.push_back(x.T_out);
    l.cache_lens.push_back(x.T);
  }
  return l;
}

// Rows of `parts` stacked.
template <typename S>
Mat<S> stack(const std::vector<const Mat<S>*>& parts, Eigen::Index cols) {
  Eigen::Index n = 0;
  for (auto* p : parts) n += p->rows();
  Mat<S> m(n, cols);
  Eigen::Index r = 0;
  for (auto* p : parts) {
    m.middleRows(r, p->rows()) = *p;
    r += p->rows();
  }
  return m;
}

// ---- the attention operator ----

struct OpInputs {
  Mat<BF> q, k, v, q_out, d_o, d_o_out;
};
struct OpGrads {
  Mat<BF> dq, dq_out, dk, dv;
};

// attention_forward then attention_backward on the GPU for the sequences `shapes` of `in` in one
// call (an AttentionCase: outputs and gradients NaN-poisoned before, canaries checked after each
// call); returns each sequence's gradients. `ms`: the backward call alone.
std::vector<OpGrads> op_gpu(const oc::AttentionConfig& cfg, const std::vector<SeqShape>& shapes,
                            const std::vector<OpInputs>& in, double& ms) {
  const int B = static_cast<int>(shapes.size()), Hq = cfg.num_q_heads, Hkv = cfg.num_kv_heads, D = cfg.head_dim;
  gh::CaseShape shape{Hq, Hkv, D, cfg.window, int(sizeof(BF)), {}};
  for (const auto& s : shapes) shape.seqs.push_back({s.T, 0, s.T_out});
  gh::AttentionCase c(shape, oc::DType::bf16, true);
  for (int b = 0; b < B; ++b) {
    c.upload_sequence(b, in[b].q, in[b].k, in[b].v, in[b].q_out);
    c.upload_upstream(b, in[b].d_o, in[b].d_o_out);
  }
  const oc::AttentionConfig ccfg = c.config(cfg);
  c.forward(ccfg);
  c.set_backward_workspace(oc::attention_backward_workspace_bytes(ccfg, c.layout()));
  c.poison_gradients();
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const auto t0 = std::chrono::steady_clock::now();
  oc::attention_backward(ccfg, c.layout(), c.backward_buffers(), nullptr);
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize after attention_backward");
  ms = ms_since(t0);
  c.check_canaries();
  const size_t HD = size_t(Hq) * D, row_kv = size_t(Hkv) * D;
  std::vector<OpGrads> out(B);
  for (int b = 0; b < B; ++b) {
    OpGrads& g = out[b];
    g.dq.resize(shapes[b].T, HD);
    g.dq_out.resize(shapes[b].T_out, HD);
    g.dk.resize(shapes[b].T, row_kv);
    g.dv.resize(shapes[b].T, row_kv);
    gh::AttentionCase::download_rows(c.dq, g.dq, c.q_row(b));
    gh::AttentionCase::download_rows(c.dq_out, g.dq_out, c.out_row(b));
    gh::AttentionCase::download_rows(c.dk, g.dk, c.q_row(b));
    gh::AttentionCase::download_rows(c.dv, g.dv, c.q_row(b));
  }
  return out;
}

// ---- the layer ----

struct LayerInputs {
  Mat<BF> x, x_out, dy, dy_out;
};
struct LayerGradsHost {
  std::vector<Mat<BF>> dx, dx_out;  // per sequence
  orthros::AttentionWeights<BF> dw;  // summed over the sequences
};

LayerGradsHost layer_gpu(const oc::LayerConfig& cfg, const orthros::AttentionWeights<BF>& w,
                         const std::vector<SeqShape>& shapes, const std::vector<LayerInputs>& in,
                         cublasHandle_t blas, double& ms) {
  const oc::BatchLayout lay = layout_of(shapes);
  const Eigen::Index dm = cfg.d_model;
  std::vector<const Mat<BF>*> x, xo, dy, dyo;
  for (const auto& s : in) {
    x.push_back(&s.x);
    xo.push_back(&s.x_out);
    dy.push_back(&s.dy);
    dyo.push_back(&s.dy_out);
  }
  DeviceBuffer dx_in = DeviceBuffer::of("x", stack(x, dm)), dxo_in = DeviceBuffer::of("x_out", stack(xo, dm)),
               ddy = DeviceBuffer::of("dy", stack(dy, dm)), ddyo = DeviceBuffer::of("dy_out", stack(dyo, dm));
  DeviceBuffer wq = DeviceBuffer::of("w_q", w.w_q), wk = DeviceBuffer::of("w_k", w.w_k),
               wv = DeviceBuffer::of("w_v", w.w_v), wo = DeviceBuffer::of("w_o", w.w_o);
  DeviceBuffer al = DeviceBuffer::of("alpha", w.alpha), be = DeviceBuffer::of("beta", w.beta),
               alo = DeviceBuffer::of("alpha_out", w.alpha_out), beo = DeviceBuffer::of("beta_out", w.beta_out),
               qn = DeviceBuffer::of("q_norm", w.q_norm), kn = DeviceBuffer::of("k_norm", w.k_norm);
  const oc::LayerWeightsDevice gw{wq.data(), wk.data(), wv.data(), wo.data(), al.data(),
                                  be.data(), alo.data(), beo.data(), qn.data(), kn.data()};
  LayerGradsHost g;
  g.dw = orthros::zeros_like(w);
  const size_t es = sizeof(BF), tq = size_t(lay.total_q()), to = size_t(lay.total_out());
  DeviceBuffer odx("dx", tq * dm * es), odxo("dx_out", to * dm * es), owq("dw_q", g.dw.w_q.size() * es),
      owk("dw_k", g.dw.w_k.size() * es), owv("dw_v", g.dw.w_v.size() * es), owo("dw_o", g.dw.w_o.size() * es),
      oal("dalpha", g.dw.alpha.size() * es), obe("dbeta", g.dw.beta.size() * es),
      oalo("dalpha_out", g.dw.alpha_out.size() * es), obeo("dbeta_out", g.dw.beta_out.size() * es),
      oqn("dq_norm", g.dw.q_norm.size() * es), okn("dk_norm", g.dw.k_norm.size() * es),
      ws("layer backward workspace", oc::attention_layer_backward_workspace_bytes(cfg, lay) + 256);
  oc::LayerBackwardBuffers b;
  b.x = dx_in.data();
  b.x_out = to ? dxo_in.data() : nullptr;
  b.dy = ddy.data();
  b.dy_out = to ? ddyo.data() : nullptr;
  b.grads = {odx.data(), to ? odxo.data() : nullptr, owq.data(), owk.data(), owv.data(), owo.data(),
             oal.data(), obe.data(),  oalo.data(), obeo.data(), oqn.data(), okn.data()};
  b.workspace = ws.data();  // 256-byte aligned (DeviceBuffer keeps cudaMalloc's alignment)
  b.workspace_bytes = oc::attention_layer_backward_workspace_bytes(cfg, lay);
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const auto t0 = std::chrono::steady_clock::now();
  oc::attention_layer_backward(cfg, lay, gw, b, blas, nullptr);
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize after attention_layer_backward");
  ms = ms_since(t0);
  gh::check_canaries({&dx_in, &dxo_in, &ddy, &ddyo, &wq, &wk, &wv, &wo, &al, &be, &alo, &beo, &qn, &kn, &odx, &odxo,
                      &owq, &owk, &owv, &owo, &oal, &obe, &oalo, &obeo, &oqn, &okn, &ws});
  owq.download_into(g.dw.w_q);
  owk.download_into(g.dw.w_k);
  owv.download_into(g.dw.w_v);
  owo.download_into(g.dw.w_o);
  oal.download_into(g.dw.alpha);
  obe.download_into(g.dw.beta);
  oalo.download_into(g.dw.alpha_out);
  obeo.download_into(g.dw.beta_out);
  oqn.download_into(g.dw.q_norm);
  okn.download_into(g.dw.k_norm);
  size_t qoff = 0, ooff = 0;
  for (const auto& s : shapes) {
    Mat<BF> a(s.T, dm), c(s.T_out, dm);
    odx.download_into(a, qoff * dm);
    odxo.download_into(c, ooff * dm);
    g.dx.push_back(std::move(a));
    g.dx_out.push_back(std::move(c));
    qoff += s.T;
    ooff += s.T_out;
  }
  return g;
}

void add_weights(orthros::AttentionWeights<double>& a, const orthros::AttentionWeights<double>& b) {
  a.w_q += b.w_q, a.w_k += b.w_k, a.w_v += b.w_v, a.w_o += b.w_o;
  a.alpha += b.alpha, a.beta += b.beta, a.alpha_out += b.alpha_out, a.beta_out += b.beta_out;
  a.q_norm += b.q_norm, a.k_norm += b.k_norm;
}

void print_row(const char* part, const std::string& regime, const SeqShape* s, int tensors, const Verdict& v,
               const char* bitwise, double ms, int& failures) {
  char shape[32];
  if (s)
    std::snprintf(shape, sizeof shape, "%d/%d", s->T, s->T_out);
  else
    std::snprintf(shape, sizeof shape, "%s", "all four");
  std::printf("%-6s %-22s %-10s %8d %12.3f %12.3f %12.3f %8s %7s %9.3f\n", part, regime.c_str(), shape, tensors,
              v.worst_abs, v.worst_rel, v.oracle_rel, bitwise, v.pass ? "pass" : "FAIL", ms);
  if (!v.pass) {
    std::printf("%s", v.failures.c_str());
    ++failures;
  }
}

}  // namespace

int orthros_verify_grad_cuda(const std::string& config, int d_model, int seq_len, unsigned seed) {
  using orthros::require;
  const orthros::AttentionConfig ac = orthros::attention_config(config);
  require(seq_len >= 8, "seq_len must be >= 8 (got ", seq_len, ")");
  require(d_model >= 1, "d_model must be >= 1 (got ", d_model, ")");
  int ndev = 0;
  const cudaError_t probe = cudaGetDeviceCount(&ndev);
  require(probe == cudaSuccess && ndev > 0, "--device cuda: no usable CUDA GPU on this machine (",
          probe == cudaSuccess ? "no device found" : cudaGetErrorString(probe), ")");
  const int T = seq_len, Hq = ac.num_q_heads, Hkv = ac.num_kv_heads, D = ac.head_dim;
  const int HD = Hq * D, KD = Hkv * D;
  cudaDeviceProp prop;
  check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf(
      "orthros verify --grad --device cuda: %s, config %s (H_q=%d H_kv=%d D=%d w=%lld), d_model=%d, T=%d, bf16, "
      "seed %u\n",
      prop.name, config.c_str(), Hq, Hkv, D, static_cast<long long>(ac.window), d_model, T, seed);

  // Four training sequences: PT, SFT (half the tokens predict), SFT (one token), window only.
  const std::vector<SeqShape> shapes{{"PT", T, T},
                                     {"SFT T_out=T/2", T - T / 8 - 3, (T - T / 8 - 3) / 2},
                                     {"SFT T_out=1", T / 2 + 5, 1},
                                     {"window only T_out=0", T - T / 3, 0}};
  std::mt19937_64 rng(seed);
  auto rnd = [&](Eigen::Index rows, Eigen::Index cols) {  // never zero, rounded to bf16
    return Mat<BF>(orthros::verify::nonzero_mat(rows, cols, rng).cast<BF>());
  };
  orthros::AttentionOptions opt;
  opt.window = ac.window;
  int failures = 0;
  std::printf("\n%-6s %-22s %-10s %8s %12s %12s %12s %8s %7s %9s\n", "part", "regime", "T/T_out", "tensors",
              "max_abs/tol", "rel_fro/tol", "bf16 oracle", "bitwise", "SPEC6", "GPU ms");

  // ---- operator: dq, dq', dk, dv ----
  oc::AttentionConfig cfg;
  cfg.dtype = oc::DType::bf16;
  cfg.num_q_heads = Hq;
  cfg.num_kv_heads = Hkv;
  cfg.head_dim = D;
  cfg.window = ac.window;
  // A fixed split count: the forward's automatic one depends on the whole launch (it splits the
  // output stream when the batch has few output blocks), so a sequence's o_out, and with it its
  // gradients, would differ in bits between the batch and the single call at T >= 512 (8 key
  // tiles). With the count fixed the fast-mode forward is batch-invariant (docs/cuda.md), and the
  // bitwise column tests the backward's own batch invariance.
  cfg.num_splits = 1;
  std::vector<OpInputs> op_in;
  std::vector<orthros::AttentionGrads<double>> op_ref;
  std::vector<orthros::AttentionGrads<BF>> op_at;
  for (const auto& s : shapes) {
    OpInputs x{rnd(s.T, HD), rnd(s.T, KD), rnd(s.T, KD), rnd(s.T_out, HD), rnd(s.T, HD), rnd(s.T_out, HD)};
    op_ref.push_back(orthros::orthros_attention_backward<double>(f64(x.q), f64(x.k), f64(x.v), f64(x.q_out),
                                                                 f64(x.d_o), f64(x.d_o_out), ac.dims(), opt));
    op_at.push_back(orthros::orthros_attention_backward<BF>(x.q, x.k, x.v, x.q_out, x.d_o, x.d_o_out, ac.dims(), opt));
    op_in.push_back(std::move(x));
  }
  auto judge_op = [&](Verdict& v, const OpGrads& g, int b) {
    v.add("dq", f64(g.dq), op_ref[b].dq, f64(op_at[b].dq), Hq, D);
    v.add("dq_out", f64(g.dq_out), op_ref[b].dq_out, f64(op_at[b].dq_out), Hq, D);
    v.add("dk", f64(g.dk), op_ref[b].dk, f64(op_at[b].dk), Hkv, D);
    v.add("dv", f64(g.dv), op_ref[b].dv, f64(op_at[b].dv), Hkv, D);
  };
  std::vector<OpGrads> singles;
  for (size_t b = 0; b < shapes.size(); ++b) {
    double ms = 0;
    singles.push_back(op_gpu(cfg, {shapes[b]}, {op_in[b]}, ms)[0]);
    Verdict v;
    judge_op(v, singles.back(), int(b));
    print_row("op", shapes[b].regime, &shapes[b], shapes[b].T_out ? 4 : 3, v, "-", ms, failures);
  }
  {  // the four in one ragged call: SPEC §6, and bitwise equal to the single-sequence calls
    double ms = 0;
    const auto batch = op_gpu(cfg, shapes, op_in, ms);
    Verdict v;
    bool same = true;
    auto eq = [](const Mat<BF>& a, const Mat<BF>& c) {
      return a.size() == c.size() && (a.size() == 0 || std::memcmp(a.data(), c.data(), a.size() * sizeof(BF)) == 0);
    };
    for (size_t b = 0; b < shapes.size(); ++b) {
      judge_op(v, batch[b], int(b));
      same = same && eq(batch[b].dq, singles[b].dq) && eq(batch[b].dq_out, singles[b].dq_out) &&
             eq(batch[b].dk, singles[b].dk) && eq(batch[b].dv, singles[b].dv);
    }
    if (!same) v.pass = false, v.failures += "      batch gradients differ in bits from the single-sequence calls\n";
    print_row("op", "ragged batch B=4", nullptr, 15, v, same ? "yes" : "NO", ms, failures);
  }

  // ---- layer training step: dx, dx' and every parameter gradient ----
  orthros::ModelConfig mc = orthros::model_config(config, d_model, 1);
  const orthros::AttentionWeights<BF> w = orthros::random_weights<BF>(mc, seed).layers[0].attn;
  const orthros::AttentionWeights<double> wd = orthros::cast_weights<double>(w);
  oc::LayerConfig lc;
  lc.dtype = oc::DType::bf16;
  lc.d_model = d_model;
  lc.num_q_heads = Hq;
  lc.num_kv_heads = Hkv;
  lc.head_dim = D;
  lc.window = ac.window;
  lc.rope_theta = mc.attn.rope_theta;
  lc.qk_norm = mc.attn.qk_norm;
  lc.rms_eps = mc.attn.rms_eps;
  std::vector<LayerInputs> l_in;
  std::vector<orthros::LayerGrads<double>> l_ref;
  std::vector<orthros::LayerGrads<double>> l_at;  // the oracle at bf16, widened
  for (const auto& s : shapes) {
    LayerInputs x{rnd(s.T, d_model), rnd(s.T_out, d_model), rnd(s.T, d_model), rnd(s.T_out, d_model)};
    l_ref.push_back(orthros::orthros_attention_layer_backward<double>(wd, mc.attn, f64(x.x), f64(x.x_out), f64(x.dy),
                                                                      f64(x.dy_out)));
    const auto a = orthros::orthros_attention_layer_backward<BF>(w, mc.attn, x.x, x.x_out, x.dy, x.dy_out);
    l_at.push_back({f64(a.dx), f64(a.dx_out), orthros::cast_weights<double>(a.dw)});
    l_in.push_back(std::move(x));
  }
  cublasHandle_t blas = nullptr;
  require(cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS, "cublasCreate failed");
  struct BlasGuard {
    cublasHandle_t h;
    ~BlasGuard() { cublasDestroy(h); }
  } guard{blas};
  auto judge_layer = [&](Verdict& v, const LayerGradsHost& g, const std::vector<size_t>& seqs) {
    orthros::AttentionWeights<double> ref = orthros::zeros_like(wd), at = orthros::zeros_like(wd);
    for (size_t i = 0; i < seqs.size(); ++i) {
      const size_t b = seqs[i];
      v.add("dx", f64(g.dx[i]), l_ref[b].dx, l_at[b].dx, 1, d_model);
      v.add("dx_out", f64(g.dx_out[i]), l_ref[b].dx_out, l_at[b].dx_out, 1, d_model);
      add_weights(ref, l_ref[b].dw);
      add_weights(at, l_at[b].dw);
    }
    v.add("dW_Q", f64(g.dw.w_q), ref.w_q, at.w_q, 1, HD);
    v.add("dW_K", f64(g.dw.w_k), ref.w_k, at.w_k, 1, KD);
    v.add("dW_V", f64(g.dw.w_v), ref.w_v, at.w_v, 1, KD);
    v.add("dW_O", f64(g.dw.w_o), ref.w_o, at.w_o, 1, d_model);
    v.add("dalpha", f64(g.dw.alpha), f64(ref.alpha), f64(at.alpha), 1, HD);
    v.add("dbeta", f64(g.dw.beta), f64(ref.beta), f64(at.beta), 1, HD);
    bool any_out = false;
    for (size_t b : seqs) any_out = any_out || shapes[b].T_out > 0;
    if (any_out) {
      v.add("dalpha_out", f64(g.dw.alpha_out), f64(ref.alpha_out), f64(at.alpha_out), 1, HD);
      v.add("dbeta_out", f64(g.dw.beta_out), f64(ref.beta_out), f64(at.beta_out), 1, HD);
    } else if ((f64(g.dw.alpha_out).array() != 0).any() || (f64(g.dw.beta_out).array() != 0).any()) {
      v.pass = false;
      v.failures += "      dalpha_out/dbeta_out must be exactly 0 without output rows\n";
    }
    if (lc.qk_norm) {
      v.add("dq_norm", f64(g.dw.q_norm), f64(ref.q_norm), f64(at.q_norm), 1, D);
      v.add("dk_norm", f64(g.dw.k_norm), f64(ref.k_norm), f64(at.k_norm), 1, D);
    }
    return 2 + 4 + 2 + (any_out ? 2 : 0) + (lc.qk_norm ? 2 : 0);
  };
  for (size_t b = 0; b < shapes.size(); ++b) {
    double ms = 0;
    const auto g = layer_gpu(lc, w, {shapes[b]}, {l_in[b]}, blas, ms);
    Verdict v;
    const int n = judge_layer(v, g, {b});
    print_row("layer", shapes[b].regime, &shapes[b], n - (shapes[b].T_out ? 0 : 1), v, "-", ms, failures);
  }
  {
    double ms = 0;
    const auto g = layer_gpu(lc, w, shapes, l_in, blas, ms);
    Verdict v;
    const int n = judge_layer(v, g, {0, 1, 2, 3});
    print_row("layer", "ragged batch B=4", nullptr, n, v, "-", ms, failures);
  }
  std::printf(
      "\nop: attention_backward (dq, dq_out, dk, dv); layer: attention_layer_backward, a training step of the layer\n"
      "(dx, dx_out and the gradients of W_Q W_K W_V W_O, alpha beta alpha' beta', the QK-norm gains; weight\n"
      "gradients summed over the batch). Upstream gradients dO / dy are seeded random. Criteria: SPEC §6 against\n"
      "the float64 oracle, max_abs bound 2 E_bf16 + 1e-6 from the oracle run in bf16; columns give the worst\n"
      "ratio to each bound (pass: both <= 1); bf16 oracle: rel_fro/tol of the oracle itself run in bf16 (how much\n"
      "of the relative bound bf16 rounding alone uses). bitwise: the batch call equals the single calls in every\n"
      "bit. GPU ms: one call, synchronized; the first rows include CUDA's one-time module loading.\n");
  std::printf(failures ? "FAIL: %d rows failed\n" : "PASS: every gradient within SPEC §6 of the float64 oracle\n",
              failures);
  return failures ? 1 : 0;
}

#endif  // ORTHROS_HAVE_CUDA
