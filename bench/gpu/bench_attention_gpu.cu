// GPU benchmark of the Orthros attention kernels: CUDA-event timing through the GPU harness
// (verify/gpu/harness: median of N timed samples after warm-up, the L2 flushed before every
// sample, canaries checked after every sample), plus a device-to-device copy bandwidth measured
// in the same process.
// Usage: bench_attention_gpu [--runs N] [--json FILE] [--quick] [--only SUBSTRING] [--b2b N]
// (--b2b N: N calls back to back per timed sample, Timing::calls_per_sample)
// Shapes: bf16, qwen3-8b attention (H_q=32, H_kv=8, D=128), w=128 (SPEC §7). FLOPs and bytes:
// CaseShape (case_shape.hpp), one formula for every row.
#include "attention_case.hpp"
#include "bench_report.hpp"
#include "timing.hpp"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

namespace gh = orthros::gpu_harness;
namespace oc = orthros::cuda;

using Row = gh::BenchRow;

int run(int argc, char** argv) {
  gh::Timing timing;
  std::string json;
  bool quick = false;
  std::string only;  // run only the rows whose name contains this (profiling one case)
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--runs") && i + 1 < argc) timing.runs = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    else if (!std::strcmp(argv[i], "--b2b") && i + 1 < argc) timing.calls_per_sample = std::atoi(argv[++i]);
  }
  cudaDeviceProp prop;
  gh::check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  gh::L2Flush flush;
  timing.flush = &flush;
  std::printf("%s\n", flush.describe().c_str());
  const int Hq = 32, Hkv = 8, D = 128;
  const long long W = 128;
  std::vector<Row> rows;

  // Device-to-device copy bandwidth: 4 GiB copied; bytes counted = read + write.
  {
    const size_t n = size_t(4) << 30;
    gh::DeviceBuffer a("copy source", n), b("copy destination", n);
    a.fill_uniform(oc::DType::bf16, 1);
    const double ms = gh::median_ms([&] { cudaMemcpyAsync(b.data(), a.data(), n, cudaMemcpyDeviceToDevice); }, timing,
                                    [&] { gh::check_canaries({&a, &b}); });
    rows.push_back({"d2d_copy", "4 GiB", ms, 2.0 * n, 0});
  }
  const double copy_bw = rows[0].bytes / (rows[0].ms * 1e-3);

  // One ragged-or-uniform call: B sequences with (T, P, T_out).
  using oc::KernelPath;
  auto bench_call = [&](const std::string& name, int B, int T, long long P, int T_out, bool det, long long window,
                        KernelPath path = KernelPath::automatic) {
    if (!only.empty() && name.find(only) == std::string::npos) return;
    gh::AttentionCase c(gh::CaseShape::uniform(Hq, Hkv, D, window, 2, B, T, P, T_out), oc::DType::bf16);
    c.fill_inputs(static_cast<std::uint64_t>(rows.size()) * 16);
    oc::AttentionConfig cfg = c.config();
    cfg.deterministic = det;
    cfg.kernel = path;
    const oc::AttentionBuffers buf = c.forward_buffers();
    c.forward(cfg);  // one checked call: outputs poisoned before, canaries checked after
    const double ms = gh::median_ms([&] { oc::attention_forward(cfg, c.layout(), buf, nullptr); }, timing,
                                    [&] { c.check_canaries(); });
    char shape[160];
    std::snprintf(shape, sizeof shape, "B=%d T=%d P=%lld T_out=%d w=%lld %s%s", B, T, P, T_out, window,
                  det ? "det" : "fast", path == KernelPath::generic ? " generic" : "");
    rows.push_back({name, shape, ms, c.forward_bytes(), c.forward_flops()});
  };
  for (int T : quick ? std::vector<int>{32768} : std::vector<int>{32768, 131072}) {
    for (bool det : {false, true}) bench_call("prefill_T" + std::to_string(T / 1024) + "K", 1, T, 0, 1, det, W);
    // A/B: the generic (mma.sync) kernels, the fallback on non-Hopper GPUs.
    bench_call("prefill_T" + std::to_string(T / 1024) + "K_generic", 1, T, 0, 1, false, W, KernelPath::generic);
  }
  const long long L = 131072;
  for (int B : {1, 16}) {
    const std::string tag = "decode_pair_128K_B" + std::to_string(B);
    for (bool det : {false, true}) bench_call(tag, B, 1, L - 1, 1, det, W);
    bench_call(tag + "_generic", B, 1, L - 1, 1, false, W, KernelPath::generic);
    // Proxy for one full-attention decode query: the same call with w = 1 (base query reads one key).
    bench_call("decode_fullonly_128K_B" + std::to_string(B), B, 1, L - 1, 1, false, 1);
  }
  for (int T : quick ? std::vector<int>{8192} : std::vector<int>{8192, 32768}) {
    for (bool det : {false, true}) bench_call("pt_T" + std::to_string(T / 1024) + "K", 1, T, 0, T, det, W);
    bench_call("pt_T" + std::to_string(T / 1024) + "K_generic", 1, T, 0, T, false, W, KernelPath::generic);
  }

  std::printf("\n%-26s %-44s %10s %10s %8s %9s\n", "benchmark", "shape", "median_ms", "GB/s", "%copy", "TFLOP/s");
  for (auto& r : rows) {
    const double bw = r.bytes / (r.ms * 1e-3);
    std::printf("%-26s %-44s %10.4f %10.1f %8.1f %9.1f\n", r.name.c_str(), r.shape.c_str(), r.ms, bw / 1e9,
                100.0 * bw / copy_bw, r.flops / (r.ms * 1e-3) / 1e12);
  }
  if (!json.empty())
    gh::write_bench_json(json,
                         {{"device", prop.name},
                          {"runs", timing.runs},
                          {"calls_per_sample", timing.calls_per_sample},
                          {"l2_flush_bytes", flush.bytes()},
                          {"copy_GBps", copy_bw / 1e9}},
                         rows, true);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return gh::run_reporting_errors("bench_attention_gpu", [&] { return run(argc, argv); });
}
