// Benchmark of context parallelism over R GPUs (docs/context_parallel.md): prefill at
// T = 256K and 1M (qwen3-8b attention shape H_q 32, H_kv 8, D 128, bf16, w = 128, one output
// query), and the latency of one decode step over a sharded 1M cache. One process per GPU,
// launched by this program (fork; the NCCL unique id goes from rank 0 to the others through a
// pipe; the parent never touches CUDA). Built when ORTHROS_NCCL is ON; never a ctest.
//
// Usage: bench_context_parallel [--ranks R] [--runs N] [--T 262144,1048576] [--decode-len 1048576]
//                               [--det] [--json FILE] [--quick]
//   --ranks R   largest rank count (default: the number of visible GPUs); runs R' = 1, 2, 4, ... < R
//               and R itself, so every row has the one-GPU baseline.
//   --quick     T = 32768 and decode over 65536 (smoke run).
// Timing: per rank, CUDA events around cp_attention / cp_decode_step after a barrier
// (ncclAllReduce); the step time is the max over the ranks (all-reduce max), the median of --runs.
// Buffers are the GPU harness's (verify/gpu/harness): inputs filled with seeded values, outputs
// NaN-poisoned, canaries checked after the runs; each rank flushes its L2 (L2Flush) before the
// barrier of every step, outside the timed interval.
#include "orthros/cuda/attention.hpp"
#include "orthros/cuda/context_parallel.hpp"

#include "device_buffer.hpp"
#include "timing.hpp"

#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

namespace oc = orthros::cuda;

namespace {

namespace gh = orthros::gpu_harness;
using gh::DeviceBuffer;

void ck(cudaError_t e, const char* what) { gh::check_cuda(e, what); }

struct Args {
  int ranks = 0;
  int runs = 5;
  std::vector<long long> T = {262144, 1048576};
  long long decode_len = 1048576;
  bool det = false;
  std::string json;
};

void write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    const ssize_t k = write(fd, c, n);
    if (k <= 0) std::exit(3);
    c += k;
    n -= size_t(k);
  }
}
bool read_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n) {
    const ssize_t k = read(fd, c, n);
    if (k <= 0) return false;
    c += k;
    n -= size_t(k);
  }
  return true;
}

int probe_gpus() {  // in a child, so that the parent never initializes CUDA before fork()
  int fd[2];
  if (pipe(fd) != 0) return 0;
  const pid_t pid = fork();
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    write_all(fd[1], &n, sizeof n);
    _exit(0);
  }
  close(fd[1]);
  int n = 0;
  if (!read_all(fd[0], &n, sizeof n)) n = 0;
  close(fd[0]);
  waitpid(pid, nullptr, 0);
  return n;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

oc::AttentionConfig qwen3_cfg(bool det) {
  oc::AttentionConfig c;
  c.dtype = oc::DType::bf16;
  c.num_q_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.window = 128;
  c.deterministic = det;
  return c;
}

