// GPU benchmark of the Orthros attention BACKWARD (issue 10): CUDA-event timing, median of N
// timed runs after 3 warm-ups. PT (T_out = T) and SFT (T_out = T/4) training steps at T = 8K and
// 32K, bf16, qwen3-8b attention shape (H_q=32, H_kv=8, D=128), w=128; both modes (the backward
// has no non-deterministic path, so this measures the cost of `deterministic` = 1.00x), the
// forward for scale, and the two kernels alone (detail::attention_backward_dq_only / _dkdv_only,
// cuda/src/backward/attention_backward_parts.hpp). Then the attention LAYER at qwen3-8b's
// d_model = 4096 (PT): attention_layer_forward and attention_layer_backward (the recomputed forward,
// cuBLAS projection gradients, the operator backward, the RoPE/scale-offset/QK-norm backward and its
// reductions).
// Usage: bench_attention_backward_gpu [--runs N] [--json FILE] [--quick]
#include "backward/attention_backward_parts.hpp"
#include "orthros/cuda/attention_backward.hpp"
#include "orthros/cuda/layer_backward.hpp"

#include <cublas_v2.h>

#include "bench_common.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

using orthros::bench::ck;
using orthros::bench::Dev;
using orthros::bench::median_ms;

struct Row {
  std::string name, shape;
  double ms, bytes, flops;
};

}  // namespace

