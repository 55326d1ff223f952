/// \file context_parallel.hpp
/// \brief Context parallelism for Orthros attention, written plainly on the CPU: the
/// decomposition a multi-GPU implementation performs, one rank after another, so that it can be
/// proved equal to the single-device operator orthros::orthros_attention (attention.hpp).
///
/// The sequence's KV cache (positions 1..N, 0-based cache rows 0..N-1) is cut into R contiguous
/// **shards**, one per **rank** (GPU): rank r holds rows `[start_r, start_r + len_r)`, with
/// arbitrary lengths `len_r >= 1` (orthros::ShardLayout). A call's T base queries are the last T
/// rows (P = N - T rows were cached before), its T_out output queries the last T_out of those,
/// exactly as in orthros_attention. Then (docs/context_parallel.md draws it):
///
///   - **Window stream** (base queries, SWA): a base query at row t sees `[max(0, t-w+1), t]`.
///     For the queries of rank r that range lies inside rank r's shard plus its **halo**: the
///     `min(w-1, start_r)` rows just before the shard, received from the previous rank(s) (the
///     halo spans several ranks when their shards are shorter than w-1). Each query row runs
///     orthros::attend_row over the same keys in the same order as on one device, so the window
///     stream (o, lse) is **bitwise** equal to orthros_attention's.
///   - **Output stream** (full causal attention): every rank computes, for every output query,
///     a **partial state** (o_r normalized over its own keys, lse_r) over the keys of its shard
///     the query sees (split-KV with the shard as the split); the states are merged in rank
///     order by their LSEs (orthros::merge_partial_states). Equal to the single device within
///     rounding (docs/context_parallel.md derives the bound); bitwise when only one rank holds
///     keys of the row (R = 1, or an output query inside rank 0's shard).
///   - **KV cache**: stays sharded (orthros::ShardedKV); nothing ever gathers it. A decode step
///     appends the new token's key/value to the last rank's shard
///     (orthros::context_parallel_decode_step).
///
/// The regimes are the same calls as for one device (SPEC §4): PT (P = 0, T_out = T), SFT
/// (P = 0, 0 < T_out < T), prefill (P = 0, T_out = 1), a chunked-prefill chunk (P > 0,
/// T_out in {0, 1}: the shards describe the cache after the chunk), decode (T = T_out = 1).
#pragma once

#include "orthros/attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace orthros {

/// Where the shards of one sequence lie: rank r holds the contiguous cache rows
/// `[start[r], start[r] + length[r])` (0-based), ranks in ascending position order, together
/// covering rows `0 .. total()-1` exactly once. Built (and validated) by make_shard_layout().
struct ShardLayout {
  std::vector<Eigen::Index> start;   ///< start[r]: first cache row of rank r's shard
  std::vector<Eigen::Index> length;  ///< length[r] >= 1: rows in rank r's shard

  /// Number of ranks R.
  int ranks() const { return static_cast<int>(length.size()); }
  /// One past the last cache row of rank r's shard.
  Eigen::Index end(int r) const { return start[r] + length[r]; }
  /// Cache rows N held by all ranks together.
  Eigen::Index total() const { return length.empty() ? 0 : end(ranks() - 1); }
  /// The rank whose shard holds cache row `row` (0 <= row < total()).
  int owner(Eigen::Index row) const {
    int r = 0;
    while (r + 1 < ranks() && start[r + 1] <= row) ++r;
    return r;
  }
};

namespace detail {
inline std::string format_lengths(const std::vector<Eigen::Index>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}
}  // namespace detail

