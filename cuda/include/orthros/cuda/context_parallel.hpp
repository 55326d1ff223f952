/// \file context_parallel.hpp
/// \brief Context parallelism on GPUs (docs/context_parallel.md): one sequence's KV
/// cache cut into R contiguous shards, one per rank (GPU), computed with the single-GPU operator
/// orthros::cuda::attention_forward (no new attention kernel) plus a small LSE-merge kernel.
/// The CPU oracle of the same decomposition is reference/include/orthros/context_parallel.hpp.
///
/// Per rank r (rows are 0-based cache rows of the whole sequence, N = sum of the shard lengths):
///   - **Window stream** of the rank's base queries (rows `[max(start_r, N-T), end_r)`):
///     attention_forward over the local cache `[halo; shard]` with P = halo rows, T = the rank's
///     rows, T_out = 0. The **halo** is the rows just before the shard that the window reaches,
///     padded down to an alignment (cp_halo()); it may span several previous ranks when their
///     shards are short. The interior rows (those whose window starts past the halo's tiles) run
///     before the halo arrives; only the first ~w rows wait for it.
///   - **Output stream**: every output query is broadcast to all ranks; rank r computes the
///     partial state (o_r normalized over its keys, lse_r natural log) over the keys of its shard
///     the query sees, with attention_forward on the shard alone; the last rank gathers the R
///     states and merges them in rank order (cp_merge_partials(), the formula of
///     orthros::merge_partial_states).
///   - **Decode** over the sharded cache: the new key/value is appended to the last rank's shard;
///     the window query runs there, the output query is split over all shards as above.
///
/// Compute and transport are separate: the per-rank functions (cp_window_stream(),
/// cp_output_partials(), cp_merge_partials()) take the halo and the partial states as device
/// buffers; a CpTransport moves them: LoopbackTransport runs R virtual ranks on ONE GPU (copies
/// by cudaMemcpyAsync), NcclTransport one process per GPU (ncclSend/ncclRecv; only when built
/// with -DORTHROS_NCCL=ON, see cp_nccl_available()). cp_attention() and cp_decode_step() drive
/// either transport.
///
/// Exactness against attention_forward on the whole (gathered) sequence, same AttentionConfig:
///   - window stream o/lse: **bitwise**, fast and deterministic mode, any shard layout. Every
///     forward kernel's per-row arithmetic depends only on the row's key range and on absolute
///     tile boundaries (multiples of 64 keys) and, in the deterministic mode, on absolute chunk
///     boundaries (multiples of kDeterministicChunk). The halo's first row is therefore aligned
///     down to 64 rows (fast) or kDeterministicChunk rows (deterministic), so local row 0 of
///     `[halo; shard]` sits on a tile/chunk boundary and every row sees the same tiles/chunks as
///     on one GPU (cost: at most 63, resp. 1023, extra halo rows).
///   - output stream, R = 1: **bitwise** (the merge of one state is the identity: e = 1, L = 1).
///   - output stream of ONE output query (prefill, decode: T_out = 1), R >= 2, "state path"
///     (cp_state_splits() > 0): each rank's attention_forward call is split over its shard and
///     its fp32 split states (m, l, acc: the operator's split-KV workspace) are gathered to the
///     last rank and merged as ONE chain in rank and split order with the operator's own merge
///     arithmetic (merge_coeffs/merge_val/state_lse of cuda/src/common/device.cuh). Deterministic mode with every
///     shard start a multiple of kDeterministicChunk and every shard longer than one chunk: the
///     splits are the single GPU's chunks, so o_out/lse_out are **bitwise** equal to one GPU.
///     Fast mode: split counts per rank are fixed by the layout (cp_state_splits()); one rounding
///     to the dtype, as a single-GPU split-KV; within SPEC §6, not bitwise.
///   - output stream otherwise (T_out > 1, or deterministic with a shard start off the chunk
///     grid or a shard of <= one chunk): the "normalized path": each rank's o_r is the public
///     operator's normalized output in float32 (AttentionBuffers::o_out_float32: not rounded to
///     the dtype), lse_r f32, merged by cp_merge_partials() and rounded once to the dtype, as a
///     single-GPU split-KV merge; within SPEC §6 (both criteria), not bitwise.
///
/// Errors: bad layouts, ranks, windows, buffers throw orthros::Error naming the parameter and
/// values before anything is launched; CUDA failures throw CudaError; NCCL failures throw
/// CudaError naming the NCCL call and ncclGetErrorString.
#pragma once

