// Context parallelism's per-rank compute (docs/context_parallel.md): the rank's base rows
// (interior rows, which need no halo, apart from the boundary rows, which read it) and its
// partial results for the output stream, each through attention_forward.
#include "context_parallel/internal.hpp"
#include "common/device.cuh"
#include "common/tile_config.cuh"

#include <algorithm>
#include <limits>

namespace orthros::cuda {

namespace {
using namespace cp_detail;

// attention_forward on one contiguous stretch of a rank's local cache; the output stream (a
// partial state) in float32.
void forward_on(const AttentionConfig& cfg, const void* k, const void* v, std::int64_t capacity,
                std::int64_t cache_len, std::int64_t T, std::int64_t T_out, const void* q, void* o, float* lse,
                const void* q_out, float* o_out_f32, float* lse_out, cudaStream_t stream) {
  require(T <= std::numeric_limits<int>::max(), "context parallel: a rank's call has too many rows (", T, ")");
  AttentionBuffers buf;
  buf.q = q;
  buf.q_out = q_out;
  buf.k_cache = k;
  buf.v_cache = v;
  buf.capacity = capacity;
  buf.o = o;
  buf.o_out = o_out_f32;
  buf.o_out_float32 = true;  // partial outputs stay float32 until the merge's one rounding
  buf.lse = lse;
  buf.lse_out = lse_out;
  attention_forward(cfg, BatchLayout::single(static_cast<int>(T), cache_len - T, static_cast<int>(T_out)), buf,
                    stream);
}

// Global row from which the base rows of `rank` need no halo row in any KV tile they read.
std::int64_t interior_first_row(const AttentionConfig& cfg, const CpHalo& h) {
  if (h.rows == 0) return 0;
  const std::int64_t tile = detail::kKeyTile;  // KV tile of the tensor-core kernels; the SIMT tile divides it
  const std::int64_t clean = h.first_row + (h.rows + tile - 1) / tile * tile;  // first tile without halo rows
  const std::int64_t w = std::min<std::int64_t>(cfg.window, std::int64_t(1) << 40);
  return clean + w - 1;  // row t reads tiles from floor(t - w + 1) on
}

}  // namespace

using namespace cp_detail;

void cp_window_stream(const AttentionConfig& cfg, const CpLayout& layout, int rank, std::int64_t T,
                      const CpRankBuffers& b, CpPart part, cudaStream_t stream) {
  detail::validate_config(cfg);
  check_layout(layout);
  const CpRows rows = cp_rank_rows(layout, rank, T);
  if (rows.count == 0) return;
  check_kv(cfg, layout, rank, b.kv);
  require(b.q != nullptr && b.o != nullptr, "rank ", rank, ": q and o must not be null (", rows.count,
          " base rows)");
  const CpHalo h = cp_halo(layout, rank, cfg.window, cfg.deterministic);
  const std::int64_t end = rows.first + rows.count;
  const std::int64_t split = std::clamp(interior_first_row(cfg, h), rows.first, end);
  std::int64_t lo = rows.first, hi = end;
  if (part == CpPart::interior) lo = split;
  if (part == CpPart::boundary) hi = split;
  if (lo >= hi) return;
  const std::size_t qb = row_bytes(cfg, true);
  // Local cache row 0 = cache row h.first_row; the call's rows [lo, hi) are its last rows.
  forward_on(cfg, b.kv.k, b.kv.v, b.kv.halo_rows + b.kv.shard_capacity, hi - h.first_row, hi - lo,
             0, at_rows(b.q, lo - rows.first, qb), at_rows(b.o, lo - rows.first, qb),
             b.lse ? b.lse + (lo - rows.first) * cfg.num_q_heads : nullptr, nullptr, nullptr, nullptr, stream);
}

void cp_output_partials(const AttentionConfig& cfg, const CpLayout& layout, int rank, std::int64_t T_out,
                        const CpRankBuffers& b, cudaStream_t stream) {
  detail::validate_config(cfg);
  check_layout(layout);
  check_rank(layout, rank);
  const std::int64_t N = layout.total();
  require(T_out >= 0 && T_out <= N, "T_out must be in [0, N = ", N, "] (got ", T_out, ")");
  if (T_out == 0) return;
  check_kv(cfg, layout, rank, b.kv);
  require(b.q_out && b.o_part && b.lse_part, "rank ", rank, ": q_out, o_part and lse_part must not be null (T_out = ",
          T_out, ")");
  require(b.scratch && b.scratch_bytes >= cp_scratch_bytes(cfg, T_out), "rank ", rank,
          ": scratch must hold cp_scratch_bytes() = ", cp_scratch_bytes(cfg, T_out), " bytes (got ",
          b.scratch_bytes, ", pointer ", b.scratch, ")");
  const std::size_t qb = row_bytes(cfg, true), kvb = row_bytes(cfg, false);
  const int Hq = cfg.num_q_heads;
  const std::int64_t part_row = static_cast<std::int64_t>(Hq) * cfg.head_dim;  // floats per o_part row
  const std::int64_t first_out = N - T_out, s = layout.start(rank), e = layout.end(rank);
  const void* ks = at_rows(b.kv.k, b.kv.halo_rows, kvb);
  const void* vs = at_rows(b.kv.v, b.kv.halo_rows, kvb);
  const std::int64_t cap = b.kv.shard_capacity, len = layout.length[rank];
  // Queries before the shard: empty states (o = 0, lse = -inf).
  const std::int64_t n_empty = std::clamp<std::int64_t>(s - first_out, 0, T_out);
  if (n_empty > 0) {
    ORTHROS_CUDA_CHECK(cudaMemsetAsync(b.o_part, 0, cp_partial_bytes(cfg, n_empty), stream));
    const long long n = n_empty * Hq;
    fill_lse_empty(b.lse_part, n, stream);
  }
  // Queries inside the shard (its last rows): causal over the shard, one call.
  const std::int64_t in_lo = std::max(s, first_out), in_hi = std::min(e, N);
  if (in_lo < in_hi) {
    const std::int64_t j0 = in_lo - first_out, m = in_hi - in_lo;
    forward_on(cfg, ks, vs, cap, len, m, m, at_rows(b.q_out, j0, qb), b.scratch, nullptr, at_rows(b.q_out, j0, qb),
               b.o_part + j0 * part_row, b.lse_part + j0 * Hq, stream);
  }
  // State path (T_out = 1): the one query sees [start_r, min(N-1, end_r-1)] = the whole shard;
  // the call is split (fixed split count, or the chunks) and leaves its fp32 split states in
  // b.states (attention_forward's split-KV workspace: [H_q, splits, D+2] = (m, l, acc[D])).
  if (const int ns = cp_state_splits(cfg, layout, rank, T_out); ns > 0) {
    AttentionConfig c2 = cfg;
    if (!cfg.deterministic) c2.num_splits = ns;
    const BatchLayout bl = BatchLayout::single(1, len - 1, 1);
    const std::size_t need = state_bytes(cfg, ns);
    require(attention_workspace_bytes(c2, bl) == need, "internal: rank ", rank, "'s output call over ", len,
            " rows does not split into the ", ns, " states the state path expects (workspace ",
            attention_workspace_bytes(c2, bl), " bytes, expected ", need, ")");
    require(b.states && b.states_bytes >= need, "rank ", rank, ": states must hold ", need,
            " bytes (cp_states_bytes(cfg, ", len, ")) on the state path; got ", b.states_bytes, " (pointer ",
            static_cast<const void*>(b.states), ")");
    AttentionBuffers buf;
    buf.q = b.q_out;
    buf.q_out = b.q_out;
    buf.k_cache = ks;
    buf.v_cache = vs;
    buf.capacity = cap;
    buf.o = b.scratch;
    buf.o_out = b.o_part;
    buf.o_out_float32 = true;
    buf.lse_out = b.lse_part;
    buf.workspace = b.states;
    buf.workspace_bytes = b.states_bytes;
    attention_forward(c2, bl, buf, stream);
    return;
  }
  // Queries past the shard: each sees the whole shard (the last row of a cache of len rows).
  for (std::int64_t t = std::max(e, first_out); t < N; ++t) {
    const std::int64_t j = t - first_out;
    forward_on(cfg, ks, vs, cap, len, 1, 1, at_rows(b.q_out, j, qb), b.scratch, nullptr, at_rows(b.q_out, j, qb),
               b.o_part + j * part_row, b.lse_part + j * Hq, stream);
  }
}

}  // namespace orthros::cuda