/// Validates a vector of shard lengths against a sequence of `total` cache rows and returns the
/// layout (each rank's first row is the sum of the lengths before it).
/// \param shard_lengths one entry per rank, in position order: rows held by that rank
/// \param total         cache rows N = P + T of the sequence the shards must cover
/// \throws orthros::Error (a std::invalid_argument) when `shard_lengths` is empty, an entry is
///   < 1, or the entries do not sum to `total`; the message names `shard_lengths`, the offending
///   entry and the whole vector.
/// Source: docs/context_parallel.md (a sequence cut into R contiguous shards).
inline ShardLayout make_shard_layout(const std::vector<Eigen::Index>& shard_lengths, Eigen::Index total) {
  require(!shard_lengths.empty(), "shard_lengths must name at least one rank (got an empty vector for ", total,
          " cache rows)");
  ShardLayout layout;
  Eigen::Index sum = 0;
  for (size_t r = 0; r < shard_lengths.size(); ++r) {
    require(shard_lengths[r] >= 1, "shard_lengths[", r, "] must be >= 1 (got ", shard_lengths[r],
            "); every rank holds at least one position; shard_lengths = ", detail::format_lengths(shard_lengths));
    layout.start.push_back(sum);
    layout.length.push_back(shard_lengths[r]);
    sum += shard_lengths[r];
  }
  require(sum == total, "shard_lengths sum to ", sum, " but the sequence has ", total,
          " cache rows (P+T); shard_lengths = ", detail::format_lengths(shard_lengths));
  return layout;
}

/// A KV cache left sharded: rank r holds the keys and values of its own shard only.
/// `k[r]`, `v[r]`: `[len_r, H_kv*D]` row-major (rows are the shard's positions in order, the
/// `[len_r, H_kv, D]` layout of tensor.hpp). Source: docs/context_parallel.md (the KV cache left sharded).
template <typename S>
struct ShardedKV {
  std::vector<Mat<S>> k;  ///< k[r]: keys of rank r's shard, [len_r, H_kv*D]
  std::vector<Mat<S>> v;  ///< v[r]: values of rank r's shard, [len_r, H_kv*D]

  /// Number of ranks R.
  int ranks() const { return static_cast<int>(k.size()); }
  /// The shard lengths len_r (rows of k[r]).
  std::vector<Eigen::Index> shard_lengths() const {
    std::vector<Eigen::Index> n;
    for (const auto& m : k) n.push_back(m.rows());
    return n;
  }
};

/// Cuts a single-device KV cache into R contiguous shards (the scatter a context-parallel
/// prefill starts from; each rank computes its own keys/values in a real model).
/// \param k, v          keys/values `[N, H_kv*D]` of positions 1..N
/// \param shard_lengths rows per rank, in position order (validated by make_shard_layout())
/// \returns the ShardedKV with `k[r] = k.middleRows(start_r, len_r)` (likewise v)
/// \throws orthros::Error on bad `shard_lengths` (see make_shard_layout()) or when `v`'s shape
///   differs from `k`'s.
template <typename S>
ShardedKV<S> shard_kv(const Mat<S>& k, const Mat<S>& v, const std::vector<Eigen::Index>& shard_lengths) {
  require(v.rows() == k.rows() && v.cols() == k.cols(), "v must have the shape of k [", k.rows(), ", ", k.cols(),
          "]; got [", v.rows(), ", ", v.cols(), "]");
  const ShardLayout layout = make_shard_layout(shard_lengths, k.rows());
  ShardedKV<S> c;
  for (int r = 0; r < layout.ranks(); ++r) {
    c.k.push_back(k.middleRows(layout.start[r], layout.length[r]));
    c.v.push_back(v.middleRows(layout.start[r], layout.length[r]));
  }
  return c;
}

/// Concatenates per-rank row blocks in rank order: `[sum_r rows_r, C]`. Only for checking a
/// sharded tensor against a single-device one; the context-parallel computation never gathers.
/// \throws orthros::Error when the blocks' column counts differ.
template <typename S>
Mat<S> gather_shards(const std::vector<Mat<S>>& shards) {
  Eigen::Index rows = 0, cols = shards.empty() ? 0 : shards[0].cols();
  for (size_t r = 0; r < shards.size(); ++r) {
    require(shards[r].cols() == cols, "gather_shards: shard ", r, " has ", shards[r].cols(), " columns, shard 0 has ",
            cols);
    rows += shards[r].rows();
  }
  Mat<S> out(rows, cols);
  Eigen::Index at = 0;
  for (const auto& m : shards) {
    out.middleRows(at, m.rows()) = m;
    at += m.rows();
  }
  return out;
}

