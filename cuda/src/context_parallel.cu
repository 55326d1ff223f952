// Context parallelism on GPUs (issue 12, docs/context_parallel.md): per-rank compute on
// attention_forward, the LSE merge kernel, the loopback and NCCL transports, the drivers.
// Library orthros_cuda_cp (cuda/CMakeLists.txt); NCCL only when ORTHROS_HAVE_NCCL.
#include "common.cuh"
#include "orthros/cuda/context_parallel.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

#if defined(ORTHROS_HAVE_NCCL)
#include <nccl.h>
#endif

namespace orthros::cuda {

namespace {
using detail::Elem;

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

// ---- kernels ------------------------------------------------------------------------------------
__global__ void fill_lse_empty_kernel(float* lse, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    lse[i] = detail::kNegInf;
}

// One block per (output row, query head), one thread per dim d: the merge of merge_partial_states
// (reference/include/orthros/context_parallel.hpp) in float32, ranks ascending, explicit
// round-to-nearest operations (no contraction), so one non-empty state passes through unchanged.
template <typename T>
__global__ void cp_merge_kernel(const T* __restrict__ o_parts, const float* __restrict__ lse_parts,
                                T* __restrict__ o_out, float* __restrict__ lse_out, int R, long long rows, int D) {
  const long long row = blockIdx.x;  // output row * H_q + head
  const int d = threadIdx.x;
  if (row >= rows || d >= D) return;
  float M = detail::kNegInf;
  for (int r = 0; r < R; ++r) M = fmaxf(M, lse_parts[(size_t)r * rows + row]);
  float L = 0.f;
  for (int r = 0; r < R; ++r) {
    const float l = lse_parts[(size_t)r * rows + row];
    if (l != detail::kNegInf) L = __fadd_rn(L, expf(__fsub_rn(l, M)));
  }
  float acc = 0.f;
  for (int r = 0; r < R; ++r) {
    const float l = lse_parts[(size_t)r * rows + row];
    if (l == detail::kNegInf) continue;  // empty state: takes no part
    const float w = __fdiv_rn(expf(__fsub_rn(l, M)), L);
    acc = __fadd_rn(acc, __fmul_rn(w, Elem<T>::to_f(o_parts[((size_t)r * rows + row) * D + d])));
  }
  // M == -inf (no state holds keys) cannot happen for a valid layout; it yields NaN, not a value.
  o_out[(size_t)row * D + d] = Elem<T>::from_f(M == detail::kNegInf ? NAN : acc);
  // lse = M + log L in float64, rounded once (as state_lse: no extra float32 rounding of log L).
  if (d == 0 && lse_out)
    lse_out[row] = M == detail::kNegInf ? NAN : __double2float_rn(__dadd_rn(double(M), log(double(L))));
}

template <typename T>
void launch_merge(int R, long long rows, int D, const void* o_parts, const float* lse_parts, void* o_out,
                  float* lse_out, cudaStream_t s) {
  if (rows == 0) return;
  require(rows < (1LL << 31), "cp_merge_partials: too many output rows x heads (", rows, ")");
  cp_merge_kernel<T><<<static_cast<unsigned>(rows), D, 0, s>>>(static_cast<const T*>(o_parts), lse_parts,
                                                                  static_cast<T*>(o_out), lse_out, R, rows, D);
  ORTHROS_CUDA_LAUNCH_CHECK("cp_merge_kernel");
}

// attention_forward on one contiguous stretch of a rank's local cache.
void forward_on(const AttentionConfig& cfg, const void* k, const void* v, std::int64_t capacity,
                std::int64_t cache_len, std::int64_t T, std::int64_t T_out, const void* q, void* o, float* lse,
                const void* q_out, void* o_out, float* lse_out, cudaStream_t stream) {
  require(T <= std::numeric_limits<int>::max(), "context parallel: a rank's call has too many rows (", T, ")");
  AttentionBuffers buf;
  buf.q = q;
  buf.q_out = q_out;
  buf.k_cache = k;
  buf.v_cache = v;
  buf.capacity = capacity;
  buf.o = o;
  buf.o_out = o_out;
  buf.lse = lse;
  buf.lse_out = lse_out;
  attention_forward(cfg, BatchLayout::single(static_cast<int>(T), cache_len - T, static_cast<int>(T_out)), buf,
                    stream);
}

// Global row from which the base rows of `rank` need no halo row in any KV tile they read.
std::int64_t interior_first_row(const AttentionConfig& cfg, const CpHalo& h) {
  if (h.rows == 0) return 0;
  const std::int64_t tile = 64;  // KV tile of the tensor-core kernels; the SIMT tile (32) divides it
  const std::int64_t clean = h.first_row + (h.rows + tile - 1) / tile * tile;  // first tile without halo rows
  const std::int64_t w = std::min<std::int64_t>(cfg.window, std::int64_t(1) << 40);
  return clean + w - 1;  // row t reads tiles from floor(t - w + 1) on
}

// ---- state path (one output query, fp32 split states merged as one chain) ----------------------
constexpr int kMaxStateRanks = 64;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
int splits_for(const AttentionConfig& c, std::int64_t rows) {
  const std::int64_t chunks = ceil_div(std::max<std::int64_t>(rows, 1), kDeterministicChunk);
  if (c.deterministic) return static_cast<int>(chunks);
  return static_cast<int>(std::clamp<std::int64_t>(chunks, 2, 64));
}
std::size_t state_bytes(const AttentionConfig& c, int splits) {
  return static_cast<std::size_t>(c.num_q_heads) * splits * (c.head_dim + 2) * sizeof(float);
}

struct StateTable {
  int R;
  int ns[kMaxStateRanks];         // splits of rank r
  long long off[kMaxStateRanks];  // float offset of rank r's [H_q, ns_r, D+2] block in states_all
};

// The single-GPU split-KV merge (attention_kernels.cuh merge_kernel: merge_coeffs/merge_val from
// (-inf, 0, 0), then acc * rcp(L) and state_lse) over the splits of all ranks in rank order, so
// that a deterministic run whose splits are the single GPU's chunks gives its bits.
template <typename T>
__global__ void cp_merge_states_kernel(const float* __restrict__ states, T* __restrict__ o_out,
                                       float* __restrict__ lse_out, const __grid_constant__ StateTable tab, int D) {
  const int head = blockIdx.x, d = threadIdx.x;
  float M = detail::kNegInf, L = 0.f, acc = 0.f;
  for (int r = 0; r < tab.R; ++r) {
    const float* base = states + tab.off[r] + (size_t)head * tab.ns[r] * (D + 2);
    for (int sp = 0; sp < tab.ns[r]; ++sp) {
      const float* st = base + (size_t)sp * (D + 2);
      const detail::MergeCoeffs cf = detail::merge_coeffs(M, st[0]);
      L = detail::merge_val(L, st[1], cf);
      acc = detail::merge_val(acc, st[2 + d], cf);
      M = cf.m;
    }
  }
  o_out[(size_t)head * D + d] = Elem<T>::from_f(__fmul_rn(acc, __frcp_rn(L)));
  if (d == 0 && lse_out) lse_out[head] = detail::state_lse(M, L);
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

}  // namespace

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

// ---- layout and halo ----------------------------------------------------------------------------
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

std::int64_t cp_halo_alignment(bool deterministic) { return deterministic ? kDeterministicChunk : 64; }

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

std::size_t cp_scratch_bytes(const AttentionConfig& cfg, std::int64_t T_out) {
  require(T_out >= 0, "T_out must be >= 0 (got ", T_out, ")");
  return static_cast<std::size_t>(std::max<std::int64_t>(T_out, 1)) * row_bytes(cfg, true);
}

// ---- per-rank compute ---------------------------------------------------------------------------
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
  const std::int64_t first_out = N - T_out, s = layout.start(rank), e = layout.end(rank);
  const void* ks = at_rows(b.kv.k, b.kv.halo_rows, kvb);
  const void* vs = at_rows(b.kv.v, b.kv.halo_rows, kvb);
  const std::int64_t cap = b.kv.shard_capacity, len = layout.length[rank];
  // Queries before the shard: empty states (o = 0, lse = -inf).
  const std::int64_t n_empty = std::clamp<std::int64_t>(s - first_out, 0, T_out);
  if (n_empty > 0) {
    ORTHROS_CUDA_CHECK(cudaMemsetAsync(b.o_part, 0, static_cast<std::size_t>(n_empty) * qb, stream));
    const long long n = n_empty * Hq;
    fill_lse_empty_kernel<<<static_cast<unsigned>(std::min<long long>((n + 255) / 256, 1024)), 256, 0, stream>>>(
        b.lse_part, n);
    ORTHROS_CUDA_LAUNCH_CHECK("fill_lse_empty_kernel");
  }
  // Queries inside the shard (its last rows): causal over the shard, one call.
  const std::int64_t in_lo = std::max(s, first_out), in_hi = std::min(e, N);
  if (in_lo < in_hi) {
    const std::int64_t j0 = in_lo - first_out, m = in_hi - in_lo;
    forward_on(cfg, ks, vs, cap, len, m, m, at_rows(b.q_out, j0, qb), b.scratch, nullptr, at_rows(b.q_out, j0, qb),
               at_rows(b.o_part, j0, qb), b.lse_part + j0 * Hq, stream);
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
               at_rows(b.o_part, j, qb), b.lse_part + j * Hq, stream);
  }
}

