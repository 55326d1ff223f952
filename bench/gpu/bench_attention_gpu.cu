// GPU benchmark of the Orthros attention kernels (issue 4): CUDA-event timing, median of N timed
// runs after warm-up, plus a device-to-device copy bandwidth measured in the same process.
// Usage: bench_attention_gpu [--runs N] [--json FILE] [--quick] [--only SUBSTRING] [--b2b N]
// (--b2b N: N calls back to back per timed sample, bench_common.cuh calls_per_sample)
// Shapes: bf16, qwen3-8b attention (H_q=32, H_kv=8, D=128), w=128 (SPEC §7).
#include "orthros/cuda/attention.hpp"

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
  std::string only;  // run only the rows whose name contains this (profiling one case)
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--runs") && i + 1 < argc) runs = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    else if (!std::strcmp(argv[i], "--b2b") && i + 1 < argc) orthros::bench::calls_per_sample() = std::atoi(argv[++i]);
  }
  cudaDeviceProp prop;
  ck(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  const int Hq = 32, Hkv = 8, D = 128;
  const long long W = 128;
  std::vector<Row> rows;

  // Device-to-device copy bandwidth: 4 GiB copied; bytes counted = read + write.
  {
    const size_t n = size_t(4) << 30;
    Dev a(n), b(n);
    const double ms = median_ms([&] { cudaMemcpyAsync(b.p, a.p, n, cudaMemcpyDeviceToDevice); }, runs);
    rows.push_back({"d2d_copy", "4 GiB", ms, 2.0 * n, 0});
  }
  const double copy_bw = rows[0].bytes / (rows[0].ms * 1e-3);

  auto cfg_of = [&](bool det) {
    orthros::cuda::AttentionConfig c;
    c.dtype = orthros::cuda::DType::bf16;
    c.num_q_heads = Hq;
    c.num_kv_heads = Hkv;
    c.head_dim = D;
    c.window = W;
    c.deterministic = det;
    return c;
  };
  // One ragged-or-uniform call: B sequences with (T, P, T_out).
  using orthros::cuda::KernelPath;
  auto bench_call = [&](const std::string& name, int B, int T, long long P, int T_out, bool det, long long window,
                        double bytes, double flops, KernelPath path = KernelPath::automatic) {
    if (!only.empty() && name.find(only) == std::string::npos) return;
    orthros::cuda::BatchLayout lay;
    for (int b = 0; b < B; ++b) {
      lay.q_lens.push_back(T);
      lay.out_lens.push_back(T_out);
      lay.cache_lens.push_back(P + T);
    }
    const long long cap = P + T;
    Dev q(size_t(B) * T * Hq * D * 2), qo(std::max<size_t>(16, size_t(B) * T_out * Hq * D * 2));
    Dev k(size_t(B) * cap * Hkv * D * 2), v(size_t(B) * cap * Hkv * D * 2);
    Dev o(size_t(B) * T * Hq * D * 2), oo(std::max<size_t>(16, size_t(B) * T_out * Hq * D * 2));
    Dev lse(size_t(B) * T * Hq * 4), lseo(std::max<size_t>(16, size_t(B) * T_out * Hq * 4));
    auto c = cfg_of(det);
    c.window = window;
    c.kernel = path;
    orthros::cuda::AttentionBuffers buf;
    buf.q = q.p;
    buf.q_out = qo.p;
    buf.k_cache = k.p;
    buf.v_cache = v.p;
    buf.capacity = cap;
    buf.o = o.p;
    buf.o_out = oo.p;
    buf.lse = static_cast<float*>(lse.p);
    buf.lse_out = static_cast<float*>(lseo.p);
    const double ms = median_ms([&] { orthros::cuda::attention_forward(c, lay, buf, nullptr); }, runs);
    char shape[160];
    std::snprintf(shape, sizeof shape, "B=%d T=%d P=%lld T_out=%d w=%lld %s%s", B, T, P, T_out, window,
                  det ? "det" : "fast", path == KernelPath::generic ? " generic" : "");
    rows.push_back({name, shape, ms, bytes, flops});
  };
  const double e = 2.0;  // bytes per bf16
  for (int T : quick ? std::vector<int>{32768} : std::vector<int>{32768, 131072}) {
    // Prefill: Q, K, V read once, O written once (the issue's byte count); out query reads K, V again.
    const double bytes = e * (2.0 * T * Hq * D + 2.0 * T * Hkv * D);
    const double flops = 4.0 * D * Hq * (double(T) * W + T);
    for (bool det : {false, true})
      bench_call("prefill_T" + std::to_string(T / 1024) + "K", 1, T, 0, 1, det, W, bytes, flops);
    // A/B: the generic (mma.sync) kernels, the fallback on non-Hopper GPUs.
    bench_call("prefill_T" + std::to_string(T / 1024) + "K_generic", 1, T, 0, 1, false, W, bytes, flops,
               KernelPath::generic);
  }
  const long long L = 131072;
  for (int B : {1, 16}) {
    const double bytes = e * 2.0 * B * double(L) * Hkv * D;  // K/V bytes of the cache
    for (bool det : {false, true})
      bench_call("decode_pair_128K_B" + std::to_string(B), B, 1, L - 1, 1, det, W, bytes, 4.0 * D * Hq * B * (L + W));
    bench_call("decode_pair_128K_B" + std::to_string(B) + "_generic", B, 1, L - 1, 1, false, W, bytes,
               4.0 * D * Hq * B * (L + W), KernelPath::generic);
    // Proxy for one full-attention decode query: the same call with w = 1 (base query reads one key).
    bench_call("decode_fullonly_128K_B" + std::to_string(B), B, 1, L - 1, 1, false, 1, bytes, 4.0 * D * Hq * B * L);
  }
  for (int T : quick ? std::vector<int>{8192} : std::vector<int>{8192, 32768}) {
    const double flops = 4.0 * D * Hq * (double(T) * (T + 1) / 2 + double(T) * W);
    const double bytes = e * (3.0 * T * Hq * D + 2.0 * T * Hkv * D);
    for (bool det : {false, true})
      bench_call("pt_T" + std::to_string(T / 1024) + "K", 1, T, 0, T, det, W, bytes, flops);
    bench_call("pt_T" + std::to_string(T / 1024) + "K_generic", 1, T, 0, T, false, W, bytes, flops,
               KernelPath::generic);
  }

  std::printf("\n%-26s %-44s %10s %10s %8s %9s\n", "benchmark", "shape", "median_ms", "GB/s", "%copy", "TFLOP/s");
  for (auto& r : rows) {
    const double bw = r.bytes / (r.ms * 1e-3);
    std::printf("%-26s %-44s %10.4f %10.1f %8.1f %9.1f\n", r.name.c_str(), r.shape.c_str(), r.ms, bw / 1e9,
                100.0 * bw / copy_bw, r.flops / (r.ms * 1e-3) / 1e12);
  }
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (f) {
      std::fprintf(f, "{\"device\": \"%s\", \"runs\": %d, \"calls_per_sample\": %d, \"copy_GBps\": %.1f, \"rows\": [\n",
                   prop.name, runs, orthros::bench::calls_per_sample(), copy_bw / 1e9);
      for (size_t i = 0; i < rows.size(); ++i)
        std::fprintf(f, "  {\"name\": \"%s\", \"shape\": \"%s\", \"median_ms\": %.5f, \"bytes\": %.0f, \"flops\": %.0f}%s\n",
                     rows[i].name.c_str(), rows[i].shape.c_str(), rows[i].ms, rows[i].bytes, rows[i].flops,
                     i + 1 < rows.size() ? "," : "");
      std::fprintf(f, "]}\n");
      std::fclose(f);
    }
  }
  return 0;
}