/// Validates a sharded cache against the head dims and returns its layout.
/// \throws orthros::Error when the cache has no rank, `k` and `v` hold different rank counts, a
///   shard is empty (`cache.k[r] is empty`), a shard's `k` is not `[len_r, H_kv*D]`, its `v` differs from its `k` in
///   shape, or a key/value is not finite; messages name `cache.k[r]` / `cache.v[r]` and the values.
template <typename S>
ShardLayout check_sharded_kv(const ShardedKV<S>& cache, const AttentionDims& dims) {
  check_dims(dims);
  require(!cache.k.empty(), "the sharded cache must hold at least one rank (cache.k is empty)");
  require(cache.v.size() == cache.k.size(), "cache.k holds ", cache.k.size(), " shards but cache.v holds ",
          cache.v.size());
  const Eigen::Index ckv = Eigen::Index(dims.num_kv_heads) * dims.head_dim;
  Eigen::Index total = 0;
  for (size_t r = 0; r < cache.k.size(); ++r) {
    const Mat<S>& k = cache.k[r];
    const Mat<S>& v = cache.v[r];
    require(k.rows() >= 1, "cache.k[", r, "] is empty; every rank holds at least one position (shard lengths ",
            detail::format_lengths(cache.shard_lengths()), ")");
    require(k.cols() == ckv, "cache.k[", r, "] must be [len, H_kv, D] = [len, ", dims.num_kv_heads, ", ",
            dims.head_dim, "] (", ckv, " columns); got ", k.cols(), " columns");
    require(v.rows() == k.rows() && v.cols() == k.cols(), "cache.v[", r, "] must have the shape of cache.k[", r,
            "] [", k.rows(), ", ", k.cols(), "]; got [", v.rows(), ", ", v.cols(), "]");
    detail::require_finite(k, detail::cat("cache.k[", r, "]").c_str(), dims.head_dim);
    detail::require_finite(v, detail::cat("cache.v[", r, "]").c_str(), dims.head_dim);
    total += k.rows();
  }
  return make_shard_layout(cache.shard_lengths(), total);
}

/// The halo of one rank: the keys/values of the cache rows just before its shard that its
/// window queries can see.
template <typename S>
struct Halo {
  Eigen::Index first_row = 0;  ///< cache row of the halo's first row (= start_r - rows)
  Mat<S> k;                    ///< [rows, H_kv*D], rows = min(w-1, start_r)
  Mat<S> v;                    ///< [rows, H_kv*D]
  std::vector<int> from_ranks; ///< the previous ranks the rows came from, ascending (empty: no halo)
};

/// The halo rule: rank r's base queries at rows t >= start_r see keys down to row
/// t-w+1 >= start_r-(w-1), so rank r needs the `min(w-1, start_r)` rows before its shard and
/// nothing else. They are received from the previous rank(s): from rank r-1, and from r-2, r-3, ...
/// when the shards in between are shorter than w-1. On GPUs this is a send/recv from each of
/// those ranks (a halo, not a ring).
/// \param cache  the sharded cache (layout as `layout`)
/// \param layout its shard layout (check_sharded_kv())
/// \param rank   receiving rank r, 0 <= r < R
/// \param window w >= 1 (w = 1: empty halo; w >= start_r + 1: every row before the shard)
/// \returns the halo, rows in position order.
/// \throws orthros::Error when `rank` is out of range or `window < 1`.
template <typename S>
Halo<S> receive_halo(const ShardedKV<S>& cache, const ShardLayout& layout, int rank, std::int64_t window) {
  using Index = Eigen::Index;
  check_window(window);
  require(rank >= 0 && rank < layout.ranks(), "rank must be in [0, ", layout.ranks(), ") (got ", rank, ")");
  const Index start = layout.start[rank];
  const Index rows = std::min<Index>(window - 1, start);
  Halo<S> h;
  h.first_row = start - rows;
  h.k.resize(rows, cache.k[rank].cols());
  h.v.resize(rows, cache.v[rank].cols());
  for (int src = 0; src < rank; ++src) {  // ranks whose shard overlaps [first_row, start)
    const Index lo = std::max(layout.start[src], h.first_row), hi = layout.end(src);  // hi <= start
    if (lo >= hi) continue;
    h.k.middleRows(lo - h.first_row, hi - lo) = cache.k[src].middleRows(lo - layout.start[src], hi - lo);
    h.v.middleRows(lo - h.first_row, hi - lo) = cache.v[src].middleRows(lo - layout.start[src], hi - lo);
    h.from_ranks.push_back(src);
  }
  return h;
}