// One rank's buffers for a call over `layout` (T base rows, one output query); `extra` rows of
// decode room on the last shard.
struct RankBufs {
  std::vector<DeviceBuffer> own;
  oc::CpRankBuffers b;
  /// A buffer of n bytes: filled with seeded bf16 values when seed != 0 (inputs), else left
  /// NaN-poisoned (outputs and scratch).
  void* make(size_t n, unsigned seed) {
    own.emplace_back(seed ? "input " + std::to_string(own.size()) : "output " + std::to_string(own.size()), n);
    if (seed) own.back().fill_uniform(oc::DType::bf16, seed);
    return own.back().data();
  }
  void check_canaries() const {
    for (const DeviceBuffer& d : own) d.check_canaries();
  }
  RankBufs(const oc::AttentionConfig& cfg, const oc::CpLayout& L, int r, long long T, long long extra) {
    own.reserve(24);
    const int R = L.ranks();
    const size_t qrow = size_t(cfg.num_q_heads) * cfg.head_dim * 2;
    b.kv.halo_rows = oc::cp_halo(L, r, cfg.window, cfg.deterministic).rows;
    b.kv.shard_capacity = L.length[r] + (r == R - 1 ? extra : 0);
    const size_t kvb = oc::cp_rank_kv_bytes(cfg, b.kv.halo_rows + b.kv.shard_capacity);
    b.kv.k = make(kvb, 11 + r);
    b.kv.v = make(kvb, 23 + r);
    const long long tr = std::max<long long>(oc::cp_rank_rows(L, r, T).count, 1);
    b.q = make(tr * qrow, 37 + r);
    b.o = make(tr * qrow, 0);
    b.lse = static_cast<float*>(make(tr * cfg.num_q_heads * 4, 0));
    b.q_out = make(qrow, 41);
    b.o_part = static_cast<float*>(make(oc::cp_partial_bytes(cfg, 1), 0));
    b.lse_part = static_cast<float*>(make(cfg.num_q_heads * 4, 0));
    b.scratch_bytes = oc::cp_scratch_bytes(cfg, 1);
    b.scratch = make(b.scratch_bytes, 0);
    b.states_bytes = oc::cp_states_bytes(cfg, b.kv.shard_capacity);
    b.states = static_cast<float*>(make(b.states_bytes, 0));
    if (r == R - 1) {
      for (int r2 = 0; r2 < R; ++r2)
        b.states_all_bytes += oc::cp_states_bytes(cfg, L.length[r2] + (r2 == R - 1 ? extra : 0));
      b.states_all = static_cast<float*>(make(b.states_all_bytes, 0));
      b.o_parts = static_cast<float*>(make(R * oc::cp_partial_bytes(cfg, 1), 0));
      b.lse_parts = static_cast<float*>(make(R * cfg.num_q_heads * 4, 0));
      b.o_out = make(qrow, 0);
      b.lse_out = static_cast<float*>(make(cfg.num_q_heads * 4, 0));
    }
  }
};

