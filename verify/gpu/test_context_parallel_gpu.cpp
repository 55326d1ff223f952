// GPU suite (ctest label `gpu`) of context parallelism (docs/context_parallel.md,
// cuda/include/orthros/cuda/context_parallel.hpp): R = 1..8 VIRTUAL ranks on one GPU through the
// LoopbackTransport, against attention_forward on the whole sequence and the float64 oracle.
//   - window stream o/lse: bitwise equal to one GPU (fast and deterministic mode, any shards, the
//     halo spanning several ranks when shards are shorter than w-1);
//   - output stream o_out/lse_out: bitwise for R = 1, and in the deterministic mode on the state
//     path (one output query, shards on the 1024-key chunk grid, each longer than a chunk: the
//     fp32 chunk states of all ranks merged as one chain, as one GPU merges them); everywhere
//     within SPEC §6 (both criteria) against the float64 oracle (normalized path: each rank's
//     partial o stays float32, AttentionBuffers::o_out_float32, and the merge rounds once);
//   - decode steps over a sharded cache (append to the last rank, halo kept between steps);
//   - argument errors (these run without a GPU too).
// Every device buffer is a guarded, NaN-poisoned DeviceBuffer of the GPU harness; the canaries
// are checked after every call. Seeds are printed (SCOPED_TRACE).
#include "gpu_testing.hpp"
#include "orthros/cuda/context_parallel.hpp"
#include "orthros_testing.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace orthros;
using namespace orthros::gputest;
using orthros::testing::Rng;
namespace oc = orthros::cuda;