int main(int argc, char** argv) {
  int runs = 25;
  std::string json;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--runs") && i + 1 < argc) runs = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
  }
  cudaDeviceProp prop;
  ck(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  const int Hq = 32, Hkv = 8, D = 128;
  const long long W = 128;
  std::vector<Row> rows;
  for (int T : quick ? std::vector<int>{8192} : std::vector<int>{8192, 32768}) {
    for (int T_out : {T, T / 4}) {
      orthros::cuda::BatchLayout lay = orthros::cuda::BatchLayout::single(T, 0, T_out);
      const size_t qb = size_t(T) * Hq * D * 2, qob = size_t(T_out) * Hq * D * 2, kb = size_t(T) * Hkv * D * 2;
      Dev q(qb), qo(qob), k(kb), v(kb), o(qb), oo(qob), lse(size_t(T) * Hq * 4), lseo(size_t(T_out) * Hq * 4);
      Dev dO(qb), dOo(qob), dq(qb), dqo(qob), dk(kb), dv(kb);
      orthros::cuda::AttentionConfig c;
      c.dtype = orthros::cuda::DType::bf16;
      c.num_q_heads = Hq;
      c.num_kv_heads = Hkv;
      c.head_dim = D;
      c.window = W;
      orthros::cuda::AttentionBuffers fb;
      fb.q = q.p;
      fb.q_out = qo.p;
      fb.k_cache = k.p;
      fb.v_cache = v.p;
      fb.capacity = T;
      fb.o = o.p;
      fb.o_out = oo.p;
      fb.lse = static_cast<float*>(lse.p);
      fb.lse_out = static_cast<float*>(lseo.p);
      // pairs (query, key): window band + causal triangle of the output rows
      const double pairs = double(T) * W - double(W) * (W - 1) / 2 +
                           (double(T) * (T + 1) / 2 - double(T - T_out) * (T - T_out + 1) / 2);
      const double fwd_flops = 4.0 * D * Hq * pairs, bwd_flops = 2.5 * fwd_flops;
      const std::string tag = (T_out == T ? "pt_T" : "sft_T") + std::to_string(T / 1024) + "K";
      char shape[160];
      std::snprintf(shape, sizeof shape, "T=%d T_out=%d w=%lld", T, T_out, W);
      const double fms = median_ms([&] { orthros::cuda::attention_forward(c, lay, fb, nullptr); }, runs);
      rows.push_back({tag + "_fwd", shape, fms, 0, fwd_flops});
      orthros::cuda::AttentionBackwardBuffers bb;
      bb.q = q.p;
      bb.q_out = qo.p;
      bb.k_cache = k.p;
      bb.v_cache = v.p;
      bb.capacity = T;
      bb.o = o.p;
      bb.o_out = oo.p;
      bb.lse = static_cast<const float*>(lse.p);
      bb.lse_out = static_cast<const float*>(lseo.p);
      bb.d_o = dO.p;
      bb.d_o_out = dOo.p;
      bb.dq = dq.p;
      bb.dq_out = dqo.p;
      bb.dk = dk.p;
      bb.dv = dv.p;
      const size_t wsb = orthros::cuda::attention_backward_workspace_bytes(c, lay);
      Dev ws(wsb);
      bb.workspace = ws.p;
      bb.workspace_bytes = wsb;
      for (bool det : {false, true}) {
        c.deterministic = det;
        const double ms = median_ms([&] { orthros::cuda::attention_backward(c, lay, bb, nullptr); }, runs);
        rows.push_back({tag + (det ? "_bwd_det" : "_bwd"), shape, ms, 0, bwd_flops});
      }
      c.deterministic = false;
      if (T_out == T) {
        for (const char* part : {"dq", "dkdv"}) {
          const auto only = part[1] == 'q' ? orthros::cuda::detail::attention_backward_dq_only
                                           : orthros::cuda::detail::attention_backward_dkdv_only;
          const double ms = median_ms([&] { only(c, lay, bb, nullptr); }, runs);
          rows.push_back({tag + "_bwd_only_" + part, shape, ms, 0, 0});
        }
      }
    }
  }
  // The layer (PT, d_model 4096): forward, and backward with its recomputed forward.
  cublasHandle_t blas = nullptr;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasCreate failed\n");
    return 1;
  }
  for (int T : quick ? std::vector<int>{8192} : std::vector<int>{8192, 32768}) {
    const long long dm = 4096, d = (long long)Hq * D, dkv = (long long)Hkv * D;
    orthros::cuda::LayerConfig lc;
    lc.dtype = orthros::cuda::DType::bf16;
    lc.d_model = dm;
    lc.num_q_heads = Hq;
    lc.num_kv_heads = Hkv;
    lc.head_dim = D;
    lc.window = W;
    lc.rope_theta = 1e6;
    const orthros::cuda::BatchLayout lay = orthros::cuda::BatchLayout::single(T, 0, T);
    const size_t es = 2;
    Dev wq(dm * d * es), wk(dm * dkv * es), wv(dm * dkv * es), wo(d * dm * es), al(d * es), be(d * es), alo(d * es),
        beo(d * es), qn(D * es), kn(D * es);
    const orthros::cuda::LayerWeightsDevice w{wq.p, wk.p, wv.p, wo.p, al.p, be.p, alo.p, beo.p, qn.p, kn.p};
    Dev x(T * dm * es), xo(T * dm * es), y(T * dm * es), yo(T * dm * es), kc(T * dkv * es), vc(T * dkv * es);
    Dev fws(orthros::cuda::attention_layer_workspace_bytes(lc, lay));
    orthros::cuda::LayerBuffers fb{x.p, xo.p, kc.p, vc.p, T, y.p, yo.p, fws.p, fws.bytes};
    char shape[160];
    std::snprintf(shape, sizeof shape, "T=%d T_out=%d d_model=%lld", T, T, dm);
    const std::string tag = "layer_pt_T" + std::to_string(T / 1024) + "K";
    const double gemm_fwd = 2.0 * T * dm * (2.0 * d + 2.0 * dkv) + 2.0 * 2.0 * T * d * dm;  // q, q', k, v; y, y'
    rows.push_back({tag + "_fwd", shape,
                    median_ms([&] { orthros::cuda::attention_layer_forward(lc, lay, w, fb, blas, nullptr); }, runs),
                    0, gemm_fwd});
    Dev dy(T * dm * es), dyo(T * dm * es), dx(T * dm * es), dxo(T * dm * es), gwq(dm * d * es), gwk(dm * dkv * es),
        gwv(dm * dkv * es), gwo(d * dm * es), gal(d * es), gbe(d * es), galo(d * es), gbeo(d * es), gqn(D * es),
        gkn(D * es), bws(orthros::cuda::attention_layer_backward_workspace_bytes(lc, lay));
    orthros::cuda::LayerBackwardBuffers bb;
    bb.x = x.p;
    bb.x_out = xo.p;
    bb.dy = dy.p;
    bb.dy_out = dyo.p;
    bb.grads = {dx.p, dxo.p, gwq.p, gwk.p, gwv.p, gwo.p, gal.p, gbe.p, galo.p, gbeo.p, gqn.p, gkn.p};
    bb.workspace = bws.p;
    bb.workspace_bytes = bws.bytes;
    rows.push_back({tag + "_bwd", shape,
                    median_ms([&] { orthros::cuda::attention_layer_backward(lc, lay, w, bb, blas, nullptr); }, runs),
                    0, 3.0 * gemm_fwd});  // GEMM FLOPs only: recomputed forward + 2x for the gradients
  }
  cublasDestroy(blas);

  std::printf("\n%-26s %-28s %10s %9s\n", "benchmark", "shape", "median_ms", "TFLOP/s");
  for (auto& r : rows)
    std::printf("%-26s %-28s %10.4f %9.1f\n", r.name.c_str(), r.shape.c_str(), r.ms, r.flops / (r.ms * 1e-3) / 1e12);
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (f) {
      std::fprintf(f, "{\"device\": \"%s\", \"runs\": %d, \"rows\": [\n", prop.name, runs);
      for (size_t i = 0; i < rows.size(); ++i)
        std::fprintf(f, "  {\"name\": \"%s\", \"shape\": \"%s\", \"median_ms\": %.5f, \"flops\": %.0f}%s\n",
                     rows[i].name.c_str(), rows[i].shape.c_str(), rows[i].ms, rows[i].flops,
                     i + 1 < rows.size() ? "," : "");
      std::fprintf(f, "]}\n");
      std::fclose(f);
    }
  }
  return 0;
}