// The body of one rank process; rank 0 writes result lines to `out_fd`.
void rank_main(int R, int rank, const oc::CpNcclId& id, const Args& a, int out_fd) {
  ck(cudaSetDevice(rank), "cudaSetDevice");
  oc::NcclTransport tr(R, rank, id);
  const auto cfg = qwen3_cfg(a.det);
  cudaStream_t s, comm;
  ck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  ck(cudaStreamCreateWithFlags(&comm, cudaStreamNonBlocking), "cudaStreamCreate");
  float* red = nullptr;
  ck(cudaMalloc(&red, sizeof(float)), "cudaMalloc");
  cudaEvent_t e0, e1;
  ck(cudaEventCreate(&e0), "cudaEventCreate");
  ck(cudaEventCreate(&e1), "cudaEventCreate");
  gh::L2Flush flush;
  auto timed = [&](auto&& fn) {  // max over ranks of one step, ms
    flush.flush(s);
    ck(cudaMemsetAsync(red, 0, sizeof(float), s), "memset");
    tr.allreduce(red, 1, 0, s);  // barrier
    ck(cudaEventRecord(e0, s), "record");
    fn();
    ck(cudaEventRecord(e1, s), "record");
    ck(cudaEventSynchronize(e1), "sync");
    float ms = 0;
    ck(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    ck(cudaMemcpyAsync(red, &ms, sizeof(float), cudaMemcpyHostToDevice, s), "copy");
    tr.allreduce(red, 1, 1, s);
    ck(cudaMemcpy(&ms, red, sizeof(float), cudaMemcpyDeviceToHost), "copy");
    return double(ms);
  };
  auto emit = [&](const std::string& line) {
    if (rank == 0) write_all(out_fd, line.data(), line.size());
  };
  oc::CpOptions opt;
  opt.comm_stream = comm;
  for (long long T : a.T) {
    const oc::CpLayout L = oc::even_cp_layout(T, R, oc::kDeterministicChunk);
    RankBufs rb(cfg, L, rank, T, 0);
    ck(cudaDeviceSynchronize(), "fill");
    std::vector<oc::CpRankBuffers> local{rb.b};
    std::vector<double> t;
    for (int i = 0; i < a.runs + 2; ++i) {
      const double ms = timed([&] { oc::cp_attention(cfg, L, T, 1, tr, local, s, opt); });
      if (i >= 2) t.push_back(ms);
    }
    rb.check_canaries();
    std::ostringstream os;
    os << "prefill " << R << " " << T << " " << median(t) << "\n";
    emit(os.str());
  }
  // Decode: one step over a sharded cache of decode_len rows (the halo was exchanged by the first step).
  std::vector<long long> lens = {a.decode_len};
  if (R == 1)  // the one-GPU references for the same cache length per GPU as R' GPUs hold
    for (int r2 = 2; r2 <= 8; r2 *= 2) lens.push_back(a.decode_len / r2);
  for (long long N : lens) {
    oc::CpLayout L = oc::even_cp_layout(N, R, oc::kDeterministicChunk);
    const int steps = a.runs + 3;
    RankBufs rb(cfg, L, rank, 1, steps);
    DeviceBuffer knew("k_new", size_t(cfg.num_kv_heads) * cfg.head_dim * 2),
        vnew("v_new", size_t(cfg.num_kv_heads) * cfg.head_dim * 2);
    knew.fill_uniform(oc::DType::bf16, 5);
    vnew.fill_uniform(oc::DType::bf16, 6);
    ck(cudaDeviceSynchronize(), "fill");
    std::vector<oc::CpRankBuffers> local{rb.b};
    std::vector<double> t;
    for (int i = 0; i < steps; ++i) {
      oc::CpOptions o2 = opt;
      o2.halo_ready = i > 0;
      const double ms = timed([&] { oc::cp_decode_step(cfg, L, tr, local, knew.data(), vnew.data(), s, o2); });
      if (i >= 2) t.push_back(ms);
    }
    rb.check_canaries();
    gh::check_canaries({&knew, &vnew});
    std::ostringstream os;
    os << "decode " << R << " " << N << " " << median(t) << "\n";
    emit(os.str());
  }
}

// Runs R rank processes; returns rank 0's result lines ("" on failure).
std::string run_config(int R, const Args& a) {
  int res[2], idp[2];
  if (pipe(res) != 0 || pipe(idp) != 0) return "";
  std::vector<pid_t> pids;
  for (int r = 0; r < R; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      close(res[0]);
      oc::CpNcclId id{};
      try {
        if (r == 0) {
          id = oc::cp_nccl_unique_id();
          for (int i = 1; i < R; ++i) write_all(idp[1], id.data(), id.size());
        } else if (!read_all(idp[0], id.data(), id.size())) {
          _exit(4);
        }
        rank_main(R, r, id, a, res[1]);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d of %d: %s\n", r, R, e.what());
        _exit(2);
      }
      _exit(0);
    }
    pids.push_back(pid);
  }
  close(res[1]);
  close(idp[0]);
  close(idp[1]);
  std::string out;
  char buf[4096];
  ssize_t k;
  while ((k = read(res[0], buf, sizeof buf)) > 0) out.append(buf, size_t(k));
  close(res[0]);
  bool ok = true;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    ok = ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }
  if (!ok) std::fprintf(stderr, "R = %d: a rank process failed\n", R);
  return ok ? out : "";
}

