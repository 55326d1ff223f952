// GPU benchmark of the Orthros attention BACKWARD through the GPU harness (verify/gpu/harness):
// CUDA-event timing, median of N timed samples after 3 warm-ups, the L2 flushed before every
// sample, canaries checked after every sample. PT (T_out = T) and SFT (T_out = T/4) training
// steps at T = 8K and 32K, bf16, qwen3-8b attention shape (H_q=32, H_kv=8, D=128), w=128; both
// modes (on an H100/H200 the fast mode of long sequences folds dq into the dk/dv kernel, the
// deterministic mode runs the query-outer dq kernel beside it), the generic (mma.sync) path next
// to the default one, the forward for scale, and the two kernels alone (dq, dkdv: the internal
// entries of cuda/src/backward/attention_backward_parts.hpp). Then the
// attention LAYER at qwen3-8b's d_model = 4096 (PT): attention_layer_forward and
// attention_layer_backward (the recomputed forward, cuBLAS projection gradients, the operator
// backward, the RoPE/scale-offset/QK-norm backward and its reductions).
// FLOPs of the operator rows: CaseShape (case_shape.hpp); of the layer rows: the projection GEMMs.
// Usage: bench_attention_backward_gpu [--runs N] [--json FILE] [--quick] [--seq-lens T1,T2,...]
//        [--backward-only]
// --seq-lens replaces the lengths; --backward-only times only the fast-mode backward (no forward,
// det, generic, halves or layer rows): with ORTHROS_BWD_FUSED_DQ=0 / 1 it measures where the fused
// dq starts to pay (attention_backward.cu, kFusedDqMinTokens).
#include "backward/attention_backward_parts.hpp"
#include "orthros/cuda/attention_backward.hpp"
#include "orthros/cuda/layer_backward.hpp"

#include <cublas_v2.h>

#include "attention_case.hpp"
#include "bench_report.hpp"
#include "timing.hpp"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

namespace gh = orthros::gpu_harness;
using gh::DeviceBuffer;

using Row = gh::BenchRow;