void cp_merge_partials(const AttentionConfig& cfg, int R, std::int64_t T_out, const void* o_parts,
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

// ---- loopback transport -------------------------------------------------------------------------
LoopbackTransport::LoopbackTransport(int ranks) : ranks_(ranks) {
  require(ranks >= 1, "LoopbackTransport: ranks must be >= 1 (got ", ranks, ")");
}

std::vector<int> LoopbackTransport::local_ranks() const {
  std::vector<int> r(ranks_);
  for (int i = 0; i < ranks_; ++i) r[i] = i;
  return r;
}

void LoopbackTransport::exchange_halo(const AttentionConfig& cfg, const CpLayout& layout, std::int64_t T,
                                      const std::vector<CpRankBuffers>& local, cudaStream_t stream) {
  require(static_cast<int>(local.size()) == ranks_, "LoopbackTransport: ", local.size(), " rank buffers for ",
          ranks_, " ranks");
  const std::size_t kvb = row_bytes(cfg, false);
  for (int r = 0; r < ranks_; ++r) {
    if (cp_rank_rows(layout, r, T).count == 0) continue;
    const CpHalo h = cp_halo(layout, r, cfg.window, cfg.deterministic);
    check_kv(cfg, layout, r, local[r].kv);
    for (const CpHaloPiece& p : h.pieces) {
      const CpRankKV& src = local[p.src_rank].kv;
      const std::int64_t from = src.halo_rows + (p.first_row - layout.start(p.src_rank)), to = p.first_row - h.first_row;
      const std::size_t bytes = static_cast<std::size_t>(p.rows) * kvb;
      ORTHROS_CUDA_CHECK(cudaMemcpyAsync(at_rows(local[r].kv.k, to, kvb), at_rows(src.k, from, kvb), bytes,
                                         cudaMemcpyDeviceToDevice, stream));
      ORTHROS_CUDA_CHECK(cudaMemcpyAsync(at_rows(local[r].kv.v, to, kvb), at_rows(src.v, from, kvb), bytes,
                                         cudaMemcpyDeviceToDevice, stream));
    }
  }
}

void LoopbackTransport::broadcast_q_out(const AttentionConfig& cfg, std::int64_t T_out,
                                        const std::vector<CpRankBuffers>& local, cudaStream_t stream) {
  if (T_out == 0) return;
  const void* src = local.back().q_out;
  for (int r = 0; r + 1 < ranks_; ++r)
    if (local[r].q_out != src)
      ORTHROS_CUDA_CHECK(cudaMemcpyAsync(local[r].q_out, src, static_cast<std::size_t>(T_out) * row_bytes(cfg, true),
                                         cudaMemcpyDeviceToDevice, stream));
}

void LoopbackTransport::gather_partials(const AttentionConfig& cfg, const CpLayout& layout, std::int64_t T_out,
                                        const std::vector<CpRankBuffers>& local, cudaStream_t stream) {
  if (T_out == 0) return;
  const CpRankBuffers& last = local.back();
  if (cp_state_splits(cfg, layout, 0, T_out) > 0) {
    const StateTable tab = state_table(cfg, layout);
    for (int r = 0; r < ranks_; ++r)
      ORTHROS_CUDA_CHECK(cudaMemcpyAsync(last.states_all + tab.off[r], local[r].states, state_bytes(cfg, tab.ns[r]),
                                         cudaMemcpyDeviceToDevice, stream));
    return;
  }
  require(last.o_parts && last.lse_parts, "the last rank's o_parts/lse_parts must not be null (T_out = ", T_out, ")");
  const std::size_t ob = static_cast<std::size_t>(T_out) * row_bytes(cfg, true);
  const std::size_t lb = static_cast<std::size_t>(T_out) * cfg.num_q_heads * sizeof(float);
  for (int r = 0; r < ranks_; ++r) {
    ORTHROS_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(last.o_parts) + r * ob, local[r].o_part, ob,
                                       cudaMemcpyDeviceToDevice, stream));
    ORTHROS_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<char*>(last.lse_parts) + r * lb, local[r].lse_part, lb,
                                       cudaMemcpyDeviceToDevice, stream));
  }
}