namespace {

oc::AttentionConfig config_of(const AttentionDims& d, oc::DType t, std::int64_t w, bool det) {
  oc::AttentionConfig c;
  c.dtype = t;
  c.num_q_heads = d.num_q_heads;
  c.num_kv_heads = d.num_kv_heads;
  c.head_dim = d.head_dim;
  c.window = w;
  c.deterministic = det;
  return c;
}

/// The device buffers of R virtual ranks (NaN-poisoned), with the shards uploaded.
template <typename S>
struct Ranks {
  std::vector<std::unique_ptr<DeviceBuffer>> keep;
  std::vector<oc::CpRankBuffers> b;
  std::vector<oc::CpRows> rows;
  DeviceBuffer* make(const std::string& name, size_t bytes) {
    keep.push_back(std::make_unique<DeviceBuffer>(name, bytes));
    return keep.back().get();
  }
  void check_canaries() const {
    for (const auto& d : keep) d->check_canaries();
  }
  /// k/v: the whole sequence [N, H_kv*D]; `extra` rows of room on the last shard (decode).
  Ranks(const oc::AttentionConfig& cfg, const oc::CpLayout& L, const Mat<S>& k, const Mat<S>& v, std::int64_t T,
        std::int64_t T_out, std::int64_t extra = 0) {
    const int R = L.ranks();
    const size_t es = sizeof(S), qrow = size_t(cfg.num_q_heads) * cfg.head_dim * es;
    const size_t kvrow = size_t(cfg.num_kv_heads) * cfg.head_dim * es;
    b.resize(R);
    size_t states_all_bytes = 0;
    for (int r = 0; r < R; ++r) {
      auto& x = b[r];
      const oc::CpHalo h = oc::cp_halo(L, r, cfg.window, cfg.deterministic);
      x.kv.halo_rows = h.rows;
      x.kv.shard_capacity = L.length[r] + (r == R - 1 ? extra : 0);
      const std::int64_t kv_rows = x.kv.halo_rows + x.kv.shard_capacity;
      DeviceBuffer* kb = make("rank " + std::to_string(r) + " k", kv_rows * kvrow);
      DeviceBuffer* vb = make("rank " + std::to_string(r) + " v", kv_rows * kvrow);
      kb->upload(k.data() + L.start(r) * k.cols(), L.length[r] * kvrow, h.rows * kvrow);
      vb->upload(v.data() + L.start(r) * v.cols(), L.length[r] * kvrow, h.rows * kvrow);
      x.kv.k = kb->data();
      x.kv.v = vb->data();
      rows.push_back(oc::cp_rank_rows(L, r, T));
      const std::int64_t tr = std::max<std::int64_t>(rows.back().count, 1);
      x.q = make("rank " + std::to_string(r) + " q", tr * qrow)->data();
      x.o = make("rank " + std::to_string(r) + " o", tr * qrow)->data();
      x.lse = static_cast<float*>(make("rank " + std::to_string(r) + " lse", tr * cfg.num_q_heads * 4)->data());
      const std::int64_t to = std::max<std::int64_t>(T_out, 1);
      x.q_out = make("rank " + std::to_string(r) + " q_out", to * qrow)->data();
      x.o_part = static_cast<float*>(make("rank " + std::to_string(r) + " o_part", oc::cp_partial_bytes(cfg, to))->data());
      x.lse_part =
          static_cast<float*>(make("rank " + std::to_string(r) + " lse_part", to * cfg.num_q_heads * 4)->data());
      x.scratch_bytes = oc::cp_scratch_bytes(cfg, to);
      x.scratch = make("rank " + std::to_string(r) + " scratch", x.scratch_bytes)->data();
      x.states_bytes = oc::cp_states_bytes(cfg, x.kv.shard_capacity);
      x.states = static_cast<float*>(make("rank " + std::to_string(r) + " states", x.states_bytes)->data());
      states_all_bytes += x.states_bytes;
      if (r == R - 1) {
        x.states_all_bytes = states_all_bytes;
        x.states_all = static_cast<float*>(make("rank " + std::to_string(r) + " states_all", states_all_bytes)->data());
        x.o_parts =
            static_cast<float*>(make("rank " + std::to_string(r) + " o_parts", R * oc::cp_partial_bytes(cfg, to))->data());
        x.lse_parts =
            static_cast<float*>(make("rank " + std::to_string(r) + " lse_parts", R * to * cfg.num_q_heads * 4)->data());
        x.o_out = make("rank " + std::to_string(r) + " o_out", to * qrow)->data();
        x.lse_out =
            static_cast<float*>(make("rank " + std::to_string(r) + " lse_out", to * cfg.num_q_heads * 4)->data());
      }
    }
  }
};

/// Runs cp_attention over the loopback transport; returns the ranks' rows assembled in order.
template <typename S>
SeqOut<S> run_cp(const SeqIn<S>& in, const AttentionDims& d, const oc::AttentionConfig& cfg,
                 const std::vector<std::int64_t>& lens, bool two_streams) {
  const std::int64_t N = in.k.rows(), T = in.q.rows(), T_out = in.q_out.rows(), P = N - T;
  const oc::CpLayout L = oc::make_cp_layout(lens, N);
  Ranks<S> rk(cfg, L, in.k, in.v, T, T_out);
  const int Hq = d.num_q_heads, D = d.head_dim;
  const size_t es = sizeof(S), qrow = size_t(Hq) * D * es;
  for (int r = 0; r < L.ranks(); ++r)
    if (rk.rows[r].count)
      check_cuda(cudaMemcpy(const_cast<void*>(rk.b[r].q), in.q.data() + (rk.rows[r].first - P) * in.q.cols(),
                            rk.rows[r].count * qrow, cudaMemcpyHostToDevice),
                 "upload q");
  if (T_out)
    check_cuda(cudaMemcpy(rk.b.back().q_out, in.q_out.data(), T_out * qrow, cudaMemcpyHostToDevice), "upload q_out");
  oc::LoopbackTransport tr(L.ranks());
  cudaStream_t s = nullptr, comm = nullptr;
  check_cuda(cudaStreamCreate(&s), "cudaStreamCreate");
  if (two_streams) check_cuda(cudaStreamCreate(&comm), "cudaStreamCreate");
  oc::CpOptions opt;
  opt.comm_stream = comm;
  oc::cp_attention(cfg, L, T, T_out, tr, rk.b, s, opt);
  check_cuda(cudaStreamSynchronize(s), "sync after cp_attention");
  rk.check_canaries();
  if (comm) cudaStreamDestroy(comm);
  cudaStreamDestroy(s);
  SeqOut<S> out;
  out.o.resize(T, Hq * D);
  out.lse.resize(T, Hq);
  out.o_out.resize(T_out, Hq * D);
  out.lse_out.resize(T_out, Hq);
  for (int r = 0; r < L.ranks(); ++r) {
    const auto& rw = rk.rows[r];
    if (!rw.count) continue;
    check_cuda(
        cudaMemcpy(out.o.data() + (rw.first - P) * out.o.cols(), rk.b[r].o, rw.count * qrow, cudaMemcpyDeviceToHost),
        "download o");
    check_cuda(cudaMemcpy(out.lse.data() + (rw.first - P) * Hq, rk.b[r].lse, rw.count * Hq * 4, cudaMemcpyDeviceToHost),
               "download lse");
  }
  if (T_out) {
    check_cuda(cudaMemcpy(out.o_out.data(), rk.b.back().o_out, T_out * qrow, cudaMemcpyDeviceToHost), "download o_out");
    check_cuda(cudaMemcpy(out.lse_out.data(), rk.b.back().lse_out, T_out * Hq * 4, cudaMemcpyDeviceToHost),
               "download lse_out");
  }
  return out;
}

std::string lens_str(const std::vector<std::int64_t>& v) {
  std::string s = "{";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "}";
}

/// Random shard lengths (>= 1) summing to N over R ranks, often shorter than w-1.
std::vector<std::int64_t> random_lens(Rng& rng, std::int64_t N, int R) {
  std::vector<std::int64_t> cuts;
  std::uniform_int_distribution<std::int64_t> u(1, N - 1);
  while (static_cast<int>(cuts.size()) < R - 1) {
    const std::int64_t c = u(rng);
    if (std::find(cuts.begin(), cuts.end(), c) == cuts.end()) cuts.push_back(c);
  }
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::int64_t> lens;
  std::int64_t prev = 0;
  for (auto c : cuts) {
    lens.push_back(c - prev);
    prev = c;
  }
  lens.push_back(N - prev);
  return lens;
}

template <typename S>
void random_cases(std::uint64_t seed0, int cases) {
  for (int c = 0; c < cases; ++c) {
    const std::uint64_t seed = seed0 + c;
    Rng rng(seed);
    const int R = 1 + c % 8;
    AttentionDims d;
    d.num_kv_heads = 1 + int(rng() % 2);
    d.num_q_heads = d.num_kv_heads * (1 << (rng() % 3));  // GQA 1, 2, 4
    d.head_dim = (rng() % 2) ? 128 : 64;
    const std::int64_t wk = rng() % 4;
    const std::int64_t w = wk == 0 ? 1 : wk == 1 ? 1 + std::int64_t(rng() % 40) : wk == 2 ? 128 : std::int64_t(1) << 40;
    const bool det = rng() % 2;
    // N <= 800 (<= 300 for an unbounded window) keeps the float64 oracle on the CPU fast.
    const std::int64_t N = std::max<std::int64_t>(R, 8 + std::int64_t(rng() % (wk == 3 ? 300 : 800)));
    // Regimes: prefill (P = 0, T_out = 1), PT (short, T_out = T), chunk (P > 0, T_out 0/1), SFT (T_out few).
    const int regime = rng() % 4;
    std::int64_t T = N, T_out = 1;
    if (regime == 1 && N <= 300) T_out = T;
    if (regime == 2) {
      T = 1 + std::int64_t(rng() % N);
      T_out = rng() % 2;
    }
    if (regime == 3) T_out = 1 + std::int64_t(rng() % std::min<std::int64_t>(T, 9));
    const auto lens = random_lens(rng, N, R);
    const bool two = rng() % 2;
    std::ostringstream what;
    what << "seed=" << seed << " dtype=" << dtype_name<S>() << " R=" << R << " shards=" << lens_str(lens)
         << " H_q=" << d.num_q_heads << " H_kv=" << d.num_kv_heads << " D=" << d.head_dim << " N=" << N << " T=" << T
         << " T_out=" << T_out << " w=" << w << " det=" << det << " comm_stream=" << two;
    SCOPED_TRACE(what.str());
    const auto in = make_case<S>(rng, d, T, N - T, T_out);
    const auto cfg = config_of(d, dtype_of<S>(), w, det);
    const auto one = run_gpu1<S>(in, d, cfg);
    const auto got = run_cp<S>(in, d, cfg, lens, two);
    EXPECT_EQ(bitwise(got.o, one.o, "o (window stream)"), "");
    EXPECT_EQ(bitwise(got.lse, one.lse, "lse (window stream)"), "");
    const bool exact = R == 1 || (det && oc::cp_state_splits(cfg, oc::make_cp_layout(lens, N), 0, T_out) > 0);
    if (exact) {
      EXPECT_EQ(bitwise(got.o_out, one.o_out, "o_out (R = 1 or deterministic state path)"), "");
      EXPECT_EQ(bitwise(got.lse_out, one.lse_out, "lse_out (R = 1 or deterministic state path)"), "");
    }
    // Elsewhere the merged output stream differs from one GPU's in rounding only; what it must meet
    // is the operator's contract: SPEC §6 (both criteria) against the float64 oracle, every dtype.
    AttentionOptions opt;
    opt.window = w;
    const auto ocheck = check_vs_oracle<S>(in, got, d, opt);
    EXPECT_TRUE(ocheck.pass) << ocheck.report;
  }
}

}  // namespace