/// The window stream of one rank (paper Eq. 2, left): for each base query of this call
/// held by rank r (cache rows `first_row .. first_row + q.rows() - 1`, all inside the shard)
///   o_t = softmax_{j in [max(0, t-w+1), t]}(s q_t.k_j) v_j,
/// computed by orthros::attend_row on the rank's local keys `[halo; shard]`. The key rows and
/// their order are those of the single device, so o and lse are bitwise equal to
/// orthros_attention's rows.
/// \param q         base queries of the rank's rows, `[T_r, H_q*D]`
/// \param first_row cache row of q's first row (start_r <= first_row, first_row + T_r <= end_r)
/// \param halo      receive_halo() of this rank
/// \param k_shard, v_shard this rank's shard `[len_r, H_kv*D]`
/// \param shard_start start_r
/// \param dims, opt head dims and window/scale (validated by the caller)
/// \returns AttentionResult with `o` `[T_r, H_q*D]` and `lse` `[T_r, H_q]`; `o_out`/`lse_out` empty.
template <typename S>
AttentionResult<S> rank_window_stream(const Mat<S>& q, Eigen::Index first_row, const Halo<S>& halo,
                                      const Mat<S>& k_shard, const Mat<S>& v_shard, Eigen::Index shard_start,
                                      const AttentionDims& dims, const AttentionOptions& opt) {
  using Index = Eigen::Index;
  using Acc = AccumT<S>;
  const int Hq = dims.num_q_heads, D = dims.head_dim, group = dims.num_q_heads / dims.num_kv_heads;
  const Acc scale = static_cast<Acc>(softmax_scale(opt, D));
  // The rank's local keys/values: halo rows then shard rows; local row 0 is cache row halo.first_row.
  Mat<S> k_local(halo.k.rows() + k_shard.rows(), k_shard.cols());
  Mat<S> v_local(halo.v.rows() + v_shard.rows(), v_shard.cols());
  k_local << halo.k, k_shard;
  v_local << halo.v, v_shard;
  const Index base = halo.first_row;
  require(base + halo.k.rows() == shard_start, "internal: halo rows [", base, ", ", base + halo.k.rows(),
          ") do not end at the shard start ", shard_start);
  AttentionResult<S> r;
  r.o.resize(q.rows(), Index(Hq) * D);
  r.lse.resize(q.rows(), Hq);
  r.o_out.resize(0, Index(Hq) * D);
  r.lse_out.resize(0, Hq);
  for (Index i = 0; i < q.rows(); ++i)
    for (int h = 0; h < Hq; ++h) {
      const Index t = first_row + i;                           // cache row of the query
      const Index lo = std::max<Index>(0, t - opt.window + 1);  // window start, >= base by the halo rule
      attend_row<S>(q.data() + i * q.cols() + Index(h) * D, k_local, v_local, Index(h / group) * D, D, lo - base,
                    t - base, scale, r.o.data() + i * r.o.cols() + Index(h) * D, &r.lse(i, h));
    }
  return r;
}

