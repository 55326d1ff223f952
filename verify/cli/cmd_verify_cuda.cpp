// `orthros verify --device cuda`: the regime table of the main job, computed by the
// CUDA kernels and checked against PT on the GPU (bitwise in deterministic mode) and against the
// float64 oracle under SPEC §6. Compiled only in CUDA builds.
#ifdef ORTHROS_HAVE_CUDA

#include "verify_cuda.hpp"

#include "attention_case.hpp"
#include "device_buffer.hpp"

#include "orthros/attention.hpp"
#include "orthros/check.hpp"
#include "orthros/configs.hpp"
#include "orthros/cuda/attention.hpp"
#include "orthros/seeded_inputs.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using orthros::Mat;
using BF = Eigen::bfloat16;
namespace oc = orthros::cuda;

namespace gh = orthros::gpu_harness;
using gh::check_cuda;
using gh::DeviceBuffer;

// Outputs of one regime, placed at absolute positions (rows = positions 0..T-1).
struct Outputs {
  Mat<BF> o, o_out;
  Mat<float> lse, lse_out;
  std::vector<char> has_base, has_out;
  double ms = 0;
};

struct Ctx {
  int T, Hq, Hkv, D;
  oc::AttentionConfig cfg;
  const Mat<BF>*q, *qo;  // full sequence on the host: q/q_out [T, Hq*D]
};

// Times one attention_forward of `ac` (outputs NaN-poisoned before, canaries checked after).
double timed_forward(const oc::AttentionConfig& cfg, gh::AttentionCase& ac) {
  ac.poison_outputs();
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const auto t0 = std::chrono::steady_clock::now();
  oc::attention_forward(cfg, ac.layout(), ac.forward_buffers(), nullptr);
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ac.check_canaries();
  return ms;
}

// One call over tokens [a, b) with the last t_out output queries; the cache rows 0..b-1 come
// from the device caches kc, vc ([T, Hkv, D]); the call's capacity is T.
void call(const Ctx& c, Outputs& out, int a, int b, int t_out, const DeviceBuffer& kc, const DeviceBuffer& vc) {
  const int n = b - a;
  gh::AttentionCase ac(gh::CaseShape::uniform(c.Hq, c.Hkv, c.D, c.cfg.window, 2, 1, n, a, t_out), oc::DType::bf16,
                       false, c.T - b);
  gh::AttentionCase::upload_rows(ac.q, c.q->middleRows(a, n), 0, ac.shape().q_row_bytes());
  gh::AttentionCase::upload_rows(ac.q_out, c.qo->middleRows(b - t_out, t_out), 0, ac.shape().q_row_bytes());
  const size_t kv_bytes = size_t(b) * size_t(ac.shape().kv_row_bytes());
  ac.k_cache.copy_from_device(kc.data(), kv_bytes);
  ac.v_cache.copy_from_device(vc.data(), kv_bytes);
  out.ms += timed_forward(c.cfg, ac);
  auto o = out.o.middleRows(a, n);
  auto lse = out.lse.middleRows(a, n);
  auto o_out = out.o_out.middleRows(b - t_out, t_out);
  auto lse_out = out.lse_out.middleRows(b - t_out, t_out);
  gh::AttentionCase::download_rows(ac.o, o, 0);
  gh::AttentionCase::download_rows(ac.lse, lse, 0);
  gh::AttentionCase::download_rows(ac.o_out, o_out, 0);
  gh::AttentionCase::download_rows(ac.lse_out, lse_out, 0);
  for (int i = a; i < b; ++i) out.has_base[i] = 1;
  for (int i = b - t_out; i < b; ++i) out.has_out[i] = 1;
}

Outputs empty_outputs(const Ctx& c) {
  Outputs r;
  r.o = Mat<BF>::Zero(c.T, c.Hq * c.D);
  r.o_out = Mat<BF>::Zero(c.T, c.Hq * c.D);
  r.lse = Mat<float>::Zero(c.T, c.Hq);
  r.lse_out = Mat<float>::Zero(c.T, c.Hq);
  r.has_base.assign(c.T, 0);
  r.has_out.assign(c.T, 0);
  return r;
}