// ---- window stream bitwise, output stream merged: random layouts, R = 1..8 --------------------
TEST(GpuContextParallel, LoopbackMatchesOneGpuBf16) {
  ORTHROS_REQUIRE_GPU();
  random_cases<Eigen::bfloat16>(12000, 32);
}
TEST(GpuContextParallel, LoopbackMatchesOneGpuF32) {
  ORTHROS_REQUIRE_GPU();
  random_cases<float>(13000, 24);
}

// ---- qwen3-8b shape, deterministic mode, shards aligned to the deterministic chunk --------------
template <typename S>
void aligned_det_case(int R, std::uint64_t seed) {
  const std::int64_t C = 2 * oc::kDeterministicChunk, N = C * R + 300;
  SCOPED_TRACE("seed=" + std::to_string(seed) + " dtype=" + dtype_name<S>() + " R=" + std::to_string(R) +
               " N=" + std::to_string(N) + " det=1 w=128 shards of 2048 (+300 on the last), on the chunk grid");
  Rng rng(seed);
  AttentionDims d{32, 8, 128};
  const auto in = make_case<S>(rng, d, N, 0, 1);
  const auto cfg = config_of(d, dtype_of<S>(), 128, true);
  std::vector<std::int64_t> lens(R, C);
  lens.back() += 300;
  const auto one = run_gpu1<S>(in, d, cfg);
  const auto got = run_cp<S>(in, d, cfg, lens, true);
  EXPECT_EQ(bitwise(got.o, one.o, "o (window stream)"), "");
  EXPECT_EQ(bitwise(got.lse, one.lse, "lse (window stream)"), "");
  // The state path: every rank's chunk states merged in chunk order = the single GPU's merge.
  EXPECT_EQ(bitwise(got.o_out, one.o_out, "o_out (deterministic, aligned shards)"), "");
  EXPECT_EQ(bitwise(got.lse_out, one.lse_out, "lse_out (deterministic, aligned shards)"), "");
  // Run to run: the same call again gives the same bits.
  const auto again = run_cp<S>(in, d, cfg, lens, false);
  EXPECT_EQ(bitwise(again.o_out, got.o_out, "o_out run to run"), "");
  EXPECT_EQ(bitwise(again.lse_out, got.lse_out, "lse_out run to run"), "");
}
TEST(GpuContextParallel, DeterministicAlignedShardsQwen3Shape) {
  ORTHROS_REQUIRE_GPU();
  for (int R : {1, 2, 3}) aligned_det_case<Eigen::bfloat16>(R, 14000 + R);
}

