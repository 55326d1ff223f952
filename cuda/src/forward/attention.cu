// Dispatch of the Orthros attention forward: validation, and the one place (make_plan) that maps
// a call's regime to its kernel: bf16/f16 with D = 64/128 on an sm_90a device with > 16 rows per
// sequence run the wgmma kernel (forward/attention_hopper.cu), other bf16/f16 D = 64/128 calls the
// mma.sync kernel (forward/mma_kernel.cuh), f32 and other head dims the SIMT kernel
// (forward/simt_kernel.cuh); an output stream split over the KV is merged by
// forward/split_merge_kernel.cuh. Tile sizes: common/tile_config.cuh.
#include "forward/attention_hopper.hpp"
#include "forward/mma_kernel.cuh"
#include "forward/simt_kernel.cuh"
#include "forward/split_merge_kernel.cuh"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>

namespace orthros::cuda {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "?";
}
int dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }

std::int64_t BatchLayout::total_q() const {
  std::int64_t s = 0;
  for (int x : q_lens) s += x;
  return s;
}
std::int64_t BatchLayout::total_out() const {
  std::int64_t s = 0;
  for (int x : out_lens) s += x;
  return s;
}

int device_sm_count() {
  static detail::PerDeviceSetting sms;
  return sms.get([] {
    int dev = 0, n = 0;
    ORTHROS_CUDA_CHECK(cudaGetDevice(&dev));
    ORTHROS_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  });
}

bool hopper_kernels_available() {
  // No usable device (no GPU, no driver, a driver too old for the runtime): the Hopper kernel
  // does not apply. Asked first, without the throwing check, and the runtime's error cleared.
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return false;
  }
  try {
    return detail::hopper_kernel_available();
  } catch (const CudaError&) {  // the device is present but unusable
    (void)cudaGetLastError();    // leave no error behind for the caller's next CUDA call
    return false;
  }
}

