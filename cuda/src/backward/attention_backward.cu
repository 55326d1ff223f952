// Dispatch of the Orthros attention backward (SPEC §9): validation, the pre-pass, and the choice of
// the kernels per regime. The pre-pass is backward/delta_kernel.cuh; then
//   Hopper path (sm_90, bf16/f16, D = 64/128, cfg.kernel != generic): the KV-block-outer wgmma
//     dk/dv kernel (backward/attention_backward_hopper.cu), in the fast mode for long sequences
//     with dq folded in (a float32 accumulator in the workspace and a post-pass; use_fused_dq),
//     otherwise beside the query-outer wgmma dq kernel (backward/attention_backward_hopper_dq.cu);
//   generic path: bf16/f16 with D = 64/128 run the mma.sync kernels (backward/mma_dq_kernel.cuh,
//     backward/mma_dkdv_kernel.cuh), everything else the SIMT kernels (backward/simt_kernels.cuh).
#include "backward/attention_backward_hopper.hpp"
#include "backward/attention_backward_parts.hpp"
#include "backward/delta_kernel.cuh"
#include "backward/mma_dkdv_kernel.cuh"
#include "backward/mma_dq_kernel.cuh"
#include "backward/simt_kernels.cuh"
#include "common/side_stream.hpp"
#include "orthros/cuda/attention_backward.hpp"

#include <algorithm>
#include <cstdlib>
#include <optional>