// ---- NCCL transport -----------------------------------------------------------------------------
#if defined(ORTHROS_HAVE_NCCL)
namespace {
void nccl_check(ncclResult_t e, const char* what) {
  if (e != ncclSuccess) throw CudaError(std::string(what) + " failed: " + ncclGetErrorString(e));
}
#define ORTHROS_NCCL_CHECK(call) nccl_check((call), #call)
ncclComm_t comm_of(void* c) { return static_cast<ncclComm_t>(c); }
}  // namespace

bool cp_nccl_available() { return true; }

CpNcclId cp_nccl_unique_id() {
  static_assert(sizeof(ncclUniqueId) == sizeof(CpNcclId), "ncclUniqueId is 128 bytes");
  ncclUniqueId id;
  ORTHROS_NCCL_CHECK(ncclGetUniqueId(&id));
  CpNcclId out;
  std::memcpy(out.data(), &id, sizeof(id));
  return out;
}

NcclTransport::NcclTransport(int ranks, int rank, const CpNcclId& id) : ranks_(ranks), rank_(rank) {
  require(ranks >= 1, "NcclTransport: ranks must be >= 1 (got ", ranks, ")");
  require(rank >= 0 && rank < ranks, "NcclTransport: rank must be in [0, ", ranks, ") (got ", rank, ")");
  ncclUniqueId uid;
  std::memcpy(&uid, id.data(), sizeof(uid));
  ncclComm_t c = nullptr;
  ORTHROS_NCCL_CHECK(ncclCommInitRank(&c, ranks, uid, rank));
  comm_ = c;
}