// ---- decode over a sharded cache ---------------------------------------------------------------
template <typename S>
void decode_case(const std::vector<std::int64_t>& lens0, std::int64_t w, bool det, std::uint64_t seed) {
  const int steps = 5;
  std::int64_t N0 = 0;
  for (auto x : lens0) N0 += x;
  SCOPED_TRACE("seed=" + std::to_string(seed) + " dtype=" + dtype_name<S>() + " shards=" + lens_str(lens0) +
               " w=" + std::to_string(w) + " det=" + std::to_string(det) + " decode steps=" + std::to_string(steps));
  Rng rng(seed);
  AttentionDims d{8, 2, 128};
  const auto all = make_case<S>(rng, d, steps, N0, steps);  // k/v: N0 cached rows + one per step
  const auto cfg = config_of(d, dtype_of<S>(), w, det);
  oc::CpLayout L = oc::make_cp_layout(lens0, N0);
  const int R = L.ranks();
  Ranks<S> rk(cfg, L, all.k, all.v, 1, 1, steps);
  oc::LoopbackTransport tr(R);
  const int Hq = d.num_q_heads, D = d.head_dim;
  const size_t es = sizeof(S), qrow = size_t(Hq) * D * es, kvrow = size_t(d.num_kv_heads) * D * es;
  DeviceBuffer knew("knew", kvrow), vnew("vnew", kvrow);
  for (int s = 0; s < steps; ++s) {
    const std::int64_t N = N0 + s + 1;
    auto& last = rk.b.back();
    check_cuda(cudaMemcpy(const_cast<void*>(last.q), all.q.data() + s * all.q.cols(), qrow, cudaMemcpyHostToDevice),
               "q");
    check_cuda(cudaMemcpy(last.q_out, all.q_out.data() + s * all.q_out.cols(), qrow, cudaMemcpyHostToDevice), "q_out");
    knew.upload(all.k.data() + (N - 1) * all.k.cols(), kvrow);
    vnew.upload(all.v.data() + (N - 1) * all.v.cols(), kvrow);
    oc::CpOptions opt;
    opt.halo_ready = s > 0;  // the last rank's halo does not change while its shard grows
    oc::cp_decode_step(cfg, L, tr, rk.b, knew.data(), vnew.data(), nullptr, opt);
    check_cuda(cudaDeviceSynchronize(), "sync after cp_decode_step");
    rk.check_canaries();
    gpu_harness::check_canaries({&knew, &vnew});
    ASSERT_EQ(L.total(), N);
    SeqOut<S> got;
    got.o.resize(1, Hq * D);
    got.o_out.resize(1, Hq * D);
    got.lse.resize(1, Hq);
    got.lse_out.resize(1, Hq);
    check_cuda(cudaMemcpy(got.o.data(), last.o, qrow, cudaMemcpyDeviceToHost), "o");
    check_cuda(cudaMemcpy(got.lse.data(), last.lse, Hq * 4, cudaMemcpyDeviceToHost), "lse");
    check_cuda(cudaMemcpy(got.o_out.data(), last.o_out, qrow, cudaMemcpyDeviceToHost), "o_out");
    check_cuda(cudaMemcpy(got.lse_out.data(), last.lse_out, Hq * 4, cudaMemcpyDeviceToHost), "lse_out");
    SeqIn<S> in;
    in.q = all.q.middleRows(s, 1);
    in.q_out = all.q_out.middleRows(s, 1);
    in.k = all.k.topRows(N);
    in.v = all.v.topRows(N);
    const auto one = run_gpu1<S>(in, d, cfg);
    EXPECT_EQ(bitwise(got.o, one.o, "decode o (step " + std::to_string(s) + ")"), "");
    EXPECT_EQ(bitwise(got.lse, one.lse, "decode lse (step " + std::to_string(s) + ")"), "");
    if (R == 1 || (det && oc::cp_state_splits(cfg, L, 0, 1) > 0)) {
      EXPECT_EQ(bitwise(got.o_out, one.o_out, "decode o_out (R = 1 or deterministic state path)"), "");
      EXPECT_EQ(bitwise(got.lse_out, one.lse_out, "decode lse_out (R = 1 or deterministic state path)"), "");
    } else {  // merged: SPEC §6 against the float64 oracle (both criteria)
      AttentionOptions opt;
      opt.window = w;
      const auto ocheck = check_vs_oracle<S>(in, got, d, opt);
      EXPECT_TRUE(ocheck.pass) << "step " << s << ": " << ocheck.report;
    }
  }
  // The cache stayed sharded and grew on the last rank: its rows are the gathered cache's.
  Mat<S> k_last(L.length.back(), all.k.cols());
  check_cuda(cudaMemcpy(k_last.data(), static_cast<char*>(rk.b.back().kv.k) + rk.b.back().kv.halo_rows * kvrow,
                        k_last.size() * es, cudaMemcpyDeviceToHost),
             "download last shard");
  EXPECT_EQ(bitwise(k_last, Mat<S>(all.k.bottomRows(L.length.back())), "last shard after decode"), "");
}
TEST(GpuContextParallel, DecodeOverShardedCache) {
  ORTHROS_REQUIRE_GPU();
  decode_case<Eigen::bfloat16>({3000}, 128, false, 15001);
  decode_case<Eigen::bfloat16>({1200, 900, 40, 2000}, 128, false, 15002);
  decode_case<Eigen::bfloat16>({1024, 1024, 2048, 30}, 128, true, 15003);  // last shard shorter than w: halo
  decode_case<Eigen::bfloat16>({2048, 3072, 1100}, 128, true, 15005);      // deterministic state path: bitwise
  decode_case<float>({700, 5, 60, 9}, 128, false, 15004);                  // halo over three ranks
}

