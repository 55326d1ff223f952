// Internal declarations shared by the context-parallel sources (not installed): buffer row
// arithmetic, argument checks, the split-state table of the state path and the merge launches.
#pragma once

#include "orthros/cuda/context_parallel.hpp"

#include <cstddef>
#include <cstdint>

namespace orthros::cuda::cp_detail {

/// Elements / bytes of one cache or query row (all KV heads, or all query heads, times D).
std::int64_t row_elems(const AttentionConfig& c, bool q_heads);
std::size_t row_bytes(const AttentionConfig& c, bool q_heads);
/// p advanced by `rows` rows of `rb` bytes.
const char* at_rows(const void* p, std::int64_t rows, std::size_t rb);
char* at_rows(void* p, std::int64_t rows, std::size_t rb);

/// orthros::Error unless rank is in [0, layout.ranks()).
void check_rank(const CpLayout& layout, int rank);
/// orthros::Error unless the layout is contiguous shards of >= 1 row (as make_cp_layout builds).
void check_layout(const CpLayout& l);
/// orthros::Error unless kv's halo rows, shard capacity and pointers fit rank's shard and halo.
void check_kv(const AttentionConfig& cfg, const CpLayout& layout, int rank, const CpRankKV& kv);

/// The state path: ranks of at most kMaxStateRanks, each rank's output call split into
/// splits_for(rows) fp32 states [H_q, splits, D+2] = (m, l, acc[D]).
constexpr int kMaxStateRanks = 64;
int splits_for(const AttentionConfig& c, std::int64_t rows);
std::size_t state_bytes(const AttentionConfig& c, int splits);
struct StateTable {
  int R;
  int ns[kMaxStateRanks];         // splits of rank r
  long long off[kMaxStateRanks];  // float offset of rank r's [H_q, ns_r, D+2] block in states_all
};
StateTable state_table(const AttentionConfig& c, const CpLayout& l);

/// lse[0, n) = -inf (the empty states of queries before a rank's shard), on `stream`.
void fill_lse_empty(float* lse, long long n, cudaStream_t stream);
/// The state path's merge on the last rank: every split state of every rank (states_all, laid
/// out by tab) merged in rank then split order into o_out [H_q, D] and lse_out [H_q].
void merge_states(const AttentionConfig& cfg, const StateTable& tab, const float* states_all, void* o_out,
                  float* lse_out, cudaStream_t stream);

}  // namespace orthros::cuda::cp_detail