std::vector<long long> parse_list(const char* s) {
  std::vector<long long> v;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ',')) v.push_back(std::atoll(x.c_str()));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", s.c_str());
        std::exit(1);
      }
      return argv[++i];
    };
    if (s == "--ranks") a.ranks = std::atoi(next());
    else if (s == "--runs") a.runs = std::max(1, std::atoi(next()));
    else if (s == "--T") a.T = parse_list(next());
    else if (s == "--decode-len") a.decode_len = std::atoll(next());
    else if (s == "--det") a.det = true;
    else if (s == "--json") a.json = next();
    else if (s == "--quick") {
      a.T = {32768};
      a.decode_len = 65536;
      a.runs = 3;
    } else {
      std::fprintf(stderr,
                   "usage: bench_context_parallel [--ranks R] [--runs N] [--T a,b] [--decode-len N] [--det] "
                   "[--json FILE] [--quick]\n");
      return 1;
    }
  }
  if (!oc::cp_nccl_available()) {
    std::fprintf(stderr, "built without NCCL (-DORTHROS_NCCL=ON needed)\n");
    return 1;
  }
  const int gpus = probe_gpus();
  if (gpus < 1) {
    std::fprintf(stderr, "no CUDA device visible\n");
    return 1;
  }
  const int R = a.ranks > 0 ? std::min(a.ranks, gpus) : gpus;
  if (a.ranks > gpus) std::printf("note: --ranks %d but only %d GPU(s) visible; using %d\n", a.ranks, gpus, R);
  std::vector<int> configs;
  for (int r = 1; r < R; r *= 2) configs.push_back(r);
  configs.push_back(R);
  std::printf("context-parallel benchmark: qwen3-8b attention (H_q 32, H_kv 8, D 128), bf16, w 128, "
              "%s mode; %d GPU(s) visible, rank counts:", a.det ? "deterministic" : "fast", gpus);
  for (int r : configs) std::printf(" %d", r);
  std::printf("\nL2 flushed on every rank before every timed step by a memset of max(256 MiB, 4 x L2)\n");
  if (R == 1)
    std::printf("only one GPU: R = 1 is the baseline; the multi-GPU rows (R = 2, 4, 8) need a machine with more "
                "GPUs (run there with no arguments, or --ranks R)\n");
  struct Row {
    std::string kind;
    int R;
    long long N;
    double ms;
  };
  std::vector<Row> rows;
  for (int r : configs) {
    std::istringstream in(run_config(r, a));
    Row x;
    while (in >> x.kind >> x.R >> x.N >> x.ms) rows.push_back(x);
  }
  auto base = [&](const std::string& kind, long long N) {
    for (auto& x : rows)
      if (x.kind == kind && x.R == 1 && x.N == N) return x.ms;
    return 0.0;
  };
  std::printf("\n%-8s %5s %10s %12s %9s %11s\n", "kind", "R", "N", "ms", "speedup", "efficiency");
  for (auto& x : rows) {
    const double b = base(x.kind, x.N);
    if (x.kind == "prefill" && b > 0)
      std::printf("%-8s %5d %10lld %12.3f %8.2fx %10.1f%%\n", x.kind.c_str(), x.R, x.N, x.ms, b / x.ms,
                  100.0 * b / x.ms / x.R);
    else
      std::printf("%-8s %5d %10lld %12.4f %9s %11s\n", x.kind.c_str(), x.R, x.N, x.ms, "", "");
  }
  std::printf("\ndecode target: R GPUs over N rows <= 1.2x one GPU over N/R rows:\n");
  for (auto& x : rows)
    if (x.kind == "decode" && x.R > 1) {
      const double b = base("decode", x.N / x.R);
      if (b > 0) std::printf("  R=%d N=%lld: %.4f ms vs one GPU at N/R: %.4f ms -> %.2fx\n", x.R, x.N, x.ms, b, x.ms / b);
    }
  std::ostringstream js;
  js << "{\"bench\": \"context_parallel\", \"shape\": {\"H_q\": 32, \"H_kv\": 8, \"D\": 128, \"dtype\": \"bf16\", "
        "\"window\": 128, \"deterministic\": "
     << (a.det ? "true" : "false") << "}, \"gpus_visible\": " << gpus << ", \"rows\": [";
  for (size_t i = 0; i < rows.size(); ++i)
    js << (i ? ", " : "") << "{\"kind\": \"" << rows[i].kind << "\", \"ranks\": " << rows[i].R
       << ", \"N\": " << rows[i].N << ", \"ms\": " << rows[i].ms << "}";
  js << "]}\n";
  std::printf("\n%s", js.str().c_str());
  if (!a.json.empty()) {
    FILE* f = std::fopen(a.json.c_str(), "w");
    if (f) {
      std::fputs(js.str().c_str(), f);
      std::fclose(f);
    }
  }
  return rows.empty() ? 1 : 0;
}