NcclTransport::~NcclTransport() {
  if (comm_) ncclCommDestroy(comm_of(comm_));
}

void NcclTransport::exchange_halo(const AttentionConfig& cfg, const CpLayout& layout, std::int64_t T,
                                  const std::vector<CpRankBuffers>& local, cudaStream_t stream) {
  require(local.size() == 1, "NcclTransport drives one rank per process (got ", local.size(), " rank buffers)");
  const std::size_t kvb = row_bytes(cfg, false);
  const CpRankKV& me = local[0].kv;
  ORTHROS_NCCL_CHECK(ncclGroupStart());
  // Send: the rows of my shard that later ranks' halos need, ascending destination.
  for (int d = rank_ + 1; d < ranks_; ++d) {
    if (cp_rank_rows(layout, d, T).count == 0) continue;
    for (const CpHaloPiece& p : cp_halo(layout, d, cfg.window, cfg.deterministic).pieces) {
      if (p.src_rank != rank_) continue;
      const std::int64_t from = me.halo_rows + (p.first_row - layout.start(rank_));
      const std::size_t bytes = static_cast<std::size_t>(p.rows) * kvb;
      ORTHROS_NCCL_CHECK(ncclSend(at_rows(me.k, from, kvb), bytes, ncclUint8, d, comm_of(comm_), stream));
      ORTHROS_NCCL_CHECK(ncclSend(at_rows(me.v, from, kvb), bytes, ncclUint8, d, comm_of(comm_), stream));
    }
  }
  // Receive my halo pieces from the earlier ranks.
  if (cp_rank_rows(layout, rank_, T).count > 0) {
    check_kv(cfg, layout, rank_, me);
    const CpHalo h = cp_halo(layout, rank_, cfg.window, cfg.deterministic);
    for (const CpHaloPiece& p : h.pieces) {
      const std::int64_t to = p.first_row - h.first_row;
      const std::size_t bytes = static_cast<std::size_t>(p.rows) * kvb;
      ORTHROS_NCCL_CHECK(ncclRecv(at_rows(me.k, to, kvb), bytes, ncclUint8, p.src_rank, comm_of(comm_), stream));
      ORTHROS_NCCL_CHECK(ncclRecv(at_rows(me.v, to, kvb), bytes, ncclUint8, p.src_rank, comm_of(comm_), stream));
    }
  }
  ORTHROS_NCCL_CHECK(ncclGroupEnd());
}