namespace detail {
void validate_config(const AttentionConfig& c) {
  require(c.num_q_heads >= 1, "num_q_heads (H_q) must be >= 1 (got ", c.num_q_heads, ")");
  require(c.num_kv_heads >= 1, "num_kv_heads (H_kv) must be >= 1 (got ", c.num_kv_heads, ")");
  require(c.num_q_heads % c.num_kv_heads == 0, "H_q % H_kv must be 0 for grouped-query attention (got H_q=",
          c.num_q_heads, ", H_kv=", c.num_kv_heads, ")");
  require(c.head_dim >= 16 && c.head_dim <= 256 && c.head_dim % 16 == 0,
          "head_dim (D) must be a multiple of 16 in [16, 256] for the CUDA kernels (got ", c.head_dim, ")");
  require(c.window >= 1, "window must be >= 1 (got ", c.window, "); w = 1 means a token sees only itself");
  if (c.scale) require(std::isfinite(*c.scale), "scale must be finite (got ", *c.scale, ")");
  require(c.num_splits >= 0, "num_splits must be >= 0 (0 = automatic; got ", c.num_splits, ")");
  if (c.kernel == KernelPath::hopper)
    require(c.dtype != DType::f32 && (c.head_dim == 64 || c.head_dim == 128),
            "kernel = hopper needs dtype bf16/f16 and head_dim 64 or 128 (got ", dtype_name(c.dtype), ", D = ",
            c.head_dim, ")");
}

void validate_batch(const BatchLayout& b) {
  require(b.out_lens.size() == b.q_lens.size() && b.cache_lens.size() == b.q_lens.size(),
          "batch layout vectors must have one entry per sequence (q_lens: ", b.q_lens.size(),
          ", out_lens: ", b.out_lens.size(), ", cache_lens: ", b.cache_lens.size(), ")");
  for (size_t i = 0; i < b.q_lens.size(); ++i) {
    require(b.q_lens[i] >= 0, "q_lens[", i, "] (T) must be >= 0 (got ", b.q_lens[i], ")");
    require(b.out_lens[i] >= 0 && b.out_lens[i] <= b.q_lens[i], "out_lens[", i,
            "] (T_out) must be in [0, T] (got T_out = ", b.out_lens[i], ", T = ", b.q_lens[i], ")");
    require(b.cache_lens[i] >= b.q_lens[i], "cache_lens[", i, "] (P+T) must be >= T (got ", b.cache_lens[i],
            ", T = ", b.q_lens[i], "); append this call's keys/values to the cache first");
    require(b.cache_lens[i] < (std::int64_t(1) << 30), "cache_lens[", i, "] must be < 2^30 (got ", b.cache_lens[i],
            ")");
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }
}  // namespace detail

namespace {
using namespace detail;


struct Plan {
  bool hopper;  // warp-specialized wgmma kernel (attention_hopper.cu); nw = consumer warpgroups
  bool mma;
  int nw;       // warps per CTA (mma kernel)
  int bm, bn;   // rows per CTA, keys per tile
  int nsplit;   // output-stream splits
  bool split_chunked;
  int chunk_tiles;
  int band;  // Hopper kernel: the work items' band width, 0 = its default (hopper_item_band)
};

/// The Hopper kernel's item order (launch_hopper_forward's `band`): 0, the kernel's default, unless
/// ORTHROS_FWD_BAND=n (>= 0) forces n (tests and measurements; 1 = KV head fastest).
/// \throws orthros::Error on another value of ORTHROS_FWD_BAND.
int hopper_item_band() {
  static const int forced = [] {
    const char* e = std::getenv("ORTHROS_FWD_BAND");
    if (!e || !*e) return 0;
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    require(*end == '\0' && v >= 0 && v < (1L << 30), "ORTHROS_FWD_BAND must be an integer in [0, 2^30), got '", e,
            "'");
    return static_cast<int>(v);
  }();
  return forced;
}

Plan make_plan(const AttentionConfig& c, const BatchLayout& b) {
  Plan p{};
  const int group = c.num_q_heads / c.num_kv_heads;
  p.mma = c.dtype != DType::f32 && (c.head_dim == 64 || c.head_dim == 128);
  int max_tok = 0;
  std::int64_t max_cache = 0;
  for (int i = 0; i < b.batch(); ++i) {
    max_tok = std::max({max_tok, b.q_lens[i], b.out_lens[i]});
    max_cache = std::max(max_cache, b.cache_lens[i]);
  }
  if (c.kernel == KernelPath::hopper)
    require(hopper_kernel_available(), "kernel = hopper needs a compute capability 9.0 GPU (H100/H200, sm_90a)");
  p.hopper = p.mma && c.kernel != KernelPath::generic && hopper_kernel_available();
  // Launches whose sequences have <= 16 rows (decode) stay on the 1-warp mma.sync kernel under
  // automatic: memory-bound, it keeps more loads in flight (3 small CTAs per SM) than a
  // 64-row warpgroup tile. Both families give the same bits per row.
  if (p.hopper && c.kernel == KernelPath::automatic && std::int64_t(max_tok) * group <= 16) p.hopper = false;
  if (p.hopper) {
    p.nw = kHopperConsumers;  // consumer warpgroups (attention_hopper.cu)
    p.bm = hopper_block_rows(p.nw);
    p.bn = kKeyTile;
  } else if (p.mma) {
    p.nw = (std::int64_t(max_tok) * group <= 16) ? kMmaDecodeWarps : kMmaWarps;
    p.bm = 16 * p.nw * ((p.nw == kMmaWarps && !c.deterministic) ? kMmaTilesFast : kMmaTilesDet);  // launch_mma_variant
    p.bn = kKeyTile;
  } else {
    p.nw = kSimtWarps;
    p.bm = kSimtWarps;
    p.bn = kSimtBN;
  }
  p.chunk_tiles = kDeterministicChunk / p.bn;
  p.band = p.hopper ? hopper_item_band() : 0;
  std::int64_t out_ctas = 0;
  for (int i = 0; i < b.batch(); ++i)
    out_ctas += (std::int64_t(b.out_lens[i]) * group + p.bm - 1) / p.bm * c.num_kv_heads;
  const int max_tiles = static_cast<int>((max_cache + p.bn - 1) / p.bn);
  p.nsplit = 1;
  p.split_chunked = false;
  if (out_ctas == 0) return p;
  const int sms = device_sm_count();
  // Split when the output stream alone would not give every SM several CTAs (decode, prefill).
  const bool want_split = out_ctas < 4 * std::int64_t(sms) && max_tiles >= 8;
  if (c.deterministic) {
    if (want_split) {
      p.split_chunked = true;
      p.nsplit = static_cast<int>((max_cache + kDeterministicChunk - 1) / kDeterministicChunk);
      if (p.nsplit <= 1) {
        p.nsplit = 1;
        p.split_chunked = false;
      }
    }
  } else if (c.num_splits > 0) {
    p.nsplit = c.num_splits;
  } else if (want_split) {
    // Enough CTAs for 4 per SM, and splits of at most 16 tiles (1024 keys): many short CTAs keep
    // more K/V loads in flight than a few long ones (bench/results/).
    const std::int64_t target =
        std::max<std::int64_t>((4 * std::int64_t(sms) + out_ctas - 1) / out_ctas, (max_tiles + 15) / 16);
    p.nsplit = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(target, max_tiles / 4)));
  }
  return p;
}