// ---- argument errors (no GPU needed: validated before any launch) -------------------------------
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const orthros::Error& e) {
    return e.what();
  }
  return "(no orthros::Error)";
}
#define EXPECT_ERROR_HAS(call, text) EXPECT_NE(error_of([&] { call; }).find(text), std::string::npos) << error_of([&] { call; })

TEST(GpuContextParallelArgs, BadLayoutsRanksWindows) {
  EXPECT_ERROR_HAS(oc::make_cp_layout({}, 10), "shard_lengths must name at least one rank");
  EXPECT_ERROR_HAS(oc::make_cp_layout({4, 0, 6}, 10), "shard_lengths[1] must be >= 1 (got 0)");
  EXPECT_ERROR_HAS(oc::make_cp_layout({4, 5}, 10), "shard_lengths sum to 9 but the sequence has 10");
  EXPECT_ERROR_HAS(oc::even_cp_layout(100, 4, 1024), "leaves a rank empty");
  const oc::CpLayout L = oc::make_cp_layout({4, 2, 6}, 12);
  EXPECT_ERROR_HAS(oc::cp_halo(L, 3, 4, false), "rank must be in [0, 3) (got 3)");
  EXPECT_ERROR_HAS(oc::cp_halo(L, 1, 0, false), "window must be >= 1 (got 0)");
  EXPECT_ERROR_HAS(oc::cp_rank_rows(L, 0, 13), "T (base queries of the call) must be in [0, N = 12] (got 13)");
  EXPECT_ERROR_HAS(oc::LoopbackTransport(0), "ranks must be >= 1 (got 0)");
  if (oc::cp_nccl_available())
    EXPECT_ERROR_HAS(oc::NcclTransport(2, 2, oc::CpNcclId{}), "rank must be in [0, 2) (got 2)");
  else
    EXPECT_ERROR_HAS(oc::NcclTransport(2, 0, oc::CpNcclId{}), "no NCCL transport");
}