/// Partial states of the output stream held by one rank (split-KV with the rank's shard as the
/// split), or their merge. For output query row i and query head h, over the key set K of the
/// state (the query's keys that lie in the shard):
///   lse(i,h)  = log sum_{j in K} exp(s q.k_j)            (natural log, `AccumT<S>`)
///   o(i,h,:)  = sum_{j in K} exp(s q.k_j - lse) v_j       (normalized over K)
/// This carries the same information as FlashAttention's unnormalized state (acc, m, l):
/// acc = l e^m o and lse = m + log l; the normalized form is what attend_row returns and cannot
/// overflow. An **empty state** (the rank holds none of the row's keys: its shard starts after
/// the query) is `lse = -inf`, `o = 0`; it takes no part in a merge.
template <typename S>
struct PartialStates {
  Mat<S> o;            ///< [T_out, H_q*D] normalized over the state's keys; 0 for an empty state
  Mat<AccumT<S>> lse;  ///< [T_out, H_q]   LSE over the state's keys; -inf for an empty state
};

/// One rank's partial states for every output query of the call (split-KV over the
/// ranks' shards): output query i at cache row `first_out_row + i` sees cache rows `[0, t]`;
/// of those, rank r holds `[start_r, min(t, end_r - 1)]`, on which orthros::attend_row gives
/// (o_r, lse_r). Rows with t < start_r get the empty state. On GPUs the output queries are
/// broadcast to every rank (for prefill and decode, one query per sequence).
/// \param q_out         output queries `[T_out, H_q*D]`
/// \param first_out_row cache row of q_out's first row
/// \param k_shard, v_shard this rank's shard `[len_r, H_kv*D]`
/// \param shard_start   start_r
/// \param dims, opt     head dims and scale (validated by the caller; the window is not used)
/// \returns the rank's PartialStates, `[T_out, H_q*D]` and `[T_out, H_q]`.
template <typename S>
PartialStates<S> rank_output_partials(const Mat<S>& q_out, Eigen::Index first_out_row, const Mat<S>& k_shard,
                                      const Mat<S>& v_shard, Eigen::Index shard_start, const AttentionDims& dims,
                                      const AttentionOptions& opt) {
  using Index = Eigen::Index;
  using Acc = AccumT<S>;
  const int Hq = dims.num_q_heads, D = dims.head_dim, group = dims.num_q_heads / dims.num_kv_heads;
  const Acc scale = static_cast<Acc>(softmax_scale(opt, D));
  PartialStates<S> p;
  p.o = Mat<S>::Zero(q_out.rows(), Index(Hq) * D);
  p.lse = Mat<Acc>::Constant(q_out.rows(), Hq, -std::numeric_limits<Acc>::infinity());
  for (Index i = 0; i < q_out.rows(); ++i) {
    const Index t = first_out_row + i;
    if (t < shard_start) continue;  // empty state: the whole shard lies after the query
    const Index hi = std::min<Index>(t, shard_start + k_shard.rows() - 1) - shard_start;  // local rows [0, hi]
    // A shard whose scores all round to -inf (huge negative q.k in f16/bf16) comes back from
    // attend_row as an empty state (o = 0, lse = -inf): zero weight, as on one device.
    for (int h = 0; h < Hq; ++h)
      attend_row<S>(q_out.data() + i * q_out.cols() + Index(h) * D, k_shard, v_shard, Index(h / group) * D, D, 0, hi,
                    scale, p.o.data() + i * p.o.cols() + Index(h) * D, &p.lse(i, h));
  }
  return p;
}

