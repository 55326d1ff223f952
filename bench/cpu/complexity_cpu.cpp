/// \file complexity_cpu.cpp
/// \brief Complexity micro-benchmarks of the CPU oracle (paper §3.3, SPEC §2/§4).
///
/// Sweeps the sequence length and lets Google Benchmark fit big-O (SetComplexityN + Complexity):
///   - operator level, per stream: sliding-window base stream O(T*w), output (cross) stream
///     O(T_out*T);
///   - operator level, per regime: PT O(T^2), SFT with a fixed response length O(T), prefill O(T),
///     decode step O(P);
///   - full causal attention of the same shapes (the operator with w >= T) as the comparison rows;
///   - layer level: the projections O(T*d^2), and the whole layer in prefill, PT and decode.
///
/// Shape (small heads, so a CPU sweep is short): H_q = 4, H_kv = 2, D = 64, w = 128, float32,
/// d_model = d = H_q*D = 256 at the layer level. Run with OMP_NUM_THREADS=1 for stable timing.
///
/// Counters (per iteration, reported as rates over real time):
///   - FLOP/s: exactly 4*D FLOPs per (query, key) pair per query head (2*D for q.k, 2*D for p*v),
///     counted with the operator's own key ranges; softmax exp/max/div are NOT counted. Layer
///     benchmarks add 2*rows*in*out per projection (RoPE and QK-norm not counted).
///   - bytes/s: compulsory traffic, every tensor read or written once (Q, q_out, the K/V rows
///     the call touches, O, o_out; LSEs not counted), as the GPU benchmarks define it.
#include "orthros/attention.hpp"
#include "orthros/layer.hpp"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace {

using orthros::Mat;
using Index = Eigen::Index;
using S = float;

constexpr int kHq = 4, kHkv = 2, kD = 64;
constexpr std::int64_t kWindow = 128;
constexpr std::int64_t kFull = std::numeric_limits<std::int64_t>::max() / 4;  // w >= T: plain causal
constexpr std::uint64_t kSeed = 20261130;

const orthros::AttentionDims kDims{kHq, kHkv, kD};