namespace orthros::cuda {

namespace {
using namespace detail;

void validate_backward(const AttentionConfig& c, const BatchLayout& b) {
  validate_config(c);
  if (c.kernel == KernelPath::hopper)
    require(hopper_kernels_available(), "kernel = hopper needs a compute capability 9.0 GPU (H100/H200, sm_90a)");
  validate_batch(b);
  for (size_t i = 0; i < b.q_lens.size(); ++i)
    require(b.cache_lens[i] == b.q_lens[i], "attention_backward supports training sequences only (P = 0): cache_lens[",
            i, "] must equal q_lens[", i, "] (got cache_lens = ", b.cache_lens[i], ", q_lens = ", b.q_lens[i], ")");
}

bool use_mma(const AttentionConfig& c) { return c.dtype != DType::f32 && (c.head_dim == 64 || c.head_dim == 128); }

/// The Hopper kernels run this call (validate_backward has refused kernel = hopper without them).
bool use_hopper(const AttentionConfig& c) {
  return use_mma(c) && c.kernel != KernelPath::generic && hopper_kernels_available();
}

/// A kernel-choice switch from the environment (the tests' and the benchmark's): 1 or 0 when the
/// variable `name` starts with '1' or '0', -1 (the dispatch rule decides) otherwise.
int env_switch(const char* name) {
  const char* e = std::getenv(name);
  return e && (e[0] == '0' || e[0] == '1') ? e[0] - '0' : -1;
}

/// The longest output stream (T_out) of the call's sequences.
std::int64_t longest_out_rows(const BatchLayout& b) {
  std::int64_t longest = 0;
  for (auto t : b.out_lens) longest = std::max<std::int64_t>(longest, t);
  return longest;
}

/// Where the Hopper fast mode folds dq into the dk/dv kernel: calls with a sequence of at least
/// kFusedDqMinTokens tokens whose output stream covers at least a quarter of them, or with one of
/// at least kFusedDqMinOutTokens output rows. Measured on an H100 (bench/results/
/// 2026-12-06-bwd-dq.md, qwen3-8b shape, the whole backward, fused / two kernels): PT (T_out = T)
/// 8K 1.19x, 12K 1.02x, 16K 0.96x, 24K 0.95x, 32K 0.91x; SFT (T_out = T/4) 8K 1.00x, 12K 0.87x,
/// 16K 0.91x, 24K 0.85x, 32K 0.85x. At 12K the SFT gain outweighs the PT loss. Shorter output
/// streams were not measured at these lengths and keep the two kernels, which are bitwise
/// reproducible; the 24576-row rule is the earlier one (H200, 2026-12-03: PT 24K 0.95x, 32K 0.94x).
constexpr std::int64_t kFusedDqMinTokens = 12288, kFusedDqMinOutTokens = 24576;

/// The fused dq runs this call: Hopper path, fast mode, a sequence as above. ORTHROS_BWD_FUSED_DQ
/// = 1 / 0 forces it on / off for every Hopper fast-mode call (the tests' and the benchmark's
/// switch).
bool use_fused_dq(const AttentionConfig& c, const BatchLayout& b) {
  static const int forced = env_switch("ORTHROS_BWD_FUSED_DQ");
  if (!use_hopper(c) || c.deterministic || forced == 0) return false;
  if (forced == 1) return true;
  for (size_t i = 0; i < b.q_lens.size(); ++i) {
    const std::int64_t T = b.q_lens[i], T_out = b.out_lens[i];
    if ((T >= kFusedDqMinTokens && 4 * T_out >= T) || T_out >= kFusedDqMinOutTokens) return true;
  }
  return false;
}

/// Where the Hopper dk/dv kernel runs its pipelined consumer loop (the next row block's S^T and
/// dP^T issued while dK runs): D = 128, without the fused dq, when every sequence has fewer than
/// this many output rows. Measured (bench/results/2026-12-06-bwd-pipeline.md, qwen3-8b shape, two
/// kernels, pipelined / plain loop): H200, dk/dv kernel alone, PT 8K 0.97-0.98x, 16K 0.97-0.99x,
/// 32K 1.05x; whole backward SFT 8K and 32K (T_out 2K, 8K) 0.95-0.97x. At long causal streams the
/// CTAs of a head stop sharing the Q/dO row blocks in L2 (PT 32K: hit rate 82 -> 51 %, DRAM
/// reads 8 -> 35 GB on an H100, where PT 24K-32K still gained 3-4 %). The fused dq takes those
/// streams in the fast mode; the deterministic mode keeps the plain loop there.
constexpr std::int64_t kPipelinedMaxOutTokens = 24576;

/// The dk/dv kernel runs its pipelined loop in this call (fused_dq: the call folds dq into it).
/// ORTHROS_BWD_PIPE = 1 / 0 forces it on / off wherever it can run (D = 128, no fused dq): the
/// tests' and the benchmark's switch.
bool use_pipelined_dkdv(const AttentionConfig& c, const BatchLayout& b, bool fused_dq) {
  static const int forced = env_switch("ORTHROS_BWD_PIPE");
  if (!use_hopper(c) || c.head_dim != 128 || fused_dq || forced == 0) return false;
  if (forced == 1) return true;
  return longest_out_rows(b) < kPipelinedMaxOutTokens;
}

/// Whether the dq and dk/dv kernels of a two-kernel call run on two streams at once (the dk/dv
/// kernel on a SideStream, whose priority starts its CTAs first; the dq kernel on the caller's
/// stream): they read the same inputs and write different outputs, so the bits do not change,
/// and the dq kernel's shorter CTAs fill the SMs that the dk/dv kernel's last, partial wave
/// leaves idle. `ORTHROS_BWD_CONCURRENT=0` / `1` forces it.
bool use_concurrent_dq(bool run_dq, bool run_dkdv) {
  static const int forced = env_switch("ORTHROS_BWD_CONCURRENT");
  return run_dq && run_dkdv && forced != 0;
}

/// Bytes of the pre-pass's Δ and lse2 (float32 per row and head of both streams).
std::size_t prepass_bytes(const AttentionConfig& c, const BatchLayout& b) {
  return static_cast<std::size_t>(b.total_q() + b.total_out()) * c.num_q_heads * 2 * sizeof(float);
}
/// prepass_bytes rounded up to 256: where the dq accumulator starts.
std::size_t prepass_ws(const AttentionConfig& c, const BatchLayout& b) { return (prepass_bytes(c, b) + 255) / 256 * 256; }

/// Blocks of the fused dq accumulator's base stream; the output stream's follow (DqAccumulator).
long long dq_acc_base_blocks(const AttentionConfig& c, const BatchLayout& b) {
  return dq_acc_blocks(b.total_q(), c.num_q_heads / c.num_kv_heads, b.batch());
}

std::size_t dq_acc_ws(const AttentionConfig& c, const BatchLayout& b) {
  const int group = c.num_q_heads / c.num_kv_heads;
  const long long blocks = dq_acc_base_blocks(c, b) + dq_acc_blocks(b.total_out(), group, b.batch());
  return static_cast<std::size_t>(blocks) * c.num_kv_heads * kHopperBwdRows * c.head_dim * sizeof(float);
}

std::size_t backward_ws(const AttentionConfig& c, const BatchLayout& b) {
  return use_fused_dq(c, b) ? prepass_ws(c, b) + dq_acc_ws(c, b) : prepass_bytes(c, b);
}

// Which kernels run after the pre-pass: both (attention_backward) or one half
// (attention_backward_parts.hpp).
struct Parts {
  bool dq = true, dkdv = true;
};

/// The mma.sync kernels of one sequence group (dq: query-outer; dk/dv: KV-block-outer, 64 keys).
/// dk/dv on `kv_stream` (the same stream, or a SideStream), then dq on `stream`.
template <typename T, int D>
void launch_mma_bwd(const BwdParams& bp, bool dq, bool dkdv, dim3 grid_dq, dim3 grid_kv, cudaStream_t kv_stream,
                    cudaStream_t stream) {
  constexpr int dq_smem = static_cast<int>(sizeof(BwdDqSmem<T, D>));
  constexpr int kv_smem = static_cast<int>(sizeof(BwdKvSmem<T, D>));
  opt_in_shared_memory<mma_bwd_dq_kernel<T, D>>(dq_smem);
  opt_in_shared_memory<mma_bwd_dkdv_kernel<T, D>>(kv_smem);
  if (grid_kv.x > 0 && dkdv) {
    mma_bwd_dkdv_kernel<T, D><<<grid_kv, 128, kv_smem, kv_stream>>>(bp);
    ORTHROS_CUDA_LAUNCH_CHECK("mma_bwd_dkdv_kernel");
  }
  if (grid_dq.x > 0 && dq) {
    mma_bwd_dq_kernel<T, D><<<grid_dq, 128, dq_smem, stream>>>(bp);
    ORTHROS_CUDA_LAUNCH_CHECK("mma_bwd_dq_kernel");
  }
}

template <typename T>
void run_backward(const AttentionConfig& c, const BatchLayout& b, const AttentionBackwardBuffers& buf, const Parts& only,
                  float* ws, cudaStream_t stream) {
  const int group = c.num_q_heads / c.num_kv_heads, D = c.head_dim, Hq = c.num_q_heads;
  const double scale = c.scale ? *c.scale : 1.0 / std::sqrt(static_cast<double>(D));
  const std::int64_t tq = b.total_q(), to = b.total_out(), rows = tq + to;
  BwdParams bp{};
  KernelParams& kp = bp.f;
  kp.q = buf.q;
  kp.q_out = buf.q_out;
  kp.k = buf.k_cache;
  kp.v = buf.v_cache;
  kp.o = const_cast<void*>(buf.o);  // read only
  kp.o_out = const_cast<void*>(buf.o_out);
  kp.lse = const_cast<float*>(buf.lse);
  kp.lse_out = const_cast<float*>(buf.lse_out);
  kp.window = c.window;
  kp.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  kp.Hq = Hq;
  kp.Hkv = c.num_kv_heads;
  set_group(kp, group);
  kp.D = D;
  set_nsplit(kp, 1);
  kp.chunk_tiles = kDeterministicChunk / kBwdBN;
  bp.dO = buf.d_o;
  bp.dO_out = buf.d_o_out;
  bp.dq = buf.dq;
  bp.dq_out = buf.dq_out;
  bp.dk = buf.dk;
  bp.dv = buf.dv;
  bp.delta = ws;
  bp.lse2 = ws + rows * Hq;
  bp.total_q = tq;
  bp.scale = static_cast<float>(scale);
  bp.group_div = FastDiv::of(group);

  // 1. pre-pass over both streams: 8 (row, head) warps per 256-thread block.
  {
    const long long blocks = (rows * Hq + 7) / 8;
    require(blocks < (1LL << 31), "internal: too many rows for the pre-pass grid (", rows, ")");
    delta_kernel<T><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
        static_cast<const T*>(buf.o), static_cast<const T*>(buf.o_out), static_cast<const T*>(buf.d_o),
        static_cast<const T*>(buf.d_o_out), buf.lse, buf.lse_out, bp.delta, bp.lse2, tq, rows, Hq, D);
    ORTHROS_CUDA_LAUNCH_CHECK("delta_kernel");
  }
  const bool mma = use_mma(c), hopper = use_hopper(c);
  // Fused dq (Hopper fast mode, both halves asked for): the accumulator is zeroed here, filled by
  // the dk/dv kernel and turned into dq / dq_out by the post-pass of each sequence group.
  const bool fused_dq = use_fused_dq(c, b) && only.dq && only.dkdv;
  DqAccumulator acc;
  if (fused_dq) {
    acc.acc = reinterpret_cast<float*>(reinterpret_cast<char*>(ws) + prepass_ws(c, b));
    acc.out_block0 = dq_acc_base_blocks(c, b);
    ORTHROS_CUDA_CHECK(cudaMemsetAsync(acc.acc, 0, dq_acc_ws(c, b), stream));
  }
  const bool run_dq = only.dq && !fused_dq, run_dkdv = only.dkdv;
  const bool pipelined = use_pipelined_dkdv(c, b, fused_dq);
  // The dk/dv kernel beside the dq kernel (joined before the caller's stream goes on).
  std::optional<SideStream> side;
  if (use_concurrent_dq(run_dq, run_dkdv)) side.emplace(stream);
  const cudaStream_t kv_stream = side ? side->get() : stream;
  const int bm = mma ? kBwdDqBM : kSimtBwdWarps;
  const int bn_kv = hopper ? kHopperBwdKeys : mma ? kBwdBN : kSimtBwdWarps;  // keys per dk/dv CTA
  int q_off = 0, out_off = 0;
  const std::int64_t kv_stride = buf.capacity * c.num_kv_heads * D;
  for (int s0 = 0; s0 < b.batch(); s0 += kMaxSeqPerLaunch) {
    const int ns = fill_seq_group(b, s0, kv_stride, kp.seq, q_off, out_off);
    kp.nseq = ns;
    int max_out_blocks = 0, max_base_blocks = 0, max_kv_blocks = 0;
    for (int j = 0; j < ns; ++j) {
      const SeqDesc& d = kp.seq[j];
      max_out_blocks = std::max(max_out_blocks, (d.T_out * group + bm - 1) / bm);
      max_base_blocks = std::max(max_base_blocks, (d.T * group + bm - 1) / bm);
      max_kv_blocks = std::max(max_kv_blocks, static_cast<int>((d.cache_len + bn_kv - 1) / bn_kv));
    }
    kp.max_out_blocks = max_out_blocks;
    const long long gx = static_cast<long long>(max_out_blocks) + max_base_blocks;
    require(gx < (1LL << 31), "internal: grid too large (", gx, " blocks)");
    // Grids are 1-D per sequence with the KV head fastest (blockIdx.x = block * H_kv + head): the
    // longest row blocks / key blocks of EVERY head are dispatched first (with the head as gridDim.y
    // the last head's longest blocks started last and ran alone at the end).
    const long long gxq = gx * c.num_kv_heads, gxk = static_cast<long long>(max_kv_blocks) * c.num_kv_heads;
    require(gxq < (1LL << 31) && gxk < (1LL << 31), "internal: grid too large (", gxq, " blocks)");
    const dim3 grid_dq(static_cast<unsigned>(gxq), 1, ns);
    const dim3 grid_kv(static_cast<unsigned>(gxk), 1, ns);
    if (!mma) {
      if (max_kv_blocks > 0 && run_dkdv) {
        simt_bwd_dkdv_kernel<T><<<grid_kv, kSimtBwdWarps * 32, 0, kv_stream>>>(bp);
        ORTHROS_CUDA_LAUNCH_CHECK("simt_bwd_dkdv_kernel");
      }
      if (gx > 0 && run_dq) {
        simt_bwd_dq_kernel<T><<<grid_dq, kSimtBwdWarps * 32, 0, stream>>>(bp);
        ORTHROS_CUDA_LAUNCH_CHECK("simt_bwd_dq_kernel");
      }
      continue;
    }
    if constexpr (!std::is_same_v<T, float>) {
      require(D == 64 || D == 128, "internal: no tensor-core backward kernel for D = ", D);
      if (hopper) {
        const HopperGeometry geo{static_cast<long long>(b.batch()) * buf.capacity, tq, to};
        static_assert(kBwdDqBM == kHopperBwdRows, "the post-pass grid counts the blocks of the accumulator");
        acc.seq0 = s0;
        if (run_dkdv && max_kv_blocks > 0)
          launch_hopper_backward(c.dtype, bp, geo, grid_kv, fused_dq ? acc : DqAccumulator{}, pipelined, kv_stream);
        if (run_dq) {
          // The dq kernel's work items count row blocks of kHopperDqBlockRows rows.
          constexpr int hbm = kHopperDqBlockRows;
          int out_h = 0, base_h = 0;
          for (int j = 0; j < ns; ++j) {
            out_h = std::max(out_h, (kp.seq[j].T_out * group + hbm - 1) / hbm);
            base_h = std::max(base_h, (kp.seq[j].T * group + hbm - 1) / hbm);
          }
          BwdParams bq = bp;
          bq.f.max_out_blocks = out_h;
          const long long items = (static_cast<long long>(out_h) + base_h) * c.num_kv_heads;
          require(items < (1LL << 31), "internal: grid too large (", items, " blocks)");
          launch_hopper_backward_dq(c.dtype, bq, geo, dim3(static_cast<unsigned>(items), 1, ns), stream);
        }
        if (fused_dq && gx > 0)
          launch_hopper_dq_convert(c.dtype, bp, acc, max_base_blocks,
                                   dim3(static_cast<unsigned>(gx), static_cast<unsigned>(c.num_kv_heads), ns), stream);
      } else if (D == 64) {
        launch_mma_bwd<T, 64>(bp, run_dq, run_dkdv, grid_dq, grid_kv, kv_stream, stream);
      } else {
        launch_mma_bwd<T, 128>(bp, run_dq, run_dkdv, grid_dq, grid_kv, kv_stream, stream);
      }
    }
  }
  if (side) side->join();
}

void backward(const AttentionConfig& c, const BatchLayout& b, const AttentionBackwardBuffers& buf, const Parts& only,
              cudaStream_t stream) {
  validate_backward(c, b);
  std::int64_t max_cache = 0;
  for (auto x : b.cache_lens) max_cache = std::max(max_cache, x);
  require(buf.capacity >= max_cache, "capacity (cache rows per sequence) must be >= max cache_lens = ", max_cache,
          " (got ", buf.capacity, ")");
  const std::int64_t tq = b.total_q(), to = b.total_out();
  if (tq > 0) {
    for (auto [ptr, name] : {std::pair<const void*, const char*>{buf.q, "q"}, {buf.k_cache, "k_cache"},
                             {buf.v_cache, "v_cache"}, {buf.o, "o"}, {buf.lse, "lse"}, {buf.d_o, "d_o"},
                             {buf.dq, "dq"}, {buf.dk, "dk"}, {buf.dv, "dv"}})
      require(ptr != nullptr, name, " must not be null (", tq, " base queries)");
  }
  if (to > 0) {
    for (auto [ptr, name] : {std::pair<const void*, const char*>{buf.q_out, "q_out"}, {buf.o_out, "o_out"},
                             {buf.lse_out, "lse_out"}, {buf.d_o_out, "d_o_out"}, {buf.dq_out, "dq_out"}})
      require(ptr != nullptr, name, " must not be null (", to, " output queries)");
  }
  for (auto [ptr, name] : {std::pair<const void*, const char*>{buf.q, "q"}, {buf.q_out, "q_out"},
                           {buf.k_cache, "k_cache"}, {buf.v_cache, "v_cache"}, {buf.o, "o"}, {buf.o_out, "o_out"},
                           {buf.lse, "lse"}, {buf.lse_out, "lse_out"}, {buf.d_o, "d_o"}, {buf.d_o_out, "d_o_out"},
                           {buf.dq, "dq"}, {buf.dq_out, "dq_out"}, {buf.dk, "dk"}, {buf.dv, "dv"}})
    require(aligned16(ptr), name, " must be 16-byte aligned (got ", ptr, ")");
  if (tq == 0) return;
  const std::size_t need = backward_ws(c, b);
  float* ws = nullptr;
  bool owned = false;
  if (buf.workspace) {
    require(buf.workspace_bytes >= need, "workspace_bytes must be >= ", need, " for this call (got ",
            buf.workspace_bytes, ")");
    require(aligned16(buf.workspace), "workspace must be 16-byte aligned");
    ws = static_cast<float*>(buf.workspace);
  } else {
    ORTHROS_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&ws), need, stream));
    owned = true;
  }
  try {
    switch (c.dtype) {
      case DType::f32: run_backward<float>(c, b, buf, only, ws, stream); break;
      case DType::f16: run_backward<__half>(c, b, buf, only, ws, stream); break;
      case DType::bf16: run_backward<__nv_bfloat16>(c, b, buf, only, ws, stream); break;
    }
  } catch (...) {
    if (owned) {
      cudaFreeAsync(ws, stream);
      cudaGetLastError();  // the exception in flight reports the failure; keep the error slot clean
    }
    throw;
  }
  if (owned) ORTHROS_CUDA_CHECK(cudaFreeAsync(ws, stream));
}

}  // namespace

std::size_t attention_backward_workspace_bytes(const AttentionConfig& cfg, const BatchLayout& batch) {
  validate_backward(cfg, batch);
  return backward_ws(cfg, batch);
}

bool attention_backward_is_reproducible(const AttentionConfig& cfg, const BatchLayout& batch) {
  validate_backward(cfg, batch);
  return !use_fused_dq(cfg, batch);
}

void attention_backward(const AttentionConfig& c, const BatchLayout& b, const AttentionBackwardBuffers& buf,
                        cudaStream_t stream) {
  backward(c, b, buf, Parts{}, stream);
}

void detail::attention_backward_dq_only(const AttentionConfig& c, const BatchLayout& b,
                                        const AttentionBackwardBuffers& buf, cudaStream_t stream) {
  backward(c, b, buf, Parts{true, false}, stream);
}

void detail::attention_backward_dkdv_only(const AttentionConfig& c, const BatchLayout& b,
                                          const AttentionBackwardBuffers& buf, cudaStream_t stream) {
  backward(c, b, buf, Parts{false, true}, stream);
}

}  // namespace orthros::cuda