/// Merges partial states over disjoint key sets into the state over their union, in rank order
/// (the split-KV / FlashDecoding merge). Per output row and head, over the non-empty
/// states r = 0, 1, ... in ascending order, in `AccumT<S>`:
/// \f[
///   M = \max_r \mathrm{lse}_r,\quad
///   e_r = e^{\mathrm{lse}_r - M},\quad
///   L = \sum_r e_r,\quad
///   o = \sum_r \frac{e_r}{L}\, o_r,\quad
///   \mathrm{lse} = M + \log L .
/// \f]
/// Exact in real arithmetic: with Z_r = sum_{j in K_r} e^{s_j} = e^{lse_r}, the union has
/// Z = sum_r Z_r, and o = sum_r (Z_r / Z) o_r. With one non-empty state the merge is the identity
/// bit for bit (the state is copied: signed zeros kept), so R = 1 equals the single device
/// bitwise. The rounding bound of the merge is derived in docs/context_parallel.md.
/// \param states one PartialStates per rank, in rank order, all of the same shape
/// \returns the merged state `[T_out, H_q*D]`, `[T_out, H_q]` (o rounded once to S)
/// \throws orthros::Error when `states` is empty, shapes differ, a row has no non-empty state, or a
///   state holds a NaN or +inf lse or a non-finite o in a non-empty row (names state, row, head).
template <typename S>
PartialStates<S> merge_partial_states(const std::vector<PartialStates<S>>& states) {
  using Index = Eigen::Index;
  using Acc = AccumT<S>;
  require(!states.empty(), "merge_partial_states needs at least one state");
  const Index rows = states[0].lse.rows(), Hq = states[0].lse.cols(), cols = states[0].o.cols();
  require(Hq >= 1 && cols % Hq == 0, "merge_partial_states: o has ", cols, " columns for ", Hq, " heads");
  const Index D = cols / Hq;
  for (size_t r = 0; r < states.size(); ++r)
    require(states[r].lse.rows() == rows && states[r].lse.cols() == Hq && states[r].o.rows() == rows &&
                states[r].o.cols() == cols,
            "merge_partial_states: state ", r, " is o [", states[r].o.rows(), ", ", states[r].o.cols(), "], lse [",
            states[r].lse.rows(), ", ", states[r].lse.cols(), "]; state 0 is o [", rows, ", ", cols, "], lse [", rows,
            ", ", Hq, "]");
  PartialStates<S> m;
  m.o.resize(rows, cols);
  m.lse.resize(rows, Hq);
  std::vector<Acc> e(states.size()), acc(static_cast<size_t>(D));
  for (Index i = 0; i < rows; ++i)
    for (Index h = 0; h < Hq; ++h) {
      Acc M = -std::numeric_limits<Acc>::infinity();
      int live = 0;
      size_t only = 0;
      for (size_t r = 0; r < states.size(); ++r) {
        const Acc l = states[r].lse(i, h);
        require(!std::isnan(static_cast<double>(l)) && l != std::numeric_limits<Acc>::infinity(),
                "merge_partial_states: state ", r, " has lse ", static_cast<double>(l), " at output row ", i, " head ",
                h, " (must be finite, or -inf for an empty state)");
        if (l == -std::numeric_limits<Acc>::infinity()) continue;
        const S* o_r = states[r].o.data() + i * cols + h * D;
        for (Index d = 0; d < D; ++d)
          require(std::isfinite(static_cast<double>(o_r[d])), "merge_partial_states: state ", r, " has o ",
                  static_cast<double>(o_r[d]), " at output row ", i, " head ", h, " dim ", d, " (must be finite)");
        M = std::max(M, l);
        ++live;
        only = r;
      }
      require(live > 0, "merge_partial_states: output row ", i, " head ", h, " has no keys in any state");
      if (live == 1) {  // the identity, bit for bit (signed zeros included)
        for (Index d = 0; d < D; ++d) m.o(i, h * D + d) = states[only].o(i, h * D + d);
        m.lse(i, h) = states[only].lse(i, h);
        continue;
      }
      Acc L = 0;
      for (size_t r = 0; r < states.size(); ++r) {
        if (states[r].lse(i, h) == -std::numeric_limits<Acc>::infinity()) continue;  // empty state
        e[r] = std::exp(states[r].lse(i, h) - M);
        L += e[r];
      }
      std::fill(acc.begin(), acc.end(), Acc(0));
      for (size_t r = 0; r < states.size(); ++r) {
        if (states[r].lse(i, h) == -std::numeric_limits<Acc>::infinity()) continue;
        const Acc w = e[r] / L;
        const S* o_r = states[r].o.data() + i * cols + h * D;
        for (Index d = 0; d < D; ++d) acc[d] += w * static_cast<Acc>(o_r[d]);
      }
      for (Index d = 0; d < D; ++d) m.o(i, h * D + d) = static_cast<S>(acc[d]);
      m.lse(i, h) = M + std::log(L);
    }
  return m;
}