TEST(GpuContextParallelArgs, StatePathSelection) {
  AttentionDims d{32, 8, 128};
  auto det = config_of(d, oc::DType::bf16, 128, true), fast = config_of(d, oc::DType::bf16, 128, false);
  const oc::CpLayout aligned = oc::make_cp_layout({2048, 3072, 1100}, 6220);
  EXPECT_EQ(oc::cp_state_splits(det, aligned, 0, 1), 2);  // the chunks of each shard
  EXPECT_EQ(oc::cp_state_splits(det, aligned, 1, 1), 3);
  EXPECT_EQ(oc::cp_state_splits(det, aligned, 2, 1), 2);
  EXPECT_EQ(oc::cp_state_splits(det, aligned, 0, 2), 0);  // T_out > 1: normalized path
  EXPECT_EQ(oc::cp_state_splits(det, oc::make_cp_layout({2000, 4220}, 6220), 0, 1), 0);  // off the chunk grid
  EXPECT_EQ(oc::cp_state_splits(det, oc::make_cp_layout({1024, 5196}, 6220), 1, 1), 0);  // a one-chunk shard
  EXPECT_EQ(oc::cp_state_splits(fast, oc::make_cp_layout({5, 6215}, 6220), 0, 1), 2);
  EXPECT_EQ(oc::cp_state_splits(fast, oc::make_cp_layout({6220}, 6220), 0, 1), 0);  // R = 1: identity merge
  EXPECT_EQ(oc::cp_states_bytes(det, 2048), size_t(32) * 2 * 130 * 4);
}

