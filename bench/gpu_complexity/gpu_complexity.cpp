/// \file gpu_complexity.cpp
/// \brief Complexity benchmarks of the CUDA kernels (paper §3.3 and Figure 4; SPEC §2/§4).
///
/// Times orthros::cuda::attention_forward with CUDA events (UseManualTime) on the qwen3-8b
/// attention shape (H_q = 32, H_kv = 8, D = 128, w = 128, bf16; SPEC §7), sweeping T:
///   gpu/prefill            T_out = 1, P = 0                       8K .. 1M  (O(T*w))
///   gpu/prefill_det        the same in deterministic mode          8K .. 1M
///   gpu/swa_stream         T_out = 0 (base stream alone)           8K .. 1M
///   gpu/full_prefill       w >= T, T_out = 1: full causal attention of the prefill's shape
///                          through the kernel's own w >= T mode     8K .. 128K (O(T^2))
///   gpu/full_causal_out    T_out = T, w = 1: full causal attention through the kernel's output
///                          stream over every position (base stream: one key per row)  8K .. 128K
///   gpu/full_causal_out_long  the same at 256K .. 1M, one timed call each (seconds per call)
///   gpu/pt                 T_out = T, w = 128 (pre-training forward)                    8K .. 128K
///   gpu/decode_pair_b{1,16}  one (base, output) pair per sequence over a cache of N positions
///   gpu/full_decode_b{1,16}  one full-attention query per sequence (output stream, w = 1)
///   gpu/copy_d2d           device-to-device copy: the measured HBM bandwidth of the same run
///   gpu/gemm_bf16          cuBLAS 8192^3 bf16 GEMM (fp32 accumulate): measured tensor-core rate
/// Every point checks free device memory first and is skipped (with the reason) if it would not fit.
///
/// Device tensors, FLOP and byte counts come from the GPU harness (verify/gpu/harness): an
/// AttentionCase per point, whose CaseShape gives FLOP/s = 4*D FLOPs per (query, key) pair per
/// query head (exact pair counts of the operator's ranges) and bytes_per_second = compulsory HBM
/// traffic (Q, q_out and the K/V rows the call needs read once, O and o_out written once; LSEs
/// not counted). The L2 cache is flushed (untimed, L2Flush) before every timed launch, and the
/// canaries of every buffer are checked after the timing loop.
///
/// Run (device): bench/scripts/gpu_complexity.sh <this binary> <out dir>
#include "orthros/cuda/attention.hpp"

#include "attention_case.hpp"
#include "timing.hpp"

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>
#ifdef ORTHROS_BENCH_HAVE_CUBLAS
#include <cublas_v2.h>  // types only: the library is dlopen'ed (Cublas below)
#include <dlfcn.h>
#endif

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

namespace oc = orthros::cuda;
using I64 = std::int64_t;

constexpr int kHq = 32, kHkv = 8, kD = 128;
constexpr I64 kWindow = 128;
constexpr I64 kFull = std::numeric_limits<I64>::max() / 4;
constexpr oc::DType kDtype = oc::DType::bf16;
constexpr int kElem = 2;
constexpr std::uint64_t kSeed = 20261130;

namespace gh = orthros::gpu_harness;
using gh::check_cuda;
using gh::DeviceBuffer;

/// Shared per-process resources: the stream, events and the L2-flush buffer.
struct Gpu {
  cudaStream_t stream{};
  cudaEvent_t start{}, stop{};
  gh::L2Flush flush;
  Gpu() {
    check_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
    check_cuda(cudaEventCreate(&start), "cudaEventCreate");
    check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  }
  static Gpu& get() {
    static Gpu g;
    return g;
  }
};