/// The Orthros attention operator computed context-parallel over a sharded KV cache:
/// the same inputs and result as orthros::orthros_attention, with k/v held as R shards.
///
/// Per rank r, using only its own shard, its halo and the broadcast output queries:
///   1. window stream of its base queries (rows `[max(start_r, P), end_r)`): receive_halo(),
///      then rank_window_stream();
///   2. output stream: rank_output_partials() for all T_out output queries;
/// then merge_partial_states() in rank order gives o_out/lse_out. The returned o/lse rows are the
/// ranks' rows in position order (each rank keeps its own rows on GPUs; here they are assembled
/// into one AttentionResult for comparison).
///
/// Shapes (row-major; `[T, H, D]` stored as `[T, H*D]`):
///   - `q`     `[T, H_q*D]`   base queries of cache rows P .. P+T-1 (positions P+1 .. P+T), P = N - T
///   - `cache` R shards `k[r]`, `v[r]` `[len_r, H_kv*D]`, together positions 1..N (this call's keys included)
///   - `q_out` `[T_out, H_q*D]` output queries of the last T_out base positions (0 <= T_out <= T)
/// Returns o `[T, H_q*D]`, o_out `[T_out, H_q*D]`, lse `[T, H_q]`, lse_out `[T_out, H_q]`.
/// Exactness: o and lse are bitwise equal to orthros_attention on the gathered cache; o_out and
/// lse_out equal it within the bound of docs/context_parallel.md, bitwise when only one rank holds
/// keys of the row.
///
/// \throws orthros::Error on everything orthros_attention rejects (dims, window, scale, shapes,
///   non-finite values, scores overflowing S) and on a bad sharded cache (check_sharded_kv()).
template <typename S>
AttentionResult<S> context_parallel_attention(const Mat<S>& q, const ShardedKV<S>& cache, const Mat<S>& q_out,
                                              const AttentionDims& dims, const AttentionOptions& opt) {
  using Index = Eigen::Index;
  check_dims(dims);
  check_window(opt.window);
  (void)softmax_scale(opt, dims.head_dim);  // validates a custom scale
  const ShardLayout layout = check_sharded_kv(cache, dims);
  const int Hq = dims.num_q_heads, D = dims.head_dim;
  const Index N = layout.total(), T = q.rows(), T_out = q_out.rows(), P = N - T;
  require(q.cols() == Index(Hq) * D, "q must be [T, H_q, D] = [T, ", Hq, ", ", D, "] (", Hq * D,
          " columns); got ", q.cols(), " columns");
  require(q_out.cols() == Index(Hq) * D, "q_out must be [T_out, H_q, D] = [T_out, ", Hq, ", ", D, "] (", Hq * D,
          " columns); got ", q_out.cols(), " columns");
  require(P >= 0, "the sharded cache must hold P+T >= T rows (T = q rows = ", T, "); its shards hold ", N,
          " rows: ", detail::format_lengths(cache.shard_lengths()));
  require(T_out <= T, "T_out must be <= T (got T_out = ", T_out, ", T = ", T, ")");
  detail::require_finite(q, "q", D);
  detail::require_finite(q_out, "q_out", D);

  AttentionResult<S> result;
  result.o.resize(T, Index(Hq) * D);
  result.lse.resize(T, Hq);
  std::vector<PartialStates<S>> partials;
  for (int r = 0; r < layout.ranks(); ++r) {
    // 1. Window stream of the rank's base queries (none when its shard lies inside the cached prefix).
    const Index q_first = std::max(layout.start[r], P), q_end = layout.end(r);
    if (q_first < q_end) {
      const Halo<S> halo = receive_halo(cache, layout, r, opt.window);
      const AttentionResult<S> w = rank_window_stream<S>(q.middleRows(q_first - P, q_end - q_first), q_first, halo,
                                                         cache.k[r], cache.v[r], layout.start[r], dims, opt);
      result.o.middleRows(q_first - P, q_end - q_first) = w.o;
      result.lse.middleRows(q_first - P, q_end - q_first) = w.lse;
    }
    // 2. Output stream: this rank's partial states over its own keys.
    partials.push_back(rank_output_partials<S>(q_out, N - T_out, cache.k[r], cache.v[r], layout.start[r], dims, opt));
  }
  // 3. Merge the partial states in rank order (only when there are output queries).
  if (T_out > 0) {
    PartialStates<S> merged = merge_partial_states(partials);
    result.o_out = std::move(merged.o);
    result.lse_out = std::move(merged.lse);
  } else {
    result.o_out.resize(0, Index(Hq) * D);
    result.lse_out.resize(0, Hq);
  }
  detail::require_finite_result(result, D);
  return result;
}