std::size_t workspace_for(const AttentionConfig& c, const BatchLayout& b, const Plan& p) {
  if (p.nsplit <= 1) return 0;
  return static_cast<std::size_t>(b.total_out()) * c.num_q_heads * p.nsplit * (c.head_dim + 2) * sizeof(float);
}

// Internal workspace per device (used when the caller passes none).
void* internal_workspace(std::size_t bytes) {
  static std::mutex mu;
  static std::map<int, std::pair<void*, std::size_t>> bufs;
  int dev = 0;
  ORTHROS_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  auto& e = bufs[dev];
  if (e.second < bytes) {
    if (e.first) ORTHROS_CUDA_CHECK(cudaFree(e.first));
    e.first = nullptr;
    e.second = 0;
    ORTHROS_CUDA_CHECK(cudaMalloc(&e.first, bytes));
    e.second = bytes;
  }
  return e.first;
}

template <typename T, int D, int NW, int MT, int ST, bool DET>
void launch_mma(const KernelParams& kp, dim3 grid, cudaStream_t stream) {
  constexpr int smem = static_cast<int>(sizeof(MmaFwdSmem<T, D, NW * 16 * MT, ST>));
  opt_in_shared_memory<mma_attn_kernel<T, D, NW, MT, ST, DET>>(smem);
  mma_attn_kernel<T, D, NW, MT, ST, DET><<<grid, NW * 32, smem, stream>>>(kp);
  ORTHROS_CUDA_LAUNCH_CHECK("mma_attn_kernel");
}

// Tensor-core variants (common/tile_config.cuh gives the reasons): decode-like launches (<= 16
// rows per sequence) use kMmaDecodeWarps warps; otherwise kMmaWarps warps with kMmaTilesFast m16
// tiles per warp in the fast mode, kMmaTilesDet in the deterministic mode. Per-row arithmetic is
// identical in all of them.
template <typename T, int D>
void launch_mma_variant(const Plan& pl, bool det, const KernelParams& kp, dim3 grid, cudaStream_t stream) {
  if (pl.nw == kMmaDecodeWarps) {
    if (det)
      launch_mma<T, D, kMmaDecodeWarps, 1, kMmaStages, true>(kp, grid, stream);
    else
      launch_mma<T, D, kMmaDecodeWarps, 1, kMmaStages, false>(kp, grid, stream);
  } else if (det) {
    launch_mma<T, D, kMmaWarps, kMmaTilesDet, kMmaStages, true>(kp, grid, stream);
  } else {
    launch_mma<T, D, kMmaWarps, kMmaTilesFast, kMmaStages, false>(kp, grid, stream);
  }
}

template <typename T>
void launch_main(const Plan& pl, bool det, int D, const KernelParams& kp, dim3 grid, cudaStream_t stream) {
  if (!pl.mma) {
    if (det)
      simt_attn_kernel<T, true><<<grid, kSimtWarps * 32, 0, stream>>>(kp);
    else
      simt_attn_kernel<T, false><<<grid, kSimtWarps * 32, 0, stream>>>(kp);
    ORTHROS_CUDA_LAUNCH_CHECK("simt_attn_kernel");
    return;
  }
  if constexpr (!std::is_same_v<T, float>) {
    if (D == 64) return launch_mma_variant<T, 64>(pl, det, kp, grid, stream);
    if (D == 128) return launch_mma_variant<T, 128>(pl, det, kp, grid, stream);
  }
  throw Error("internal: no tensor-core kernel for this configuration");
}

template <typename T>
void launch_merge(const KernelParams& kp, long long rows, cudaStream_t stream) {
  if (rows == 0) return;
  require(rows < (1LL << 31), "internal: too many output rows for the merge grid (", rows, ")");
  merge_kernel<T><<<static_cast<unsigned>(rows), kp.D, 0, stream>>>(kp.partial, static_cast<T*>(kp.o_out),
                                                                     kp.lse_out, rows, kp.nsplit, kp.D);
  ORTHROS_CUDA_LAUNCH_CHECK("merge_kernel");
}