#include "orthros/cuda/attention.hpp"

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

namespace orthros::cuda {

/// Shard layout of one sequence: rank r holds cache rows `[start(r), end(r))`, ranks in position
/// order, covering `0 .. total()-1` once. Built and validated by make_cp_layout().
struct CpLayout {
  std::vector<std::int64_t> length;  ///< length[r] >= 1
  std::vector<std::int64_t> first;   ///< first[r] = sum of length[0..r)
  int ranks() const { return static_cast<int>(length.size()); }                ///< R
  std::int64_t start(int r) const { return first[r]; }                          ///< first cache row of rank r
  std::int64_t end(int r) const { return first[r] + length[r]; }                ///< one past its last row
  std::int64_t total() const { return length.empty() ? 0 : end(ranks() - 1); }  ///< cache rows N of all ranks
};

/// \throws orthros::Error when `shard_lengths` is empty, has more than 4096 ranks, an entry is
///   < 1, or the entries do not sum to `total` (message names `shard_lengths` and its entries).
CpLayout make_cp_layout(const std::vector<std::int64_t>& shard_lengths, std::int64_t total);

/// Equal shards of `total` rows over `ranks` ranks, each (but the last) a multiple of `align`
/// rows (use kDeterministicChunk in the deterministic mode). \throws orthros::Error when
/// `ranks < 1`, `align < 1` or a rank would get no rows.
CpLayout even_cp_layout(std::int64_t total, int ranks, std::int64_t align = 1);

/// Row alignment of the halo's first row: 64 (the KV tile of the forward kernels) in the fast
/// mode, kDeterministicChunk in the deterministic mode.
std::int64_t cp_halo_alignment(bool deterministic);

/// One contiguous piece of a halo, sent by `src_rank`: cache rows `[first_row, first_row + rows)`
/// (global), at local shard row `first_row - start(src_rank)` of the sender and halo row
/// `first_row - halo.first_row` of the receiver.
struct CpHaloPiece {
  int src_rank = 0;            ///< the rank that sends the piece
  std::int64_t first_row = 0;  ///< first (global) cache row of the piece
  std::int64_t rows = 0;       ///< rows in the piece
};

/// The halo of one rank: rows `[first_row, start_r)`, `first_row = align_down(max(0, start_r -
/// (w-1)), cp_halo_alignment(det))`, the pieces in ascending rank order (empty for rank 0).
struct CpHalo {
  std::int64_t first_row = 0;       ///< first (global) cache row of the halo
  std::int64_t rows = 0;            ///< start_r - first_row (0 for rank 0)
  std::vector<CpHaloPiece> pieces;  ///< who sends which rows, ascending rank
};

/// The halo of `rank` (the halo rule of docs/context_parallel.md plus the alignment above). Depends only on start_r,
/// so it stays valid while the last shard grows by decode steps.
/// \throws orthros::Error when `rank` is not in [0, R) or `window < 1`.
CpHalo cp_halo(const CpLayout& layout, int rank, std::int64_t window, bool deterministic);

/// One rank's KV storage (device): `k`, `v` `[halo_rows + shard_capacity, H_kv, D]` of the dtype;
/// rows `[0, halo_rows)` receive the halo (row i = cache row `cp_halo(...).first_row + i`), rows
/// `[halo_rows, halo_rows + length(r))` hold the shard (row halo_rows + i = cache row start_r + i).
/// `halo_rows` must equal `cp_halo(layout, r, window, det).rows`; `shard_capacity >= length(r)`
/// (the last rank needs room for decode appends). Allocate with cp_rank_kv_bytes().
struct CpRankKV {
  void* k = nullptr;                ///< [halo_rows + shard_capacity, H_kv, D] keys (post-RoPE)
  void* v = nullptr;                ///< [halo_rows + shard_capacity, H_kv, D] values
  std::int64_t halo_rows = 0;       ///< cp_halo(layout, r, window, det).rows
  std::int64_t shard_capacity = 0;  ///< rows reserved for the shard (>= its length)
};

/// Bytes of ONE of k/v for `rows` = halo_rows + shard_capacity rows.
std::size_t cp_rank_kv_bytes(const AttentionConfig& cfg, std::int64_t rows);

/// Device buffers of one rank for one call (T base queries, T_out output queries of the whole
/// sequence; the rank's base rows are cp_rank_rows()). Dtype = cfg.dtype unless float.
struct CpRankBuffers {
  CpRankKV kv;  ///< the rank's halo + shard storage
  const void* q = nullptr;  ///< [T_r, H_q, D] the rank's base queries (rows first..first+T_r-1)
  void* o = nullptr;        ///< [T_r, H_q, D]
  float* lse = nullptr;     ///< [T_r, H_q] (may be null)
  /// [T_out, H_q, D] output queries. On the last rank: the input; on the others: filled by the
  /// transport's broadcast (CpOptions::broadcast_q_out) or by the caller.
  void* q_out = nullptr;
  float* o_part = nullptr;     ///< [T_out, H_q, D] this rank's partial outputs, float32 (cp_partial_bytes())
  float* lse_part = nullptr;   ///< [T_out, H_q] their LSEs (-inf: empty state)
  void* scratch = nullptr;     ///< cp_scratch_bytes() bytes (base rows of the partial calls)
  std::size_t scratch_bytes = 0;  ///< size of `scratch` in bytes
  // Last rank only (the owner of the output queries):
  float* o_parts = nullptr;    ///< [R, T_out, H_q, D] gathered partial outputs, float32, rank-major
  float* lse_parts = nullptr;  ///< [R, T_out, H_q]
  void* o_out = nullptr;       ///< [T_out, H_q, D] merged output stream
  float* lse_out = nullptr;    ///< [T_out, H_q] (may be null)
  // State path only (cp_state_splits() > 0 for the call):
  float* states = nullptr;         ///< cp_states_bytes(cfg, shard rows): this rank's split states
  std::size_t states_bytes = 0;      ///< size of `states` in bytes
  float* states_all = nullptr;     ///< last rank: sum over ranks of cp_states_bytes(cfg, len_r)
  std::size_t states_all_bytes = 0;  ///< size of `states_all` in bytes
};

/// Split states this rank contributes to the output stream on the state path (see the file
/// comment), or 0 when the call uses the normalized path. Depends only on (cfg.deterministic,
/// layout, T_out), so every process decides alike: > 0 iff T_out == 1, 2 <= R <= 64 and, in the
/// deterministic mode, every shard starts on the kDeterministicChunk grid and is longer than one
/// chunk (then ceil(len_r / kDeterministicChunk), the chunks); fast mode: clamp(ceil(len_r /
/// 1024), 2, 64) splits (cfg.num_splits is not used).
int cp_state_splits(const AttentionConfig& cfg, const CpLayout& layout, int rank, std::int64_t T_out);

/// Bytes of the split states of a rank whose shard has `shard_rows` rows on the state path (the
/// most any call over that many rows needs; allocate with the shard capacity). 0 never: at least
/// one state.
std::size_t cp_states_bytes(const AttentionConfig& cfg, std::int64_t shard_rows);

/// The rank's base rows of a call with T base queries: cache rows `[first, first + count)`,
/// `first = max(start_r, N - T)`, count >= 0.
struct CpRows {
  std::int64_t first = 0;  ///< first cache row
  std::int64_t count = 0;  ///< rows (>= 0)
};
/// The base rows of `rank` in a call with T base queries (CpRows). \throws orthros::Error on a bad
/// rank or T outside [0, N].
CpRows cp_rank_rows(const CpLayout& layout, int rank, std::int64_t T);

/// Bytes of one rank's partial outputs `o_part` [T_out, H_q, D] in float32 (any dtype); `o_parts`
/// of the last rank holds R of them. \throws orthros::Error if T_out < 0.
std::size_t cp_partial_bytes(const AttentionConfig& cfg, std::int64_t T_out);

/// Scratch bytes of cp_output_partials() for T_out output queries.
std::size_t cp_scratch_bytes(const AttentionConfig& cfg, std::int64_t T_out);

/// Which base rows cp_window_stream() computes: all, the interior ones (no halo row in any of
/// their KV tiles: they may run while the halo is in flight) or the boundary ones (the rest).
enum class CpPart { all, interior, boundary };

/// Rank r's window stream: attention_forward over `[halo; shard]` (P = halo rows + rows of the
/// shard before the call's first row, T = the rows of `part`, T_out = 0). Needs the halo in
/// `b.kv` unless part == interior. Asynchronous on `stream`.
/// \throws orthros::Error on a bad rank/layout/T, a halo_rows that does not match cp_halo(), a
///   shard_capacity < length, null/misaligned buffers (as attention_forward).
void cp_window_stream(const AttentionConfig& cfg, const CpLayout& layout, int rank, std::int64_t T,
                      const CpRankBuffers& b, CpPart part, cudaStream_t stream = nullptr);

/// Rank r's partial states of the T_out output queries (cache rows N-T_out .. N-1): for a query
/// at row t, the keys `[start_r, min(t, end_r - 1)]`; empty (o = 0, lse = -inf) when t < start_r.
/// One attention_forward on the shard for the queries inside it (causal, T = T_out = their
/// count) and one per query past the shard (it sees the whole shard); the base rows of those
/// calls go to `b.scratch`. For prefill/decode (T_out = 1) that is one call per rank, which on
/// the state path also leaves its split states in `b.states`.
void cp_output_partials(const AttentionConfig& cfg, const CpLayout& layout, int rank, std::int64_t T_out,
                        const CpRankBuffers& b, cudaStream_t stream = nullptr);

/// The LSE merge in rank order of R partial states (orthros::merge_partial_states):
/// per output row and query head, over the non-empty states (lse > -inf), in float32:
/// `M = max lse_r, e_r = exp(lse_r - M), L = sum_r e_r (ascending r), o = sum_r (e_r / L) o_r,
/// lse = M + log L` (this sum in float64, rounded once); o rounded once to the dtype. One state:
/// the float32 partial rounded to the dtype, which is what attention_forward writes.
/// \param cfg       dtype and dims of the operator
/// \param R         number of partial states per output row (ranks)
/// \param T_out     output rows
/// \param o_parts   [R, T_out, H_q, D] float32, rank-major (cp_output_partials()' o_part of each rank)
/// \param lse_parts [R, T_out, H_q] (float32, natural log; -inf: empty state)
/// \param o_out     [T_out, H_q, D] merged output (dtype)
/// \param lse_out   [T_out, H_q] merged LSE (may be null)
/// \param stream    CUDA stream of the launch
/// \throws orthros::Error on R < 1, T_out < 0, null buffers; CudaError on a failed launch.
void cp_merge_partials(const AttentionConfig& cfg, int R, std::int64_t T_out, const float* o_parts,
                       const float* lse_parts, void* o_out, float* lse_out, cudaStream_t stream = nullptr);

/// Moves halos and partial states between ranks. Every method is collective over the ranks the
/// process drives (`local_ranks()`, buffers in that order) and stream-ordered.
class CpTransport {
 public:
  virtual ~CpTransport() = default;
  virtual int ranks() const = 0;                 ///< R
  virtual std::vector<int> local_ranks() const = 0;  ///< ranks driven by this process, ascending
  /// For every rank with base rows in the call (cp_rank_rows().count > 0) fills `kv` rows
  /// `[0, halo_rows)` with its halo pieces from the earlier ranks' shards.
  virtual void exchange_halo(const AttentionConfig& cfg, const CpLayout& layout, std::int64_t T,
                             const std::vector<CpRankBuffers>& local, cudaStream_t stream) = 0;
  /// Copies the last rank's q_out to every rank's q_out.
  virtual void broadcast_q_out(const AttentionConfig& cfg, std::int64_t T_out, const std::vector<CpRankBuffers>& local,
                               cudaStream_t stream) = 0;
  /// Gathers every rank's (o_part, lse_part) into slot r of the last rank's (o_parts, lse_parts);
  /// on the state path (cp_state_splits() > 0) every rank's `states` into the last rank's
  /// `states_all`, rank-major.
  virtual void gather_partials(const AttentionConfig& cfg, const CpLayout& layout, std::int64_t T_out,
                               const std::vector<CpRankBuffers>& local, cudaStream_t stream) = 0;
};

/// R virtual ranks on one GPU (tests, and the R = 1 baseline): drives all ranks; halo pieces,
/// broadcast and gather are cudaMemcpyAsync device-to-device copies.
class LoopbackTransport final : public CpTransport {
 public:
  /// \throws orthros::Error when ranks < 1.
  explicit LoopbackTransport(int ranks);
  int ranks() const override { return ranks_; }
  std::vector<int> local_ranks() const override;
  void exchange_halo(const AttentionConfig& cfg, const CpLayout& layout, std::int64_t T,
                     const std::vector<CpRankBuffers>& local, cudaStream_t stream) override;
  void broadcast_q_out(const AttentionConfig& cfg, std::int64_t T_out, const std::vector<CpRankBuffers>& local,
                       cudaStream_t stream) override;
  void gather_partials(const AttentionConfig& cfg, const CpLayout& layout, std::int64_t T_out,
                       const std::vector<CpRankBuffers>& local, cudaStream_t stream) override;