/// Seeded U(-1, 1) matrix (never zeros).
Mat<S> random_mat(Index rows, Index cols, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  Mat<S> m(rows, cols);
  for (Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<S>(u(gen));
  return m;
}

/// (query, key) pairs visited by base queries at 0-based cache rows [first, first+n) with window w.
double swa_pairs(Index first, Index n, std::int64_t w) {
  double p = 0;
  for (Index t = first; t < first + n; ++t) p += static_cast<double>(std::min<Index>(t + 1, w));
  return p;
}
/// Pairs visited by output queries at cache rows [first, first+n): row t sees t+1 keys.
double cross_pairs(Index first, Index n) {
  return static_cast<double>(n) * static_cast<double>(first + 1) + static_cast<double>(n) * (n - 1) / 2.0;
}

/// One operator call: T base queries after P cached rows, the last T_out with output queries.
struct OperatorCase {
  Mat<S> q, k, v, q_out;
  Index T, P, T_out;
  std::int64_t window;
  OperatorCase(Index T_, Index P_, Index T_out_, std::int64_t w)
      : q(random_mat(T_, Index(kHq) * kD, kSeed + 1)),
        k(random_mat(P_ + T_, Index(kHkv) * kD, kSeed + 2)),
        v(random_mat(P_ + T_, Index(kHkv) * kD, kSeed + 3)),
        q_out(random_mat(T_out_, Index(kHq) * kD, kSeed + 4)),
        T(T_), P(P_), T_out(T_out_), window(w) {}
  double pairs() const { return swa_pairs(P, T, window) + cross_pairs(P + T - T_out, T_out); }
  double flops() const { return 4.0 * kD * kHq * pairs(); }
  /// Keys the call touches: the cross stream reads rows [0, P+T) when T_out > 0, else the window.
  double bytes() const {
    const Index first_key = T_out > 0 ? 0 : std::max<Index>(0, P - window + 1);
    const double kv_rows = static_cast<double>(P + T - first_key);
    return sizeof(S) * (2.0 * (T + T_out) * kHq * kD + 2.0 * kv_rows * kHkv * kD);
  }
};

void set_counters(benchmark::State& st, double flops, double bytes, double pairs) {
  st.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["pairs"] = pairs;
  st.SetBytesProcessed(static_cast<std::int64_t>(bytes) * st.iterations());
}

void run_operator(benchmark::State& st, const OperatorCase& c, std::int64_t complexity_n) {
  const orthros::AttentionOptions opt{c.window, std::nullopt};
  for (auto _ : st) {
    auto r = orthros::orthros_attention<S>(c.q, c.k, c.v, c.q_out, kDims, opt);
    benchmark::DoNotOptimize(r.o.data());
    benchmark::DoNotOptimize(r.o_out.data());
    benchmark::ClobberMemory();
  }
  st.SetComplexityN(complexity_n);
  st.counters["T"] = static_cast<double>(c.T);
  st.counters["P"] = static_cast<double>(c.P);
  st.counters["T_out"] = static_cast<double>(c.T_out);
  set_counters(st, c.flops(), c.bytes(), c.pairs());
}

// ---- operator level, per stream ---------------------------------------------------------
/// Base stream alone (T_out = 0): O(T*w).
void BM_op_swa_stream(benchmark::State& st) {
  const Index T = st.range(0);
  run_operator(st, OperatorCase(T, 0, 0, kWindow), T);
}
/// Output (cross) stream: T_out output queries at the end of a context of T positions
/// (q has T_out rows after P = T - T_out cached ones). w = 1 makes the base stream's share
/// T_out keys, negligible, so the time is the cross stream's O(T_out*T). N = T_out*T.
void BM_op_cross_stream(benchmark::State& st) {
  const Index T_out = st.range(0), T = st.range(1);
  run_operator(st, OperatorCase(T_out, T - T_out, T_out, 1), T_out * T);
}

// ---- operator level, per regime (SPEC §4) ------------------------------------------------
/// PT: T_out = T, P = 0: SWA + full causal for every position, O(T^2).
void BM_op_pt(benchmark::State& st) {
  const Index T = st.range(0);
  run_operator(st, OperatorCase(T, 0, T, kWindow), T);
}
/// SFT with a fixed response length T_out = 64 (prompt grows): O(T*w + T_out*T) = O(T).
void BM_op_sft_tout64(benchmark::State& st) {
  const Index T = st.range(0);
  run_operator(st, OperatorCase(T, 0, 64, kWindow), T);
}
/// Prefill: T_out = 1, P = 0: O(T*w + T) = O(T).
void BM_op_prefill(benchmark::State& st) {
  const Index T = st.range(0);
  run_operator(st, OperatorCase(T, 0, 1, kWindow), T);
}
/// Decode step: one pair (T = T_out = 1) at position N after P = N-1 cached: O(w + N) = O(N).
void BM_op_decode(benchmark::State& st) {
  const Index N = st.range(0);
  run_operator(st, OperatorCase(1, N - 1, 1, kWindow), N);
}

// ---- full causal attention of the same shapes (comparison rows) --------------------------
/// Full-attention prefill: the same call as BM_op_prefill with w >= T: O(T^2).
void BM_full_prefill(benchmark::State& st) {
  const Index T = st.range(0);
  run_operator(st, OperatorCase(T, 0, 1, kFull), T);
}
/// Full-attention PT: T causal queries, no output stream (a vanilla Transformer's attention).
void BM_full_pt(benchmark::State& st) {
  const Index T = st.range(0);
  run_operator(st, OperatorCase(T, 0, 0, kFull), T);
}
/// Full-attention decode: one query over N keys (the Transformer's decode step).
void BM_full_decode(benchmark::State& st) {
  const Index N = st.range(0);
  run_operator(st, OperatorCase(1, N - 1, 0, kFull), N);
}

// ---- layer level (paper Algorithm 1): projections O(T*d^2) -------------------------------
constexpr int kDModel = kHq * kD;  // 256

orthros::AttentionConfig layer_config() {
  orthros::AttentionConfig c;
  c.num_q_heads = kHq;
  c.num_kv_heads = kHkv;
  c.head_dim = kD;
  c.window = kWindow;
  c.rope_theta = 1e6;
  c.qk_norm = true;
  return c;
}

orthros::AttentionWeights<S> layer_weights() {
  const Index d = Index(kHq) * kD, dkv = Index(kHkv) * kD;
  orthros::AttentionWeights<S> w;
  const S a = static_cast<S>(std::sqrt(3.0 / kDModel));
  w.w_q = random_mat(kDModel, d, kSeed + 10) * a;
  w.w_k = random_mat(kDModel, dkv, kSeed + 11) * a;
  w.w_v = random_mat(kDModel, dkv, kSeed + 12) * a;
  w.w_o = random_mat(d, kDModel, kSeed + 13) * static_cast<S>(std::sqrt(3.0 / d));
  auto around_one = [](Index n, std::uint64_t seed) {
    orthros::Vec<S> x = random_mat(n, 1, seed) * S(0.1);
    return orthros::Vec<S>((x.array() + S(1)).matrix());
  };
  w.alpha = around_one(d, kSeed + 14);
  w.alpha_out = around_one(d, kSeed + 15);
  w.beta = orthros::Vec<S>(random_mat(d, 1, kSeed + 16) * S(0.1));
  w.beta_out = orthros::Vec<S>(random_mat(d, 1, kSeed + 17) * S(0.1));
  w.q_norm = around_one(kD, kSeed + 18);
  w.k_norm = around_one(kD, kSeed + 19);
  return w;
}

/// FLOPs of the layer's projections: Q/K/V of T base rows, Q of T_out output rows, W_O of both.
double projection_flops(Index T, Index T_out) {
  const double d = double(kHq) * kD, dkv = double(kHkv) * kD;
  return 2.0 * (T * kDModel * (d + 2 * dkv) + T_out * kDModel * d + (T + T_out) * d * kDModel);
}

/// One projection x[T, d_model] W[d_model, d]: O(T*d^2).
void BM_layer_projection(benchmark::State& st) {
  const Index T = st.range(0);
  const Mat<S> x = random_mat(T, kDModel, kSeed + 20);
  const Mat<S> w = random_mat(kDModel, Index(kHq) * kD, kSeed + 21);
  for (auto _ : st) {
    Mat<S> y = orthros::project(x, w);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  st.SetComplexityN(T);
  const double flops = 2.0 * T * kDModel * kHq * kD;
  set_counters(st, flops, sizeof(S) * (double(T) * kDModel + double(kDModel) * kHq * kD + double(T) * kHq * kD), 0);
}

/// The whole attention layer on a fresh cache: T base rows, the last T_out with output rows.
void run_layer(benchmark::State& st, Index T, Index T_out) {
  const auto cfg = layer_config();
  const auto w = layer_weights();
  const Mat<S> x = random_mat(T, kDModel, kSeed + 30), x_out = random_mat(T_out, kDModel, kSeed + 31);
  for (auto _ : st) {
    orthros::KVCache<S> cache;
    cache.k.resize(0, Index(kHkv) * kD);
    cache.v.resize(0, Index(kHkv) * kD);
    auto y = orthros::orthros_attention_layer<S>(w, cfg, x, x_out, cache);
    benchmark::DoNotOptimize(y.first.data());
    benchmark::DoNotOptimize(y.second.data());
    benchmark::ClobberMemory();
  }
  st.SetComplexityN(T);
  const double pairs = swa_pairs(0, T, kWindow) + cross_pairs(T - T_out, T_out);
  const double flops = projection_flops(T, T_out) + 4.0 * kD * kHq * pairs;
  const double d = double(kHq) * kD, dkv = double(kHkv) * kD;
  const double bytes = sizeof(S) * ((T + T_out) * 2.0 * kDModel + kDModel * (2 * d + 2 * dkv) + 2.0 * T * dkv);
  st.counters["T"] = static_cast<double>(T);
  st.counters["T_out"] = static_cast<double>(T_out);
  set_counters(st, flops, bytes, pairs);
}
void BM_layer_prefill(benchmark::State& st) { run_layer(st, st.range(0), 1); }
void BM_layer_pt(benchmark::State& st) { run_layer(st, st.range(0), st.range(0)); }

/// One decode step of the layer (T = T_out = 1) after a cache of N-1 rows: O(d^2 + N).
/// The cache is restored (untimed) after each step, since the layer appends to it.
void BM_layer_decode(benchmark::State& st) {
  const Index N = st.range(0), P = N - 1;
  const auto cfg = layer_config();
  const auto w = layer_weights();
  const Mat<S> x = random_mat(1, kDModel, kSeed + 40), x_out = random_mat(1, kDModel, kSeed + 41);
  orthros::KVCache<S> base;
  base.k = random_mat(P, Index(kHkv) * kD, kSeed + 42);
  base.v = random_mat(P, Index(kHkv) * kD, kSeed + 43);
  orthros::KVCache<S> cache = base;
  for (auto _ : st) {
    auto y = orthros::orthros_attention_layer<S>(w, cfg, x, x_out, cache);
    benchmark::DoNotOptimize(y.second.data());
    benchmark::ClobberMemory();
    st.PauseTiming();
    cache = base;
    st.ResumeTiming();
  }
  st.SetComplexityN(N);
  const double pairs = swa_pairs(P, 1, kWindow) + cross_pairs(P, 1);
  const double flops = projection_flops(1, 1) + 4.0 * kD * kHq * pairs;
  const double d = double(kHq) * kD, dkv = double(kHkv) * kD;
  const double bytes = sizeof(S) * (4.0 * kDModel + kDModel * (2 * d + 2 * dkv) + 2.0 * N * dkv);
  st.counters["P"] = static_cast<double>(P);
  set_counters(st, flops, bytes, pairs);
}

/// Decode sweeps start at N = 16K: from there the K/V cache (1 KiB per position) no longer fits
/// the L2/L3 caches and the step is in its asymptotic, memory-streaming regime; below, the
/// L3 -> DRAM transition bends the curve upwards (a cache effect, not a complexity class).
///
/// Upper end of the sweeps, scaled by ORTHROS_BENCH_SCALE (default 1; the ctest checker uses a
/// smaller value for a short sweep). Each sweep keeps at least 4 points.
std::int64_t scaled(std::int64_t hi, std::int64_t lo) {
  double s = 1.0;
  if (const char* e = std::getenv("ORTHROS_BENCH_SCALE")) s = std::atof(e);
  if (!(s > 0)) s = 1.0;
  std::int64_t v = static_cast<std::int64_t>(static_cast<double>(hi) * s);
  v = std::max<std::int64_t>(v, lo * 8);
  std::int64_t p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}

void register_all() {
  auto sweep = [](const char* name, void (*fn)(benchmark::State&), std::int64_t lo, std::int64_t hi,
                  const char* arg) {
    benchmark::RegisterBenchmark(name, fn)
        ->ArgName(arg)
        ->RangeMultiplier(2)
        ->Range(lo, scaled(hi, lo))
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond)
        ->Complexity();
  };
  sweep("op/swa_stream", BM_op_swa_stream, 512, 16384, "T");
  benchmark::RegisterBenchmark("op/cross_stream", BM_op_cross_stream)
      ->ArgNames({"T_out", "T"})
      ->ArgsProduct({{4, 16, 64}, {512, 1024, 2048, scaled(4096, 512)}})
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond)
      ->Complexity();
  sweep("op/pt", BM_op_pt, 256, 2048, "T");
  sweep("op/sft_tout64", BM_op_sft_tout64, 512, 16384, "T");
  sweep("op/prefill", BM_op_prefill, 512, 16384, "T");
  sweep("op/decode", BM_op_decode, 16384, 262144, "N");
  sweep("full/pt", BM_full_pt, 256, 2048, "T");
  sweep("full/prefill", BM_full_prefill, 256, 2048, "T");
  sweep("full/decode", BM_full_decode, 16384, 262144, "N");
  sweep("layer/projection", BM_layer_projection, 512, 16384, "T");
  sweep("layer/prefill", BM_layer_prefill, 512, 8192, "T");
  sweep("layer/pt", BM_layer_pt, 256, 2048, "T");
  sweep("layer/decode", BM_layer_decode, 16384, 262144, "N");
}

}  // namespace

int main(int argc, char** argv) {
#if defined(__GLIBC__)
  // Serve every allocation from the heap and never give it back: otherwise each call's large
  // outputs (and the layer's KV-cache growth) come from fresh mmap pages whose page faults, slow
  // and erratic on a virtual machine, would be timed instead of the attention arithmetic.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
#endif
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
#ifdef _OPENMP
  benchmark::AddCustomContext("omp_max_threads", std::to_string(omp_get_max_threads()));
#endif
  benchmark::AddCustomContext("shape", "H_q=4 H_kv=2 D=64 w=128 float32 d_model=256");
  benchmark::AddCustomContext("flop_count", "4*D per (query,key) pair per query head + 2*in*out per projected row");
  benchmark::AddCustomContext("input_seed", std::to_string(kSeed));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
