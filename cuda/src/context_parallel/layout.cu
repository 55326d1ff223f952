// Context parallelism's layout arithmetic (docs/context_parallel.md): shards, the halo each rank
// needs from the ranks before it, buffer sizes, and the argument checks the other sources share.
#include "context_parallel/internal.hpp"
#include "common/device.cuh"
#include "common/tile_config.cuh"

#include <algorithm>
#include <string>

namespace orthros::cuda {

namespace cp_detail {

std::int64_t row_elems(const AttentionConfig& c, bool q_heads) {
  return std::int64_t(q_heads ? c.num_q_heads : c.num_kv_heads) * c.head_dim;
}
std::size_t row_bytes(const AttentionConfig& c, bool q_heads) {
  return static_cast<std::size_t>(row_elems(c, q_heads)) * dtype_size(c.dtype);
}
const char* at_rows(const void* p, std::int64_t rows, std::size_t rb) {
  return static_cast<const char*>(p) + static_cast<std::size_t>(rows) * rb;
}
char* at_rows(void* p, std::int64_t rows, std::size_t rb) { return static_cast<char*>(p) + static_cast<std::size_t>(rows) * rb; }

void check_rank(const CpLayout& layout, int rank) {
  require(layout.ranks() >= 1, "the context-parallel layout has no rank (make_cp_layout())");
  require(rank >= 0 && rank < layout.ranks(), "rank must be in [0, ", layout.ranks(), ") (got ", rank, ")");
}

void check_layout(const CpLayout& l) {
  require(l.ranks() >= 1 && l.first.size() == l.length.size(),
          "the context-parallel layout is malformed (", l.length.size(), " lengths, ", l.first.size(),
          " starts); build it with make_cp_layout()");
  std::int64_t s = 0;
  for (int r = 0; r < l.ranks(); ++r) {
    require(l.length[r] >= 1 && l.first[r] == s, "the context-parallel layout is malformed at rank ", r,
            " (start ", l.first[r], ", length ", l.length[r], ", expected start ", s, "); use make_cp_layout()");
    s += l.length[r];
  }
}

void check_kv(const AttentionConfig& cfg, const CpLayout& layout, int rank, const CpRankKV& kv) {
  const CpHalo h = cp_halo(layout, rank, cfg.window, cfg.deterministic);
  require(kv.halo_rows == h.rows, "rank ", rank, ": kv.halo_rows must be cp_halo().rows = ", h.rows,
          " (window ", cfg.window, ", deterministic ", cfg.deterministic, ", shard start ", layout.start(rank),
          "); got ", kv.halo_rows);
  require(kv.shard_capacity >= layout.length[rank], "rank ", rank, ": kv.shard_capacity (", kv.shard_capacity,
          ") must be >= the shard length ", layout.length[rank]);
  require(kv.k != nullptr && kv.v != nullptr, "rank ", rank, ": kv.k/kv.v must not be null");

}

}  // namespace cp_detail

using namespace cp_detail;

CpLayout make_cp_layout(const std::vector<std::int64_t>& shard_lengths, std::int64_t total) {
  auto fmt = [&] {
    std::string s = "[";
    for (size_t i = 0; i < shard_lengths.size() && i < 16; ++i) s += (i ? ", " : "") + std::to_string(shard_lengths[i]);
    if (shard_lengths.size() > 16) s += ", ...";
    return s + "]";
  };
  require(!shard_lengths.empty(), "shard_lengths must name at least one rank (got an empty vector for ", total,
          " cache rows)");
  require(shard_lengths.size() <= 4096, "shard_lengths names ", shard_lengths.size(), " ranks; at most 4096");
  CpLayout l;
  std::int64_t sum = 0;
  for (size_t r = 0; r < shard_lengths.size(); ++r) {
    require(shard_lengths[r] >= 1, "shard_lengths[", r, "] must be >= 1 (got ", shard_lengths[r],
            "); every rank holds at least one position; shard_lengths = ", fmt());
    l.first.push_back(sum);
    l.length.push_back(shard_lengths[r]);
    sum += shard_lengths[r];
  }
  require(sum == total, "shard_lengths sum to ", sum, " but the sequence has ", total,
          " cache rows (P+T); shard_lengths = ", fmt());
  return l;
}

CpLayout even_cp_layout(std::int64_t total, int ranks, std::int64_t align) {
  require(ranks >= 1, "ranks must be >= 1 (got ", ranks, ")");
  require(align >= 1, "align must be >= 1 (got ", align, ")");
  const std::int64_t per = (total / ranks) / align * align;
  require(per >= 1, "even_cp_layout: ", total, " rows over ", ranks, " ranks aligned to ", align,
          " rows leaves a rank empty");
  std::vector<std::int64_t> len(ranks, per);
  len.back() = total - per * (ranks - 1);
  return make_cp_layout(len, total);
}

std::int64_t cp_halo_alignment(bool deterministic) { return deterministic ? kDeterministicChunk : detail::kKeyTile; }

CpHalo cp_halo(const CpLayout& layout, int rank, std::int64_t window, bool deterministic) {
  check_rank(layout, rank);
  require(window >= 1, "window must be >= 1 (got ", window, "); w = 1 means a token sees only itself");
  const std::int64_t start = layout.start(rank), a = cp_halo_alignment(deterministic);
  const std::int64_t lo = window - 1 >= start ? 0 : start - (window - 1);
  CpHalo h;
  h.first_row = lo / a * a;
  h.rows = start - h.first_row;
  for (int src = 0; src < rank; ++src) {
    const std::int64_t b = std::max(layout.start(src), h.first_row), e = layout.end(src);
    if (b < e) h.pieces.push_back(CpHaloPiece{src, b, e - b});
  }
  return h;
}

std::size_t cp_rank_kv_bytes(const AttentionConfig& cfg, std::int64_t rows) {
  require(rows >= 0, "rows must be >= 0 (got ", rows, ")");
  return static_cast<std::size_t>(rows) * row_bytes(cfg, false);
}

CpRows cp_rank_rows(const CpLayout& layout, int rank, std::int64_t T) {
  check_rank(layout, rank);
  const std::int64_t N = layout.total();
  require(T >= 0 && T <= N, "T (base queries of the call) must be in [0, N = ", N, "] (got ", T, ")");
  CpRows r;
  r.first = std::max(layout.start(rank), N - T);
  r.count = std::max<std::int64_t>(0, layout.end(rank) - r.first);
  return r;
}

std::size_t cp_partial_bytes(const AttentionConfig& cfg, std::int64_t T_out) {
  require(T_out >= 0, "T_out must be >= 0 (got ", T_out, ")");
  return static_cast<std::size_t>(T_out) * cfg.num_q_heads * cfg.head_dim * sizeof(float);
}

std::size_t cp_scratch_bytes(const AttentionConfig& cfg, std::int64_t T_out) {
  require(T_out >= 0, "T_out must be >= 0 (got ", T_out, ")");
  return static_cast<std::size_t>(std::max<std::int64_t>(T_out, 1)) * row_bytes(cfg, true);
}

}  // namespace orthros::cuda