/// One decode step over a sharded cache (SPEC §4 decode: T = T_out = 1, P = N): the
/// new token's key/value are appended to the **last** rank's shard (the cache stays sharded and
/// grows there), then the base query attends to its window (the last rank's shard plus its halo
/// when the shard is shorter than w) and the output query is split-KV over all shards, merged
/// by the LSE states: context_parallel_attention() with T = 1.
/// \param cache the sharded cache of positions 1..N; on return it holds 1..N+1 (`k[R-1]`, `v[R-1]`
///   one row longer). Unchanged if the call throws.
/// \param q     base query of position N+1, `[1, H_q*D]`
/// \param k_new, v_new its key/value, `[1, H_kv*D]`
/// \param q_out its output-specific query, `[1, H_q*D]`
/// \param dims, opt head dims, window and scale
/// \returns o, o_out `[1, H_q*D]`, lse, lse_out `[1, H_q]`: equal to
///   `orthros_attention(q, k, v, q_out)` on the gathered cache (o/lse bitwise, o_out/lse_out within
///   the bound of docs/context_parallel.md).
/// \throws orthros::Error when q, k_new, v_new or q_out is not one row of the right width, or on
///   anything context_parallel_attention() rejects.
template <typename S>
AttentionResult<S> context_parallel_decode_step(ShardedKV<S>& cache, const Mat<S>& q, const Mat<S>& k_new,
                                                const Mat<S>& v_new, const Mat<S>& q_out, const AttentionDims& dims,
                                                const AttentionOptions& opt) {
  using Index = Eigen::Index;
  check_dims(dims);
  (void)check_sharded_kv(cache, dims);
  const Index ckv = Index(dims.num_kv_heads) * dims.head_dim;
  require(q.rows() == 1 && q_out.rows() == 1, "a decode step has one base query and one output query (got q [",
          q.rows(), ", ", q.cols(), "], q_out [", q_out.rows(), ", ", q_out.cols(), "])");
  require(k_new.rows() == 1 && k_new.cols() == ckv, "k_new must be [1, H_kv, D] = [1, ", dims.num_kv_heads, ", ",
          dims.head_dim, "] (", ckv, " columns); got [", k_new.rows(), ", ", k_new.cols(), "]");
  require(v_new.rows() == 1 && v_new.cols() == ckv, "v_new must be [1, H_kv, D] = [1, ", dims.num_kv_heads, ", ",
          dims.head_dim, "] (", ckv, " columns); got [", v_new.rows(), ", ", v_new.cols(), "]");
  detail::require_finite(k_new, "k_new", dims.head_dim);  // named here, before the append
  detail::require_finite(v_new, "v_new", dims.head_dim);
  Mat<S>& k_last = cache.k.back();
  Mat<S>& v_last = cache.v.back();
  const Index n = k_last.rows();
  k_last.conservativeResize(n + 1, Eigen::NoChange);
  v_last.conservativeResize(n + 1, Eigen::NoChange);
  k_last.row(n) = k_new.row(0);
  v_last.row(n) = v_new.row(0);
  try {
    return context_parallel_attention<S>(q, cache, q_out, dims, opt);
  } catch (...) {  // leave the cache as it was
    k_last.conservativeResize(n, Eigen::NoChange);
    v_last.conservativeResize(n, Eigen::NoChange);
    throw;
  }
}

}  // namespace orthros