void NcclTransport::broadcast_q_out(const AttentionConfig& cfg, std::int64_t T_out,
                                    const std::vector<CpRankBuffers>& local, cudaStream_t stream) {
  require(local.size() == 1, "NcclTransport drives one rank per process (got ", local.size(), " rank buffers)");
  if (T_out == 0 || ranks_ == 1) return;
  require(local[0].q_out != nullptr, "rank ", rank_, ": q_out must not be null (T_out = ", T_out, ")");
  const std::size_t bytes = static_cast<std::size_t>(T_out) * row_bytes(cfg, true);
  ORTHROS_NCCL_CHECK(
      ncclBroadcast(local[0].q_out, local[0].q_out, bytes, ncclUint8, ranks_ - 1, comm_of(comm_), stream));
}

void NcclTransport::gather_partials(const AttentionConfig& cfg, const CpLayout& layout, std::int64_t T_out,
                                    const std::vector<CpRankBuffers>& local, cudaStream_t stream) {
  require(local.size() == 1, "NcclTransport drives one rank per process (got ", local.size(), " rank buffers)");
  if (T_out == 0) return;
  const CpRankBuffers& b = local[0];
  if (cp_state_splits(cfg, layout, 0, T_out) > 0) {  // split states, rank-major, to the last rank
    const StateTable tab = state_table(cfg, layout);
    const int last = ranks_ - 1;
    if (rank_ == last)
      ORTHROS_CUDA_CHECK(cudaMemcpyAsync(b.states_all + tab.off[last], b.states, state_bytes(cfg, tab.ns[last]),
                                         cudaMemcpyDeviceToDevice, stream));
    ORTHROS_NCCL_CHECK(ncclGroupStart());
    if (rank_ == last) {
      for (int r = 0; r < last; ++r)
        ORTHROS_NCCL_CHECK(ncclRecv(b.states_all + tab.off[r], state_bytes(cfg, tab.ns[r]), ncclUint8, r,
                                    comm_of(comm_), stream));
    } else {
      ORTHROS_NCCL_CHECK(
          ncclSend(b.states, state_bytes(cfg, tab.ns[rank_]), ncclUint8, last, comm_of(comm_), stream));
    }
    ORTHROS_NCCL_CHECK(ncclGroupEnd());
    return;
  }
  const std::size_t ob = static_cast<std::size_t>(T_out) * row_bytes(cfg, true);
  const std::size_t lb = static_cast<std::size_t>(T_out) * cfg.num_q_heads * sizeof(float);
  const int last = ranks_ - 1;
  if (rank_ == last) {
    require(b.o_parts && b.lse_parts, "the last rank's o_parts/lse_parts must not be null (T_out = ", T_out, ")");
    ORTHROS_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(b.o_parts) + last * ob, b.o_part, ob,
                                       cudaMemcpyDeviceToDevice, stream));
    ORTHROS_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<char*>(b.lse_parts) + last * lb, b.lse_part, lb,
                                       cudaMemcpyDeviceToDevice, stream));
  }
  ORTHROS_NCCL_CHECK(ncclGroupStart());
  if (rank_ == last) {
    for (int r = 0; r < last; ++r) {
      ORTHROS_NCCL_CHECK(ncclRecv(static_cast<char*>(b.o_parts) + r * ob, ob, ncclUint8, r, comm_of(comm_), stream));
      ORTHROS_NCCL_CHECK(
          ncclRecv(reinterpret_cast<char*>(b.lse_parts) + r * lb, lb, ncclUint8, r, comm_of(comm_), stream));
    }
  } else {
    ORTHROS_NCCL_CHECK(ncclSend(b.o_part, ob, ncclUint8, last, comm_of(comm_), stream));
    ORTHROS_NCCL_CHECK(ncclSend(b.lse_part, lb, ncclUint8, last, comm_of(comm_), stream));
  }
  ORTHROS_NCCL_CHECK(ncclGroupEnd());
}