int run(int argc, char** argv) {
  int runs = 25;
  std::string json;
  bool quick = false, bwd_only = false;
  std::vector<int> lens;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--runs") && i + 1 < argc) runs = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--backward-only")) bwd_only = true;
    else if (!std::strcmp(argv[i], "--seq-lens") && i + 1 < argc) {
      for (const char* p = argv[++i]; *p;) {
        char* end = nullptr;
        const long t = std::strtol(p, &end, 10);
        if (end == p || t <= 0 || t > (1L << 22)) {
          std::fprintf(stderr, "--seq-lens: expected positive lengths separated by commas (got '%s')\n", argv[i]);
          return 2;
        }
        lens.push_back(static_cast<int>(t));
        p = *end == ',' ? end + 1 : end;
      }
    } else {
      std::fprintf(stderr, "unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  if (lens.empty()) lens = quick ? std::vector<int>{8192} : std::vector<int>{8192, 32768};
  cudaDeviceProp prop;
  gh::check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  gh::L2Flush flush;
  std::printf("%s\n", flush.describe().c_str());
  std::function<void()> check_after;  // the canary check of the buffers being timed
  auto median_ms = [&](const std::function<void()>& call, int n) {
    gh::Timing t;
    t.runs = n;
    t.flush = &flush;
    return gh::median_ms(call, t, check_after);
  };
  const int Hq = 32, Hkv = 8, D = 128;
  const long long W = 128;
  std::vector<Row> rows;
  for (int T : lens) {
    for (int T_out : {T, T / 4}) {
      gh::AttentionCase ac(gh::CaseShape::uniform(Hq, Hkv, D, W, 2, 1, T, 0, T_out), orthros::cuda::DType::bf16,
                           true);
      ac.fill_inputs(static_cast<std::uint64_t>(T) + T_out);
      check_after = [&] { ac.check_canaries(); };
      const orthros::cuda::BatchLayout& lay = ac.layout();
      orthros::cuda::AttentionConfig c = ac.config();
      const std::string tag = (T_out == T ? "pt_T" : "sft_T") + std::to_string(T / 1024) + "K";
      char shape[160];
      std::snprintf(shape, sizeof shape, "T=%d T_out=%d w=%lld", T, T_out, W);
      ac.forward(c);  // one checked call: outputs poisoned before, canaries checked after
      const orthros::cuda::AttentionBuffers fb = ac.forward_buffers();
      if (!bwd_only) {
        const double fms = median_ms([&] { orthros::cuda::attention_forward(c, lay, fb, nullptr); }, runs);
        rows.push_back({tag + "_fwd", shape, fms, 0, ac.forward_flops()});
      }
      ac.set_backward_workspace(orthros::cuda::attention_backward_workspace_bytes(c, lay));
      ac.forward(c);  // o and lse of these inputs for the backward
      ac.backward(c);
      const orthros::cuda::AttentionBackwardBuffers bb = ac.backward_buffers();
      const double bwd_flops = ac.backward_flops();
      for (bool det : {false, true}) {
        if (det && bwd_only) break;
        c.deterministic = det;
        const double ms = median_ms([&] { orthros::cuda::attention_backward(c, lay, bb, nullptr); }, runs);
        rows.push_back({tag + (det ? "_bwd_det" : "_bwd"), shape, ms, 0, bwd_flops});
      }
      c.deterministic = false;
      if (bwd_only) {
        check_after = nullptr;
        continue;
      }
      c.kernel = orthros::cuda::KernelPath::generic;
      rows.push_back({tag + "_bwd_generic", shape,
                      median_ms([&] { orthros::cuda::attention_backward(c, lay, bb, nullptr); }, runs), 0, bwd_flops});
      c.kernel = orthros::cuda::KernelPath::automatic;
      if (T_out == T) {
        for (const char* part : {"dq", "dkdv"}) {
          const auto only = part[1] == 'q' ? orthros::cuda::detail::attention_backward_dq_only
                                           : orthros::cuda::detail::attention_backward_dkdv_only;
          const double ms = median_ms([&] { only(c, lay, bb, nullptr); }, runs);
          rows.push_back({tag + "_bwd_only_" + part, shape, ms, 0, 0});
        }
      }
      check_after = nullptr;
    }
  }
  // The layer (PT, d_model 4096): forward, and backward with its recomputed forward.
  cublasHandle_t blas = nullptr;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasCreate failed\n");
    return 1;
  }
  for (int T : bwd_only ? std::vector<int>{} : lens) {
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
    std::vector<DeviceBuffer> bufs;  // every buffer of this T: inputs filled, outputs NaN-poisoned
    bufs.reserve(40);
    auto mk = [&](const char* name, size_t bytes, bool input) {
      bufs.emplace_back(name, bytes);
      if (input) bufs.back().fill_uniform(orthros::cuda::DType::bf16, bufs.size());
      return bufs.back().data();
    };
    const orthros::cuda::LayerWeightsDevice w{
        mk("w_q", dm * d * es, true),  mk("w_k", dm * dkv * es, true), mk("w_v", dm * dkv * es, true),
        mk("w_o", d * dm * es, true),  mk("alpha", d * es, true),      mk("beta", d * es, true),
        mk("alpha_out", d * es, true), mk("beta_out", d * es, true),   mk("q_norm", D * es, true),
        mk("k_norm", D * es, true)};
    void* x = mk("x", T * dm * es, true);
    void* xo = mk("x_out", T * dm * es, true);
    void* y = mk("y", T * dm * es, false);
    void* yo = mk("y_out", T * dm * es, false);
    void* kc = mk("k_cache", T * dkv * es, false);
    void* vc = mk("v_cache", T * dkv * es, false);
    const size_t fwsb = orthros::cuda::attention_layer_workspace_bytes(lc, lay);
    orthros::cuda::LayerBuffers fb{x, xo, kc, vc, T, y, yo, mk("layer workspace", fwsb, false), fwsb};
    check_after = [&] {
      for (const DeviceBuffer& b : bufs) b.check_canaries();
    };
    char shape[160];
    std::snprintf(shape, sizeof shape, "T=%d T_out=%d d_model=%lld", T, T, dm);
    const std::string tag = "layer_pt_T" + std::to_string(T / 1024) + "K";
    const double gemm_fwd = 2.0 * T * dm * (2.0 * d + 2.0 * dkv) + 2.0 * 2.0 * T * d * dm;  // q, q', k, v; y, y'
    rows.push_back({tag + "_fwd", shape,
                    median_ms([&] { orthros::cuda::attention_layer_forward(lc, lay, w, fb, blas, nullptr); }, runs),
                    0, gemm_fwd});
    orthros::cuda::LayerBackwardBuffers bb;
    bb.x = x;
    bb.x_out = xo;
    bb.dy = mk("dy", T * dm * es, true);
    bb.dy_out = mk("dy_out", T * dm * es, true);
    bb.grads = {mk("dx", T * dm * es, false),      mk("dx_out", T * dm * es, false), mk("dw_q", dm * d * es, false),
                mk("dw_k", dm * dkv * es, false),  mk("dw_v", dm * dkv * es, false), mk("dw_o", d * dm * es, false),
                mk("dalpha", d * es, false),       mk("dbeta", d * es, false),       mk("dalpha_out", d * es, false),
                mk("dbeta_out", d * es, false),    mk("dq_norm", D * es, false),     mk("dk_norm", D * es, false)};
    bb.workspace_bytes = orthros::cuda::attention_layer_backward_workspace_bytes(lc, lay);
    bb.workspace = mk("layer backward workspace", bb.workspace_bytes, false);
    rows.push_back({tag + "_bwd", shape,
                    median_ms([&] { orthros::cuda::attention_layer_backward(lc, lay, w, bb, blas, nullptr); }, runs),
                    0, 3.0 * gemm_fwd});  // GEMM FLOPs only: recomputed forward + 2x for the gradients
    check_after = nullptr;
  }
  cublasDestroy(blas);

  std::printf("\n%-26s %-28s %10s %9s\n", "benchmark", "shape", "median_ms", "TFLOP/s");
  for (auto& r : rows)
    std::printf("%-26s %-28s %10.4f %9.1f\n", r.name.c_str(), r.shape.c_str(), r.ms, r.flops / (r.ms * 1e-3) / 1e12);
  if (!json.empty())
    gh::write_bench_json(json, {{"device", prop.name}, {"runs", runs}, {"l2_flush_bytes", flush.bytes()}}, rows, false);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return gh::run_reporting_errors("bench_attention_backward_gpu", [&] { return run(argc, argv); });
}