 private:
  int ranks_;
};

/// True when the library was built with the NCCL transport (-DORTHROS_NCCL=ON).
bool cp_nccl_available();

/// An NCCL unique id (ncclUniqueId's 128 bytes), created by one rank and passed to all (the
/// benchmark passes it through a pipe after fork()).
using CpNcclId = std::array<char, 128>;
/// ncclGetUniqueId. \throws orthros::Error when built without NCCL; CudaError on failure.
CpNcclId cp_nccl_unique_id();

/// One process per GPU: the current CUDA device is this rank's GPU. Halo pieces by
/// ncclSend/ncclRecv (one group per exchange: each earlier rank sends the rows the later ranks
/// need), q_out by ncclBroadcast from the last rank, partial states by ncclSend to the last rank.
class NcclTransport final : public CpTransport {
 public:
  /// ncclCommInitRank. \throws orthros::Error when built without NCCL or rank not in [0, ranks);
  ///   CudaError when NCCL fails.
  NcclTransport(int ranks, int rank, const CpNcclId& id);
  ~NcclTransport() override;
  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;
  int ranks() const override { return ranks_; }
  std::vector<int> local_ranks() const override { return {rank_}; }
  void exchange_halo(const AttentionConfig& cfg, const CpLayout& layout, std::int64_t T,
                     const std::vector<CpRankBuffers>& local, cudaStream_t stream) override;
  void broadcast_q_out(const AttentionConfig& cfg, std::int64_t T_out, const std::vector<CpRankBuffers>& local,
                       cudaStream_t stream) override;
  void gather_partials(const AttentionConfig& cfg, const CpLayout& layout, std::int64_t T_out,
                       const std::vector<CpRankBuffers>& local, cudaStream_t stream) override;
  /// Sum-all-reduce of `n` floats in place (the benchmark's barrier / max-time reduction: op 0
  /// sum, 1 max). Synchronous.
  void allreduce(float* dev, std::size_t n, int op, cudaStream_t stream);