void NcclTransport::allreduce(float* dev, std::size_t n, int op, cudaStream_t stream) {
  ORTHROS_NCCL_CHECK(ncclAllReduce(dev, dev, n, ncclFloat32, op == 1 ? ncclMax : ncclSum, comm_of(comm_), stream));
  ORTHROS_CUDA_CHECK(cudaStreamSynchronize(stream));
}
#else
namespace {
[[noreturn]] void no_nccl(const char* what) {
  throw Error(std::string(what) +
              ": this build has no NCCL transport (configure with -DORTHROS_NCCL=ON and NCCL at ORTHROS_NCCL_ROOT; "
              "ci/setup.sh unpacks the pinned nvidia-nccl-cu13 wheel into .deps/nccl)");
}
}  // namespace
bool cp_nccl_available() { return false; }
CpNcclId cp_nccl_unique_id() { no_nccl("cp_nccl_unique_id"); }
NcclTransport::NcclTransport(int ranks, int rank, const CpNcclId&) : ranks_(ranks), rank_(rank) {
  no_nccl("NcclTransport");
}
NcclTransport::~NcclTransport() = default;
void NcclTransport::exchange_halo(const AttentionConfig&, const CpLayout&, std::int64_t,
                                  const std::vector<CpRankBuffers>&, cudaStream_t) {
  no_nccl("NcclTransport::exchange_halo");
}
void NcclTransport::broadcast_q_out(const AttentionConfig&, std::int64_t, const std::vector<CpRankBuffers>&,
                                    cudaStream_t) {
  no_nccl("NcclTransport::broadcast_q_out");
}
void NcclTransport::gather_partials(const AttentionConfig&, const CpLayout&, std::int64_t,
                                    const std::vector<CpRankBuffers>&, cudaStream_t) {
  no_nccl("NcclTransport::gather_partials");
}
void NcclTransport::allreduce(float*, std::size_t, int, cudaStream_t) { no_nccl("NcclTransport::allreduce"); }
#endif