/// Times `launch` with CUDA events; one untimed warm-up first; L2 flushed before every launch.
template <typename F>
void time_loop(benchmark::State& st, F&& launch, bool warmup = true) {
  Gpu& g = Gpu::get();
  if (warmup) {
    launch();
    check_cuda(cudaStreamSynchronize(g.stream), "warm-up");
  }
  for (auto _ : st) {
    g.flush.flush(g.stream);
    check_cuda(cudaEventRecord(g.start, g.stream), "cudaEventRecord");
    launch();
    check_cuda(cudaEventRecord(g.stop, g.stream), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(g.stop), "cudaEventSynchronize");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, g.start, g.stop), "cudaEventElapsedTime");
    st.SetIterationTime(static_cast<double>(ms) * 1e-3);
  }
}

/// Skips the point when `need` bytes exceed 90% of free device memory. Returns false if skipped.
bool fits(benchmark::State& st, double need) {
  std::size_t free_b = 0, total_b = 0;
  check_cuda(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  if (need > 0.9 * static_cast<double>(free_b)) {
    st.SkipWithError(("needs " + std::to_string(need / (1u << 30)) + " GiB, " +
                      std::to_string(static_cast<double>(free_b) / (1u << 30)) + " GiB free")
                         .c_str());
    return false;
  }
  return true;
}

/// One operator case: B sequences, each with T base tokens after P cached ones, the last T_out
/// with output queries, window w.
void run_case(benchmark::State& st, int B, I64 T, I64 P, I64 T_out, I64 w, bool deterministic, I64 complexity_n,
              bool warmup = true) {
  try {
    const gh::CaseShape shape = gh::CaseShape::uniform(kHq, kHkv, kD, w, kElem, B, T, P, T_out);
    const double q_elems = double(B) * T * kHq * kD, qo_elems = double(B) * T_out * kHq * kD;
    const double kv_elems = double(B) * (P + T) * kHkv * kD;
    const double need = kElem * (2 * q_elems + 2 * qo_elems + 2 * kv_elems) + 4.0 * B * (T + T_out) * kHq;
    if (!fits(st, need)) return;
    Gpu& g = Gpu::get();
    gh::AttentionCase c(shape, kDtype);
    c.fill_inputs(kSeed, g.stream);
    oc::AttentionConfig cfg = c.config();
    cfg.deterministic = deterministic;
    c.set_workspace(oc::attention_workspace_bytes(cfg, c.layout()));
    const oc::AttentionBuffers buf = c.forward_buffers();
    check_cuda(cudaStreamSynchronize(g.stream), "fill");

    time_loop(st, [&] { oc::attention_forward(cfg, c.layout(), buf, g.stream); }, warmup);
    c.check_canaries();

    st.SetComplexityN(complexity_n);
    st.counters["FLOP/s"] = benchmark::Counter(c.forward_flops(), benchmark::Counter::kIsIterationInvariantRate);
    st.counters["pairs"] = shape.pairs();
    st.counters["T"] = double(T);
    st.counters["P"] = double(P);
    st.counters["T_out"] = double(T_out);
    st.counters["B"] = double(B);
    st.counters["ws_MiB"] = double(c.workspace.bytes()) / (1 << 20);
    st.SetBytesProcessed(static_cast<std::int64_t>(c.forward_bytes()) * st.iterations());
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
  }
}

void BM_prefill(benchmark::State& st) { run_case(st, 1, st.range(0), 0, 1, kWindow, false, st.range(0)); }
void BM_prefill_det(benchmark::State& st) { run_case(st, 1, st.range(0), 0, 1, kWindow, true, st.range(0)); }
void BM_swa_stream(benchmark::State& st) { run_case(st, 1, st.range(0), 0, 0, kWindow, false, st.range(0)); }
void BM_full_prefill(benchmark::State& st) { run_case(st, 1, st.range(0), 0, 1, kFull, false, st.range(0)); }
void BM_full_causal_out(benchmark::State& st) {
  run_case(st, 1, st.range(0), 0, st.range(0), 1, false, st.range(0));
}
/// Full causal attention at 256K..1M (seconds per call): one timed call, no warm-up (the kernel
/// is already loaded by gpu/full_causal_out), no repetitions.
void BM_full_causal_out_long(benchmark::State& st) {
  run_case(st, 1, st.range(0), 0, st.range(0), 1, false, st.range(0), false);
}
void BM_pt(benchmark::State& st) { run_case(st, 1, st.range(0), 0, st.range(0), kWindow, false, st.range(0)); }
template <int B>
void BM_decode_pair(benchmark::State& st) {
  run_case(st, B, 1, st.range(0) - 1, 1, kWindow, false, st.range(0));
}
template <int B>
void BM_decode_pair_det(benchmark::State& st) {
  run_case(st, B, 1, st.range(0) - 1, 1, kWindow, true, st.range(0));
}
template <int B>
void BM_full_decode(benchmark::State& st) {
  run_case(st, B, 1, st.range(0) - 1, 1, 1, false, st.range(0));
}

/// Device-to-device copy of `MiB` MiB: bytes = read + write.
void BM_copy_d2d(benchmark::State& st) {
  try {
    const std::size_t n = std::size_t(st.range(0)) << 20;
    if (!fits(st, 2.0 * n)) return;
    Gpu& g = Gpu::get();
    DeviceBuffer a("copy source", n), b("copy destination", n);
    check_cuda(cudaMemsetAsync(a.data(), 1, n, g.stream), "cudaMemsetAsync");
    time_loop(st, [&] {
      check_cuda(cudaMemcpyAsync(b.data(), a.data(), n, cudaMemcpyDeviceToDevice, g.stream), "cudaMemcpyAsync");
    });
    gh::check_canaries({&a, &b});
    st.SetBytesProcessed(static_cast<std::int64_t>(2 * n) * st.iterations());
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
  }
}

#ifdef ORTHROS_BENCH_HAVE_CUBLAS
/// cuBLAS, loaded at run time (dlopen) so that a machine without libcublas still runs every
/// other benchmark; only gpu/gemm_bf16 is then skipped with the reason.
struct Cublas {
  using Create = cublasStatus_t (*)(cublasHandle_t*);
  using Destroy = cublasStatus_t (*)(cublasHandle_t);
  using SetStream = cublasStatus_t (*)(cublasHandle_t, cudaStream_t);
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                    const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                    cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  Create create = nullptr;
  Destroy destroy = nullptr;
  SetStream set_stream = nullptr;
  GemmEx gemm_ex = nullptr;
  static const Cublas& get() {
    static const Cublas c = [] {
      Cublas r;
      void* h = nullptr;
      for (const char* name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"})
        if ((h = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
      if (!h) return r;
      r.create = reinterpret_cast<Create>(dlsym(h, "cublasCreate_v2"));
      r.destroy = reinterpret_cast<Destroy>(dlsym(h, "cublasDestroy_v2"));
      r.set_stream = reinterpret_cast<SetStream>(dlsym(h, "cublasSetStream_v2"));
      r.gemm_ex = reinterpret_cast<GemmEx>(dlsym(h, "cublasGemmEx"));
      return r;
    }();
    return c;
  }
  bool ok() const { return create && destroy && set_stream && gemm_ex; }
};

/// cuBLAS bf16 GEMM M = N = K = n (fp32 accumulate): the tensor-core rate this device reaches.
void BM_gemm_bf16(benchmark::State& st) {
  try {
    const Cublas& cb = Cublas::get();
    if (!cb.ok()) {
      st.SkipWithError("libcublas not found (dlopen libcublas.so.13/.12)");
      return;
    }
    const int n = static_cast<int>(st.range(0));
    Gpu& g = Gpu::get();
    const std::size_t e = std::size_t(n) * n;
    DeviceBuffer a("gemm a", 2 * e), b("gemm b", 2 * e), c("gemm c", 2 * e);
    a.fill_uniform(oc::DType::bf16, kSeed + 7, g.stream);
    b.fill_uniform(oc::DType::bf16, kSeed + 8, g.stream);
    cublasHandle_t h{};
    if (cb.create(&h) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasCreate failed");
    cb.set_stream(h, g.stream);
    const float one = 1.f, zero = 0.f;
    auto gemm = [&] {
      if (cb.gemm_ex(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a.data(), CUDA_R_16BF, n, b.data(), CUDA_R_16BF, n,
                     &zero, c.data(), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
        throw std::runtime_error("cublasGemmEx failed");
    };
    try {
      time_loop(st, gemm);
    } catch (...) {
      cb.destroy(h);
      throw;
    }
    cb.destroy(h);
    gh::check_canaries({&a, &b, &c});
    st.counters["FLOP/s"] =
        benchmark::Counter(2.0 * double(n) * n * n, benchmark::Counter::kIsIterationInvariantRate);
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
  }
}
#endif

void register_all() {
  auto sweep = [](const char* name, void (*fn)(benchmark::State&), I64 lo, I64 hi, const char* arg) {
    benchmark::RegisterBenchmark(name, fn)
        ->ArgName(arg)
        ->RangeMultiplier(2)
        ->Range(lo, hi)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->Complexity();
  };
  benchmark::RegisterBenchmark("gpu/copy_d2d", BM_copy_d2d)->ArgName("MiB")->Arg(4096)->UseManualTime()->Unit(
      benchmark::kMillisecond);
#ifdef ORTHROS_BENCH_HAVE_CUBLAS
  benchmark::RegisterBenchmark("gpu/gemm_bf16", BM_gemm_bf16)->ArgName("n")->Arg(8192)->UseManualTime()->Unit(
      benchmark::kMillisecond);
#endif
  sweep("gpu/prefill", BM_prefill, 8192, 1 << 20, "T");
  sweep("gpu/prefill_det", BM_prefill_det, 8192, 1 << 20, "T");
  sweep("gpu/swa_stream", BM_swa_stream, 8192, 1 << 20, "T");
  sweep("gpu/full_prefill", BM_full_prefill, 8192, 131072, "T");
  sweep("gpu/full_causal_out", BM_full_causal_out, 8192, 131072, "T");
  sweep("gpu/pt", BM_pt, 8192, 131072, "T");
  benchmark::RegisterBenchmark("gpu/full_causal_out_long", BM_full_causal_out_long)
      ->ArgName("T")
      ->RangeMultiplier(2)
      ->Range(262144, 1 << 20)
      ->Iterations(1)
      ->Repetitions(1)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond)
      ->Complexity();
  sweep("gpu/decode_pair_b1", BM_decode_pair<1>, 8192, 1 << 20, "N");
  sweep("gpu/full_decode_b1", BM_full_decode<1>, 8192, 1 << 20, "N");
  sweep("gpu/decode_pair_det_b1", BM_decode_pair_det<1>, 8192, 1 << 20, "N");
  sweep("gpu/decode_pair_b16", BM_decode_pair<16>, 8192, 262144, "N");
  sweep("gpu/full_decode_b16", BM_full_decode<16>, 8192, 262144, "N");
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  int dev = 0, rt = 0, drv = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess) {
    benchmark::AddCustomContext("gpu", prop.name);
    benchmark::AddCustomContext("gpu_sms", std::to_string(prop.multiProcessorCount));
    benchmark::AddCustomContext("gpu_mem_GiB", std::to_string(double(prop.totalGlobalMem) / (1u << 30)));
    benchmark::AddCustomContext("gpu_cc", std::to_string(prop.major) + "." + std::to_string(prop.minor));
  } else {
    benchmark::AddCustomContext("gpu", "none found");
  }
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  benchmark::AddCustomContext("cuda_runtime", std::to_string(rt));
  benchmark::AddCustomContext("cuda_driver", std::to_string(drv));
  benchmark::AddCustomContext("shape", "qwen3-8b attention: H_q=32 H_kv=8 D=128 w=128 bf16, batch 1 unless _b16");
  benchmark::AddCustomContext("flop_count", "4*D per (query,key) pair per query head");
  benchmark::AddCustomContext("bytes_count", "Q, q_out, needed K/V rows read once; O, o_out written once");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