TEST(GpuContextParallelArgs, HaloRuleAndAlignment) {
  // The doc's example: shards {4, 2, 6}, w = 4: rank 2's halo is 3 rows from ranks 0 and 1 (then
  // aligned down to row 0 by the 64-row tile alignment, so all 6 rows before the shard).
  const oc::CpLayout L = oc::make_cp_layout({4, 2, 6}, 12);
  const oc::CpHalo h = oc::cp_halo(L, 2, 4, false);
  EXPECT_EQ(h.first_row, 0);
  EXPECT_EQ(h.rows, 6);
  ASSERT_EQ(h.pieces.size(), 2u);
  EXPECT_EQ(h.pieces[0].src_rank, 0);
  EXPECT_EQ(h.pieces[1].src_rank, 1);
  const oc::CpLayout big = oc::make_cp_layout({5000, 3000, 100, 1000}, 9100);
  const oc::CpHalo f = oc::cp_halo(big, 1, 128, false);  // start 5000: rows from 4873, aligned to 4864
  EXPECT_EQ(f.first_row, 4864);
  EXPECT_EQ(f.rows, 136);
  const oc::CpHalo dh = oc::cp_halo(big, 1, 128, true);  // deterministic: aligned to the chunk, 4096
  EXPECT_EQ(dh.first_row, 4096);
  EXPECT_EQ(dh.rows, 904);
  const oc::CpHalo m = oc::cp_halo(big, 3, 128, false);  // start 8100, shard 2 has 100 rows: two sources
  ASSERT_EQ(m.pieces.size(), 2u);
  EXPECT_EQ(m.pieces[0].src_rank, 1);
  EXPECT_EQ(m.pieces[1].src_rank, 2);
  EXPECT_EQ(oc::cp_halo(big, 0, 128, true).rows, 0);
}

TEST(GpuContextParallelArgs, DriverChecksBuffers) {
  AttentionDims d{4, 2, 64};
  const auto cfg = config_of(d, oc::DType::bf16, 8, false);
  const oc::CpLayout L = oc::make_cp_layout({100, 100}, 200);
  oc::LoopbackTransport tr3(3);
  std::vector<oc::CpRankBuffers> two(2);
  EXPECT_ERROR_HAS(oc::cp_attention(cfg, L, 200, 1, tr3, two), "the layout has 2 shards but the transport 3 ranks");
  oc::LoopbackTransport tr2(2);
  std::vector<oc::CpRankBuffers> one(1);
  EXPECT_ERROR_HAS(oc::cp_attention(cfg, L, 200, 1, tr2, one), "1 rank buffers for the transport's 2 local ranks");
  EXPECT_ERROR_HAS(oc::cp_attention(cfg, L, 201, 1, tr2, two), "T (base queries) must be in [0, N = 200] (got 201)");
  EXPECT_ERROR_HAS(oc::cp_attention(cfg, L, 10, 11, tr2, two), "T_out must be in [0, T] (got T_out = 11, T = 10)");
  two[0].kv.shard_capacity = two[1].kv.shard_capacity = 100;
  two[0].kv.k = two[0].kv.v = two[1].kv.k = two[1].kv.v = reinterpret_cast<void*>(256);  // never dereferenced
  two[0].q = two[1].q = two[0].o = two[1].o = reinterpret_cast<void*>(256);
  two[1].kv.halo_rows = 5;  // cp_halo says 36 (row 100 - 7 = 93, aligned down to 64)
  EXPECT_ERROR_HAS(oc::cp_attention(cfg, L, 200, 0, tr2, two), "kv.halo_rows must be cp_halo().rows");
  auto bad = cfg;
  bad.window = 0;
  EXPECT_ERROR_HAS(oc::cp_attention(bad, L, 200, 0, tr2, two), "window must be >= 1");
  oc::CpLayout L2 = L;
  std::vector<oc::CpRankBuffers> full(2);
  full[1].kv.halo_rows = oc::cp_halo(L, 1, 8, false).rows;
  full[1].kv.shard_capacity = 100;
  full[1].kv.k = full[1].kv.v = reinterpret_cast<void*>(256);
  EXPECT_ERROR_HAS(oc::cp_decode_step(cfg, L2, tr2, full, nullptr, nullptr), "the last rank's shard is full");
  EXPECT_ERROR_HAS(oc::cp_merge_partials(cfg, 0, 1, nullptr, nullptr, nullptr, nullptr), "R (ranks) must be >= 1 (got 0)");
}