// ---- drivers ------------------------------------------------------------------------------------
void cp_attention(const AttentionConfig& cfg, const CpLayout& layout, std::int64_t T, std::int64_t T_out,
                  CpTransport& tr, const std::vector<CpRankBuffers>& local, cudaStream_t stream,
                  const CpOptions& opt) {
  detail::validate_config(cfg);
  check_layout(layout);
  require(layout.ranks() == tr.ranks(), "the layout has ", layout.ranks(), " shards but the transport ",
          tr.ranks(), " ranks");
  const std::vector<int> ranks = tr.local_ranks();
  require(local.size() == ranks.size(), "cp_attention: ", local.size(), " rank buffers for the transport's ",
          ranks.size(), " local ranks");
  const std::int64_t N = layout.total();
  require(T >= 0 && T <= N, "T (base queries) must be in [0, N = ", N, "] (got ", T, ")");
  require(T_out >= 0 && T_out <= T, "T_out must be in [0, T] (got T_out = ", T_out, ", T = ", T, ")");
  const bool last_local = ranks.back() == layout.ranks() - 1;
  for (size_t i = 0; i < local.size(); ++i) {
    const int r = ranks[i];
    const CpRows rows = cp_rank_rows(layout, r, T);
    if (rows.count > 0 || T_out > 0) check_kv(cfg, layout, r, local[i].kv);
    if (rows.count > 0)
      require(local[i].q && local[i].o, "rank ", r, ": q and o must not be null (", rows.count, " base rows)");
    if (T_out > 0) {
      require(local[i].q_out && local[i].o_part && local[i].lse_part, "rank ", r,
              ": q_out, o_part and lse_part must not be null (T_out = ", T_out, ")");
      require(local[i].scratch && local[i].scratch_bytes >= cp_scratch_bytes(cfg, T_out), "rank ", r,
              ": scratch must hold cp_scratch_bytes() = ", cp_scratch_bytes(cfg, T_out), " bytes (got ",
              local[i].scratch_bytes, ")");
    }
  }
  const bool state_path = T_out > 0 && cp_state_splits(cfg, layout, 0, T_out) > 0;
  if (T_out > 0 && last_local) {
    require(local.back().o_out, "the last rank (", layout.ranks() - 1, ") needs o_out (T_out = ", T_out, ")");
    if (state_path) {
      std::size_t need = 0;
      for (int r = 0; r < layout.ranks(); ++r) need += state_bytes(cfg, splits_for(cfg, layout.length[r]));
      require(local.back().states_all && local.back().states_all_bytes >= need, "the last rank (",
              layout.ranks() - 1, ") needs states_all of ", need,
              " bytes (sum of cp_states_bytes over the shards) on the state path; got ", local.back().states_all_bytes);
    } else {
      require(local.back().o_parts && local.back().lse_parts, "the last rank (", layout.ranks() - 1,
              ") needs o_parts and lse_parts (T_out = ", T_out, ")");
    }
  }

  cudaStream_t comm = opt.comm_stream ? opt.comm_stream : stream;
  cudaEvent_t ready = nullptr, halo = nullptr;
  if (comm != stream) {  // the shards (written on `stream`) must be complete before they are sent
    ORTHROS_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    ORTHROS_CUDA_CHECK(cudaEventCreateWithFlags(&halo, cudaEventDisableTiming));
    ORTHROS_CUDA_CHECK(cudaEventRecord(ready, stream));
    ORTHROS_CUDA_CHECK(cudaStreamWaitEvent(comm, ready, 0));
  }
  struct Events {
    cudaEvent_t a, b;
    ~Events() {
      if (a) cudaEventDestroy(a);
      if (b) cudaEventDestroy(b);
    }
  } guard{ready, halo};
  // 1. Window stream: interior rows (no halo needed) while the halo is in flight on `comm`.
  for (size_t i = 0; i < local.size(); ++i)
    cp_window_stream(cfg, layout, ranks[i], T, local[i], CpPart::interior, stream);
  if (!opt.halo_ready) tr.exchange_halo(cfg, layout, T, local, comm);
  if (comm != stream) {
    ORTHROS_CUDA_CHECK(cudaEventRecord(halo, comm));
    ORTHROS_CUDA_CHECK(cudaStreamWaitEvent(stream, halo, 0));
  }
  // 2. The boundary rows, which read the halo.
  for (size_t i = 0; i < local.size(); ++i)
    cp_window_stream(cfg, layout, ranks[i], T, local[i], CpPart::boundary, stream);
  if (T_out == 0) return;
  // 3. Output stream: partial states per rank, gathered to the last rank, merged in rank order.
  if (opt.broadcast_q_out) tr.broadcast_q_out(cfg, T_out, local, stream);
  for (size_t i = 0; i < local.size(); ++i) cp_output_partials(cfg, layout, ranks[i], T_out, local[i], stream);
  tr.gather_partials(cfg, layout, T_out, local, stream);
  if (!last_local) return;
  if (state_path) {
    const StateTable tab = state_table(cfg, layout);
    const CpRankBuffers& b = local.back();
    switch (cfg.dtype) {
      case DType::f32:
        cp_merge_states_kernel<float><<<cfg.num_q_heads, cfg.head_dim, 0, stream>>>(
            b.states_all, static_cast<float*>(b.o_out), b.lse_out, tab, cfg.head_dim);
        break;
      case DType::f16:
        cp_merge_states_kernel<__half><<<cfg.num_q_heads, cfg.head_dim, 0, stream>>>(
            b.states_all, static_cast<__half*>(b.o_out), b.lse_out, tab, cfg.head_dim);
        break;
      case DType::bf16:
        cp_merge_states_kernel<__nv_bfloat16><<<cfg.num_q_heads, cfg.head_dim, 0, stream>>>(
            b.states_all, static_cast<__nv_bfloat16*>(b.o_out), b.lse_out, tab, cfg.head_dim);
        break;
    }
    ORTHROS_CUDA_LAUNCH_CHECK("cp_merge_states_kernel");
  } else {
    cp_merge_partials(cfg, layout.ranks(), T_out, local.back().o_parts, local.back().lse_parts, local.back().o_out,
                      local.back().lse_out, stream);
  }
}