template <typename T>
void run(const AttentionConfig& c, const BatchLayout& b, const AttentionBuffers& buf, const Plan& pl, float* ws,
         cudaStream_t stream) {
  const int group = c.num_q_heads / c.num_kv_heads, D = c.head_dim;
  const double scale = c.scale ? *c.scale : 1.0 / std::sqrt(static_cast<double>(D));
  KernelParams kp{};
  kp.q = buf.q;
  kp.q_out = buf.q_out;
  kp.k = buf.k_cache;
  kp.v = buf.v_cache;
  kp.o = buf.o;
  kp.o_out = buf.o_out;
  kp.o_out_f32 = buf.o_out_float32 ? 1 : 0;
  kp.lse = buf.lse;
  kp.lse_out = buf.lse_out;
  kp.partial = ws;
  kp.window = c.window;
  kp.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  kp.Hq = c.num_q_heads;
  kp.Hkv = c.num_kv_heads;
  set_group(kp, group);
  kp.D = D;
  set_nsplit(kp, pl.nsplit);
  kp.split_chunked = pl.split_chunked ? 1 : 0;
  kp.chunk_tiles = pl.chunk_tiles;
  int q_off = 0, out_off = 0;
  const std::int64_t kv_stride = buf.capacity * c.num_kv_heads * D;
  for (int s0 = 0; s0 < b.batch(); s0 += kMaxSeqPerLaunch) {
    const int ns = fill_seq_group(b, s0, kv_stride, kp.seq, q_off, out_off);
    kp.nseq = ns;
    int max_out_blocks = 0, max_base_blocks = 0;
    for (int j = 0; j < ns; ++j) {
      const SeqDesc& d = kp.seq[j];
      max_out_blocks = std::max(max_out_blocks, (d.T_out * group + pl.bm - 1) / pl.bm);
      max_base_blocks = std::max(max_base_blocks, (d.T * group + pl.bm - 1) / pl.bm);
    }
    kp.max_out_blocks = max_out_blocks;
    const long long gx = static_cast<long long>(max_out_blocks) * pl.nsplit + max_base_blocks;
    if (gx == 0) continue;
    require(gx < (1LL << 31), "internal: grid too large (", gx, " blocks)");
    if (pl.hopper)
      launch_hopper_forward(c.dtype, D, pl.nw, c.deterministic, kp,
                            HopperGeometry{b.batch() * buf.capacity, b.total_q(), b.total_out()}, gx, pl.band,
                            stream);
    else
      launch_main<T>(pl, c.deterministic, D, kp, dim3(static_cast<unsigned>(gx), c.num_kv_heads, ns), stream);
  }
  if (pl.nsplit > 1) {
    if (kp.o_out_f32)
      launch_merge<float>(kp, b.total_out() * c.num_q_heads, stream);
    else
      launch_merge<T>(kp, b.total_out() * c.num_q_heads, stream);
  }
}

}  // namespace

std::size_t attention_workspace_bytes(const AttentionConfig& cfg, const BatchLayout& batch) {
  validate_config(cfg);
  validate_batch(batch);
  return workspace_for(cfg, batch, make_plan(cfg, batch));
}

void attention_forward(const AttentionConfig& c, const BatchLayout& b, const AttentionBuffers& buf,
                       cudaStream_t stream) {
  validate_config(c);
  validate_batch(b);
  std::int64_t max_cache = 0;
  for (auto x : b.cache_lens) max_cache = std::max(max_cache, x);
  require(buf.capacity >= max_cache, "capacity (cache rows per sequence) must be >= max cache_lens = ", max_cache,
          " (got ", buf.capacity, ")");
  const std::int64_t tq = b.total_q(), to = b.total_out();
  if (tq > 0) {
    require(buf.q != nullptr, "q must not be null (", tq, " base queries)");
    require(buf.o != nullptr, "o must not be null (", tq, " base queries)");
    require(buf.k_cache != nullptr && buf.v_cache != nullptr, "k_cache/v_cache must not be null");
  }
  if (to > 0) {
    require(buf.q_out != nullptr, "q_out must not be null (", to, " output queries)");
    require(buf.o_out != nullptr, "o_out must not be null (", to, " output queries)");
  }
  for (auto [ptr, name] : {std::pair<const void*, const char*>{buf.q, "q"}, {buf.q_out, "q_out"},
                           {buf.k_cache, "k_cache"}, {buf.v_cache, "v_cache"}, {buf.o, "o"}, {buf.o_out, "o_out"}})
    require(aligned16(ptr), name, " must be 16-byte aligned (got ", ptr, ")");
  if (tq == 0) return;
  const Plan pl = make_plan(c, b);
  const std::size_t need = workspace_for(c, b, pl);
  float* ws = nullptr;
  if (need > 0) {
    if (buf.workspace) {
      require(buf.workspace_bytes >= need, "workspace_bytes must be >= ", need, " for this call (got ",
              buf.workspace_bytes, ")");
      require(aligned16(buf.workspace), "workspace must be 16-byte aligned");
      ws = static_cast<float*>(buf.workspace);
    } else {
      ws = static_cast<float*>(internal_workspace(need));
    }
  }
  switch (c.dtype) {
    case DType::f32: run<float>(c, b, buf, pl, ws, stream); break;
    case DType::f16: run<__half>(c, b, buf, pl, ws, stream); break;
    case DType::bf16: run<__nv_bfloat16>(c, b, buf, pl, ws, stream); break;
  }
}

}  // namespace orthros::cuda
