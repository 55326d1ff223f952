// GPU benchmark of the Orthros attention BACKWARD (issue 10): CUDA-event timing, median of N
// timed runs after 3 warm-ups. PT (T_out = T) and SFT (T_out = T/4) training steps at T = 8K and
// 32K, bf16, qwen3-8b attention shape (H_q=32, H_kv=8, D=128), w=128; both modes (the backward
// has no non-deterministic path, so this measures the cost of `deterministic` = 1.00x), the
// forward for scale, and the two kernels alone (ORTHROS_CUDA_BWD_ONLY=dq / dkdv, a benchmarking
// knob of attention_backward.cu).
// Usage: bench_attention_backward_gpu [--runs N] [--json FILE] [--quick]
#include "orthros/cuda/attention_backward.hpp"

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

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

__global__ void fill_kernel(__nv_bfloat16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)(i * 2654435761u) ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] = __float2bfloat16(((h & 0xffff) / 32768.0f - 1.0f));
  }
}

struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Dev(size_t n) : bytes(n) {
    ck(cudaMalloc(&p, n), "cudaMalloc");
    fill_kernel<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), n / 2, (unsigned)n);
    ck(cudaGetLastError(), "fill_kernel");
  }
  ~Dev() { cudaFree(p); }
};

double median_ms(const std::function<void()>& fn, int runs, int warm = 3) {
  for (int i = 0; i < warm; ++i) fn();
  ck(cudaDeviceSynchronize(), "warm-up sync");
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    cudaEventRecord(a);
    fn();
    cudaEventRecord(b);
    ck(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

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
          setenv("ORTHROS_CUDA_BWD_ONLY", part, 1);
          const double ms = median_ms([&] { orthros::cuda::attention_backward(c, lay, bb, nullptr); }, runs);
          rows.push_back({tag + "_bwd_only_" + part, shape, ms, 0, 0});
        }
        unsetenv("ORTHROS_CUDA_BWD_ONLY");
      }
    }
  }
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