void cp_decode_step(const AttentionConfig& cfg, CpLayout& layout, CpTransport& tr,
                    const std::vector<CpRankBuffers>& local, const void* k_new, const void* v_new,
                    cudaStream_t stream, const CpOptions& opt) {
  detail::validate_config(cfg);
  check_layout(layout);
  const std::vector<int> ranks = tr.local_ranks();
  require(local.size() == ranks.size() && !local.empty(), "cp_decode_step: ", local.size(),
          " rank buffers for the transport's ", ranks.size(), " local ranks");
  const int last = layout.ranks() - 1;
  if (ranks.back() == last) {
    const CpRankKV& kv = local.back().kv;
    const std::int64_t len = layout.length[last];
    require(kv.shard_capacity > len, "cp_decode_step: the last rank's shard is full (shard_capacity ",
            kv.shard_capacity, ", length ", len, "); allocate room for the decode steps");
    require(k_new && v_new, "cp_decode_step: k_new/v_new must not be null on the last rank");
    const std::size_t kvb = row_bytes(cfg, false);
    ORTHROS_CUDA_CHECK(cudaMemcpyAsync(at_rows(kv.k, kv.halo_rows + len, kvb), k_new, kvb, cudaMemcpyDeviceToDevice,
                                       stream));
    ORTHROS_CUDA_CHECK(cudaMemcpyAsync(at_rows(kv.v, kv.halo_rows + len, kvb), v_new, kvb, cudaMemcpyDeviceToDevice,
                                       stream));
  }
  CpLayout grown = layout;
  grown.length[last] += 1;
  cp_attention(cfg, grown, 1, 1, tr, local, stream, opt);
  layout = grown;
}

}  // namespace orthros::cuda