 private:
  int ranks_, rank_;
  void* comm_ = nullptr;  // ncclComm_t
};

/// Options of cp_attention().
struct CpOptions {
  bool halo_ready = false;       ///< the halos are already in place (decode after a prefill)
  bool broadcast_q_out = true;   ///< broadcast q_out from the last rank first
  /// Second stream for the halo exchange (overlapped with the interior rows); null: one stream.
  cudaStream_t comm_stream = nullptr;
};

/// The Orthros attention operator computed context-parallel: T base queries (the
/// last T cache rows of the sequence, N = layout.total(), P = N - T) and T_out output queries
/// (the last T_out rows), over the sharded cache. For the ranks of `tr.local_ranks()` (buffers in
/// `local`, same order): interior window rows, halo exchange (comm stream), boundary window rows,
/// output partials, gather, and on the last rank the merge. Results: each rank's o/lse (its rows)
/// and the last rank's o_out/lse_out; exactness as in the file comment.
/// \throws orthros::Error on bad arguments (T < 0, T > N, T_out outside [0, T], window, a
///   layout whose rank count differs from the transport's, buffer count != local ranks, ...).
void cp_attention(const AttentionConfig& cfg, const CpLayout& layout, std::int64_t T, std::int64_t T_out,
                  CpTransport& tr, const std::vector<CpRankBuffers>& local, cudaStream_t stream = nullptr,
                  const CpOptions& opt = {});

/// One decode step over the sharded cache (T = T_out = 1): appends `k_new`/`v_new` `[1, H_kv, D]`
/// (device, on the last rank; ignored elsewhere) to the last rank's shard, grows `layout` (every
/// process must pass the same layout), then cp_attention(T = 1, T_out = 1). The last rank's
/// `q` is the new base query, its `q_out` the output query.
/// \throws orthros::Error when the last rank's shard_capacity is full (names the capacity).
void cp_decode_step(const AttentionConfig& cfg, CpLayout& layout, CpTransport& tr,
                    const std::vector<CpRankBuffers>& local, const void* k_new, const void* v_new,
                    cudaStream_t stream = nullptr, const CpOptions& opt = {});

}  // namespace orthros::cuda
