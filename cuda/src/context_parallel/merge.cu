// Context parallelism's merges (docs/context_parallel.md): the per-rank (o, lse) partials of the
// output stream merged in rank order, and the state path's split states merged as one chain.
// Both merges are common/lse_merge.cuh.
#include "context_parallel/internal.hpp"
#include "common/lse_merge.cuh"

#include <algorithm>

namespace orthros::cuda {

namespace {
using detail::Elem;
using namespace cp_detail;

__global__ void fill_lse_empty_kernel(float* lse, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    lse[i] = detail::kNegInf;
}

// One block per (output row, query head), one thread per dim d: PairMerge over the R ranks.
template <typename T>
__global__ void cp_merge_kernel(const float* __restrict__ o_parts, const float* __restrict__ lse_parts,
                                T* __restrict__ o_out, float* __restrict__ lse_out, int R, long long rows, int D) {
  const long long row = blockIdx.x;  // output row * H_q + head
  const int d = threadIdx.x;
  if (row >= rows || d >= D) return;
  const auto lse_r = [&](int r) { return lse_parts[(size_t)r * rows + row]; };
  const auto o_r = [&](int r) { return o_parts[((size_t)r * rows + row) * D + d]; };
  const detail::PairMerge pm(R, lse_r);
  o_out[(size_t)row * D + d] = Elem<T>::from_f(pm.output(R, o_r, lse_r));
  if (d == 0 && lse_out) lse_out[row] = pm.lse();
}

template <typename T>
void launch_merge(int R, long long rows, int D, const float* o_parts, const float* lse_parts, void* o_out,
                  float* lse_out, cudaStream_t s) {
  if (rows == 0) return;
  require(rows < (1LL << 31), "cp_merge_partials: too many output rows x heads (", rows, ")");
  cp_merge_kernel<T><<<static_cast<unsigned>(rows), D, 0, s>>>(o_parts, lse_parts,
                                                                  static_cast<T*>(o_out), lse_out, R, rows, D);
  ORTHROS_CUDA_LAUNCH_CHECK("cp_merge_kernel");
}

// The split-KV merge's StateChain over the splits of all ranks in rank order, so that a
// deterministic run whose splits are the single GPU's chunks gives its bits.
template <typename T>
__global__ void cp_merge_states_kernel(const float* __restrict__ states, T* __restrict__ o_out,
                                       float* __restrict__ lse_out, const __grid_constant__ StateTable tab, int D) {
  const int head = blockIdx.x, d = threadIdx.x;
  detail::StateChain chain;
  for (int r = 0; r < tab.R; ++r) {
    const float* base = states + tab.off[r] + (size_t)head * tab.ns[r] * (D + 2);
    for (int sp = 0; sp < tab.ns[r]; ++sp) {
      const float* st = base + (size_t)sp * (D + 2);
      chain.add(st[0], st[1], st[2 + d]);
    }
  }
  o_out[(size_t)head * D + d] = chain.output<T>();
  if (d == 0 && lse_out) lse_out[head] = chain.lse();
}

}  // namespace

namespace cp_detail {

int splits_for(const AttentionConfig& c, std::int64_t rows) {
  const std::int64_t chunks = (std::max<std::int64_t>(rows, 1) + kDeterministicChunk - 1) / kDeterministicChunk;
  if (c.deterministic) return static_cast<int>(chunks);
  return static_cast<int>(std::clamp<std::int64_t>(chunks, 2, 64));
}
std::size_t state_bytes(const AttentionConfig& c, int splits) {
  return static_cast<std::size_t>(c.num_q_heads) * splits * (c.head_dim + 2) * sizeof(float);
}

StateTable state_table(const AttentionConfig& c, const CpLayout& l) {
  StateTable t{};
  t.R = l.ranks();
  long long off = 0;
  for (int r = 0; r < t.R; ++r) {
    t.ns[r] = splits_for(c, l.length[r]);
    t.off[r] = off;
    off += static_cast<long long>(c.num_q_heads) * t.ns[r] * (c.head_dim + 2);
  }
  return t;
}


void fill_lse_empty(float* lse, long long n, cudaStream_t stream) {
  fill_lse_empty_kernel<<<static_cast<unsigned>(std::min<long long>((n + 255) / 256, 1024)), 256, 0, stream>>>(lse, n);
  ORTHROS_CUDA_LAUNCH_CHECK("fill_lse_empty_kernel");
}

void merge_states(const AttentionConfig& cfg, const StateTable& tab, const float* states_all, void* o_out,
                  float* lse_out, cudaStream_t stream) {
  switch (cfg.dtype) {
    case DType::f32:
      cp_merge_states_kernel<float><<<cfg.num_q_heads, cfg.head_dim, 0, stream>>>(
          states_all, static_cast<float*>(o_out), lse_out, tab, cfg.head_dim);
      break;
    case DType::f16:
      cp_merge_states_kernel<__half><<<cfg.num_q_heads, cfg.head_dim, 0, stream>>>(
          states_all, static_cast<__half*>(o_out), lse_out, tab, cfg.head_dim);
      break;
    case DType::bf16:
      cp_merge_states_kernel<__nv_bfloat16><<<cfg.num_q_heads, cfg.head_dim, 0, stream>>>(
          states_all, static_cast<__nv_bfloat16*>(o_out), lse_out, tab, cfg.head_dim);
      break;
  }
  ORTHROS_CUDA_LAUNCH_CHECK("cp_merge_states_kernel");
}

}  // namespace cp_detail

using namespace cp_detail;

int cp_state_splits(const AttentionConfig& cfg, const CpLayout& layout, int rank, std::int64_t T_out) {
  check_rank(layout, rank);
  if (T_out != 1 || layout.ranks() < 2 || layout.ranks() > kMaxStateRanks) return 0;
  if (cfg.deterministic)
    for (int r = 0; r < layout.ranks(); ++r)
      if (layout.start(r) % kDeterministicChunk != 0 || layout.length[r] <= kDeterministicChunk) return 0;
  return splits_for(cfg, layout.length[rank]);
}

std::size_t cp_states_bytes(const AttentionConfig& cfg, std::int64_t shard_rows) {
  detail::validate_config(cfg);
  require(shard_rows >= 0, "shard_rows must be >= 0 (got ", shard_rows, ")");
  return state_bytes(cfg, splits_for(cfg, shard_rows));
}

void cp_merge_partials(const AttentionConfig& cfg, int R, std::int64_t T_out, const float* o_parts,
                       const float* lse_parts, void* o_out, float* lse_out, cudaStream_t stream) {
  detail::validate_config(cfg);
  require(R >= 1, "cp_merge_partials: R (ranks) must be >= 1 (got ", R, ")");
  require(T_out >= 0, "cp_merge_partials: T_out must be >= 0 (got ", T_out, ")");
  if (T_out == 0) return;
  require(o_parts && lse_parts && o_out, "cp_merge_partials: o_parts, lse_parts and o_out must not be null");
  const long long rows = T_out * cfg.num_q_heads;
  switch (cfg.dtype) {
    case DType::f32: launch_merge<float>(R, rows, cfg.head_dim, o_parts, lse_parts, o_out, lse_out, stream); break;
    case DType::f16: launch_merge<__half>(R, rows, cfg.head_dim, o_parts, lse_parts, o_out, lse_out, stream); break;
    case DType::bf16:
      launch_merge<__nv_bfloat16>(R, rows, cfg.head_dim, o_parts, lse_parts, o_out, lse_out, stream);
      break;
  }
}

}  // namespace orthros::cuda