template <typename M>
Mat<typename M::Scalar> pick(const M& m, const std::vector<char>& rows) {
  std::vector<int> idx;
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i]) idx.push_back(static_cast<int>(i));
  Mat<typename M::Scalar> r(idx.size(), m.cols());
  for (size_t i = 0; i < idx.size(); ++i) r.row(i) = m.row(idx[i]);
  return r;
}

}  // namespace

int orthros_verify_cuda(const std::string& config, int seq_len, unsigned seed) {
  using orthros::require;
  const orthros::AttentionConfig ac = orthros::attention_config(config);
  require(seq_len >= 8, "seq_len must be >= 8 (got ", seq_len, ")");
  int ndev = 0;
  const cudaError_t probe = cudaGetDeviceCount(&ndev);
  require(probe == cudaSuccess && ndev > 0, "--device cuda: no usable CUDA GPU on this machine (",
          probe == cudaSuccess ? "no device found" : cudaGetErrorString(probe), ")");
  const int T = seq_len, Hq = ac.num_q_heads, Hkv = ac.num_kv_heads, D = ac.head_dim, HD = Hq * D;
  cudaDeviceProp prop;
  check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("orthros verify --device cuda: %s, config %s (H_q=%d H_kv=%d D=%d w=%lld), T=%d, bf16, seed %u\n",
              prop.name, config.c_str(), Hq, Hkv, D, static_cast<long long>(ac.window), T, seed);

  // Seeded random post-projection inputs (never zero), rounded to bf16.
  std::mt19937_64 rng(seed);
  auto rnd = [&](int rows, int cols) { return Mat<BF>(orthros::verify::nonzero_mat(rows, cols, rng).cast<BF>()); };
  const Mat<BF> q = rnd(T, HD), k = rnd(T, Hkv * D), v = rnd(T, Hkv * D), qo = rnd(T, HD);

  // The float64 oracle (PT: every position) and the oracle at bf16 (for the SPEC §6 bound).
  orthros::AttentionOptions opt;
  opt.window = ac.window;
  const auto ref = orthros::orthros_attention<double>(q.cast<double>(), k.cast<double>(), v.cast<double>(),
                                                      qo.cast<double>(), ac.dims(), opt);
  const auto at = orthros::orthros_attention<BF>(q, k, v, qo, ac.dims(), opt);

  const DeviceBuffer dk = DeviceBuffer::of("k", k), dv = DeviceBuffer::of("v", v);  // the full cache [T, Hkv, D]

  int failures = 0;
  std::printf("\n%-5s %-22s %-12s %12s %8s %12s %7s %9s\n", "mode", "regime", "positions", "max|d| vs PT", "bitwise",
              "max err f64", "SPEC6", "time ms");
  for (bool det : {false, true}) {
    Ctx c{T, Hq, Hkv, D, {}, &q, &qo};
    c.cfg.dtype = oc::DType::bf16;
    c.cfg.num_q_heads = Hq;
    c.cfg.num_kv_heads = Hkv;
    c.cfg.head_dim = D;
    c.cfg.window = ac.window;
    c.cfg.deterministic = det;
    struct Named {
      std::string name;
      Outputs out;
    };
    std::vector<Named> regs;
    {  // PT
      Outputs r = empty_outputs(c);
      call(c, r, 0, T, T, dk, dv);
      regs.push_back({"PT", std::move(r)});
    }
    for (int split : {T / 2, T / 5}) {  // SFT with two response splits
      Outputs r = empty_outputs(c);
      call(c, r, 0, T, T - split, dk, dv);
      regs.push_back({"SFT T_out=" + std::to_string(T - split), std::move(r)});
    }
    {  // prefill
      Outputs r = empty_outputs(c);
      call(c, r, 0, T, 1, dk, dv);
      regs.push_back({"prefill", std::move(r)});
    }
    {  // chunked prefill: three uneven chunks, the last one with the output query
      Outputs r = empty_outputs(c);
      const int c1 = T / 3 + 1, c2 = (2 * T) / 3 + 3 < T ? (2 * T) / 3 + 3 : T - 1;
      call(c, r, 0, c1, 0, dk, dv);
      call(c, r, c1, c2, 0, dk, dv);
      call(c, r, c2, T, 1, dk, dv);
      regs.push_back({"chunked prefill", std::move(r)});
    }
    {  // prefill of the first half, then decode steps with the GPU cache append
      Outputs r = empty_outputs(c);
      DeviceBuffer kc("k cache", size_t(T) * Hkv * D * 2), vc("v cache", size_t(T) * Hkv * D * 2);  // NaN-poisoned
      const int p0 = T / 2;
      oc::rope_append_kv(oc::DType::bf16, oc::BatchLayout::single(p0, 0, 1), Hq, Hkv, D, dk.data(), dv.data(), kc.data(),
                         vc.data(), T, 0.0, 0, nullptr, nullptr);
      check_cuda(cudaDeviceSynchronize(), "rope_append_kv");
      gh::check_canaries({&dk, &dv, &kc, &vc});
      call(c, r, 0, p0, 1, kc, vc);
      for (int t = p0; t < T; ++t) {
        oc::rope_append_kv(oc::DType::bf16, oc::BatchLayout::single(1, t, 1), Hq, Hkv, D, dk.as<BF>(size_t(t) * Hkv * D),
                           dv.as<BF>(size_t(t) * Hkv * D), kc.data(), vc.data(), T, 0.0, 0, nullptr, nullptr);
        check_cuda(cudaDeviceSynchronize(), "rope_append_kv");
        gh::check_canaries({&kc, &vc});
        call(c, r, t, t + 1, 1, kc, vc);
      }
      regs.push_back({"prefill+decode", std::move(r)});
    }
    {  // ragged decode: 4 sequences (the same tokens, caches of different lengths) in one call
      Outputs r = empty_outputs(c);
      const int B = 4;
      std::vector<int> pos(B);  // decode position of sequence b
      gh::CaseShape shape = gh::CaseShape::uniform(Hq, Hkv, D, ac.window, 2, B, 1, 0, 1);
      for (int b = 0; b < B; ++b) {
        pos[b] = T - 1 - b * (T / 5);
        shape.seqs[b].P = pos[b];
      }
      gh::AttentionCase rc(shape, oc::DType::bf16);  // capacity: the longest cache, T
      const double qrow = rc.shape().q_row_bytes(), kvrow = rc.shape().kv_row_bytes();
      for (int b = 0; b < B; ++b) {
        const int t = pos[b];
        rc.k_cache.copy_from_device(dk.data(), size_t(t + 1) * size_t(kvrow), size_t(rc.cache_row(b)) * size_t(kvrow));
        rc.v_cache.copy_from_device(dv.data(), size_t(t + 1) * size_t(kvrow), size_t(rc.cache_row(b)) * size_t(kvrow));
        gh::AttentionCase::upload_rows(rc.q, q.middleRows(t, 1), rc.q_row(b), qrow);
        gh::AttentionCase::upload_rows(rc.q_out, qo.middleRows(t, 1), rc.out_row(b), qrow);
      }
      r.ms = timed_forward(c.cfg, rc);
      for (int b = 0; b < B; ++b) {
        const int t = pos[b];
        auto o = r.o.middleRows(t, 1), o_out = r.o_out.middleRows(t, 1);
        auto lse = r.lse.middleRows(t, 1), lse_out = r.lse_out.middleRows(t, 1);
        gh::AttentionCase::download_rows(rc.o, o, rc.q_row(b));
        gh::AttentionCase::download_rows(rc.o_out, o_out, rc.out_row(b));
        gh::AttentionCase::download_rows(rc.lse, lse, rc.q_row(b));
        gh::AttentionCase::download_rows(rc.lse_out, lse_out, rc.out_row(b));
        r.has_base[t] = r.has_out[t] = 1;
      }
      regs.push_back({"ragged decode B=4", std::move(r)});
    }

    const Outputs& pt = regs[0].out;
    for (auto& [name, r] : regs) {
      // vs PT on the GPU, on the rows this regime produced
      double dmax = 0;
      bool bitwise = true;
      auto cmp = [&](const auto& a, const auto& b, const std::vector<char>& rows) {
        for (int t = 0; t < T; ++t)
          if (rows[t])
            for (Eigen::Index j = 0; j < a.cols(); ++j) {
              dmax = std::max(dmax, std::abs(double(a(t, j)) - double(b(t, j))));
              if (std::memcmp(&a(t, j), &b(t, j), sizeof(a(t, j))) != 0) bitwise = false;
            }
      };
      cmp(r.o, pt.o, r.has_base);
      cmp(r.lse, pt.lse, r.has_base);
      cmp(r.o_out, pt.o_out, r.has_out);
      cmp(r.lse_out, pt.lse_out, r.has_out);
      // vs the float64 oracle under SPEC §6 (oracle at bf16 on the same rows gives E_X)
      bool pass = true;
      double err = 0;
      auto spec6 = [&](const char* nm, const auto& got, const auto& refm, const auto& atm, const std::vector<char>& rows,
                       int inner) {
        const auto g = pick(got, rows);
        if (g.rows() == 0) return;
        const Mat<double> rf = pick(refm, rows);
        const auto ax = pick(atm, rows);
        // rows of one sequence at P = 0: lse rows see at most min(w, T) keys, lse_out rows T
        const std::int64_t keys = orthros::check::lse_max_keys(nm, 0, T, T, ac.window);
        const auto rep =
            orthros::check::compare(nm, g, rf, Hq, inner, "bf16", orthros::check::max_abs_diff(ax, rf), keys);
        if (inner > 1) err = std::max(err, rep.max_abs);
        if (!rep.pass) {
          pass = false;
          std::printf("      %s %s: rel_fro=%.3g (tol %.3g) max_abs=%.3g (tol %.3g) nan=%lld\n", name.c_str(), nm,
                      rep.rel_fro, rep.rel_tol, rep.max_abs, rep.abs_tol, static_cast<long long>(rep.nan_count));
        }
      };
      spec6("o", r.o, ref.o, at.o, r.has_base, D);
      spec6("lse", r.lse, ref.lse, at.lse, r.has_base, 1);
      spec6("o_out", r.o_out, ref.o_out, at.o_out, r.has_out, D);
      spec6("lse_out", r.lse_out, ref.lse_out, at.lse_out, r.has_out, 1);
      int nb = 0, no = 0;
      for (int t = 0; t < T; ++t) {
        nb += r.has_base[t];
        no += r.has_out[t];
      }
      const bool ok = pass && (!det || bitwise);
      failures += ok ? 0 : 1;
      char pos[32];
      std::snprintf(pos, sizeof pos, "%d+%d", nb, no);
      std::printf("%-5s %-22s %-12s %12.3g %8s %12.3g %7s %9.3f\n", det ? "det" : "fast", name.c_str(), pos, dmax,
                  bitwise ? "yes" : "no", err, ok ? "pass" : "FAIL", r.ms);
    }
  }
  std::printf("\npositions = base rows + output rows produced; bitwise = equal to PT on the GPU in every bit\n"
              "(required in det mode only); max err f64 = max |o - oracle_f64| over o and o_out.\n");
  std::printf(failures ? "FAIL: %d regime rows failed\n" : "PASS: every regime within SPEC §6; det mode bitwise equal to PT\n",
              failures);
  return failures ? 1 : 0;
}

#endif  // ORTHROS_HAVE_CUDA
