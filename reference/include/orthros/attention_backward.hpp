/// \file attention_backward.hpp
/// \brief The backward of the Orthros attention operator (attention.hpp), written like the
/// forward: one function per query row, the softmax backward recomputed from the saved LSE
/// (FlashAttention-2's form), fixed summation orders, templated on the scalar type.
///
/// For one query row q (head h, key range [lo, hi], softmax scale s) with forward output o and
/// log-sum-exp lse, and upstream gradient dO = `do`:
/// \code{.unparsed}
///   s_j   = s q·k_j                         (the forward's scores, recomputed)
///   P_j   = exp(s_j - lse)                  (the forward's probabilities, from the saved LSE)
///   dP_j  = dO·v_j                          (dL/dP_j, since o = Σ_j P_j v_j)
///   Δ     = dO·o  = Σ_j P_j dP_j            (FlashAttention-2's rowsum(dO ⊙ O))
///   dS_j  = P_j (dP_j - Δ)                  (softmax Jacobian: dS_j = Σ_i P_j(δ_ij - P_i) dP_i)
///   dq    = s Σ_j dS_j k_j
///   dk_j += s dS_j q,   dv_j += P_j dO      (summed over every query that sees key j)
/// \endcode
///
/// Order of the dk/dv sums (fixed, thread-independent): for key row j of KV head g,
/// \code{.unparsed}
///   dk_j = Σ_{h in group g, ascending} s·( Σ_{base rows i ascending} dS_ij q_i + Σ_{output rows i ascending} dS_ij q'_i )
///   dv_j = Σ_{h in group g, ascending}   ( Σ_{base rows i ascending} P_ij dO_i + Σ_{output rows i ascending} P_ij dO'_i )
/// \endcode
/// with one accumulator per (head, stream). Consequences used by verify/ (SPEC §4.4):
///   - a query whose upstream gradient is zero adds exact zeros (x + ±0 = x): SFT equals PT with
///     the loss masked to the last T_out positions, bitwise;
///   - H_kv = H_q with repeated KV heads, then summed over each group, equals GQA bitwise;
///   - equal streams (q' = q, dO' = dO, w >= P+T) give dk = 2 × the base stream's dk, bitwise.
#pragma once

#include "orthros/attention.hpp"

#include <vector>

namespace orthros {

/// Gradients of the attention operator with respect to its four inputs. Same scalar type as
/// the inputs; at bf16/f16 every sum is accumulated in float32 and rounded once at the end.
template <typename S>
struct AttentionGrads {
  Mat<S> dq;      ///< [T, H_q*D]      dL/dq (base queries)
  Mat<S> dq_out;  ///< [T_out, H_q*D]  dL/dq_out (output-specific queries)
  Mat<S> dk;      ///< [P+T, H_kv*D]   dL/dk: both streams, every query head of the GQA group; 0 where unseen
  Mat<S> dv;      ///< [P+T, H_kv*D]   dL/dv: same sums as dk
};

/// Prefix of the orthros::Error thrown when finite inputs make a gradient overflow S (the naive
/// oracle at that precision has no finite answer; see check.hpp).
inline constexpr const char* kGradientOverflowPrefix = "attention gradients overflow";

namespace detail {

/// What one query row keeps for the key-side sums: its key range and, per key, P_j and dS_j.
template <typename S>
struct RowGrad {
  Eigen::Index lo = 0, hi = -1;  ///< 0-based cache rows [lo, hi] the query sees
  std::vector<S> p;              ///< P_j, rounded to S (the forward's step 3)
  std::vector<S> ds;             ///< dS_j, rounded to S
};

}  // namespace detail

/// The query side of the backward for one query row of one head (see the file comment):
/// recomputes P from the saved LSE, forms dS and writes dq. Keeps P and dS in `row` for the
/// key-side sums.
///
/// Arithmetic (`Acc = AccumT<S>`; each S(.) is exact at S = double/float):
/// \code{.unparsed}
///   1. s_j  = S(Acc(Σ_d q_d k_jd) * scale)     the forward's step 1, bit for bit
///   2. P_j  = S(exp(s_j - lse))                probabilities from the saved LSE (Acc)
///   3. dP_j = S(Σ_d dO_d v_jd)                 d ascending
///   4. Δ    = S(Σ_d dO_d o_d)                  d ascending, o the forward's output
///   5. dS_j = S(P_j (dP_j - Δ))
///   6. dq_d = S(scale · Σ_j dS_j k_jd)         j ascending
/// \endcode
///
/// \param q,o,dout   pointers to the D values of the query, its forward output and dO
/// \param k,v        keys/values `[P+T, H_kv*D]`; \param kv_col first column of the KV head
/// \param head_dim   D; \param lo, hi the cache rows the query sees (inclusive)
/// \param scale      softmax scale s; \param lse the forward's LSE of this row (natural log)
/// \param dq         receives D values; \param row receives lo, hi, P_j and dS_j
template <typename S>
void attend_row_backward(const S* q, const S* o, const S* dout, const Mat<S>& k, const Mat<S>& v, Eigen::Index kv_col,
                         int head_dim, Eigen::Index lo, Eigen::Index hi, AccumT<S> scale, AccumT<S> lse, S* dq,
                         detail::RowGrad<S>& row) {
  using Acc = AccumT<S>;
  const Eigen::Index n = hi - lo + 1;
  row.lo = lo;
  row.hi = hi;
  row.p.resize(static_cast<size_t>(n));
  row.ds.resize(static_cast<size_t>(n));
  Acc delta = 0;  // 4. Δ = dO·o
  for (int d = 0; d < head_dim; ++d) delta += static_cast<Acc>(dout[d]) * static_cast<Acc>(o[d]);
  delta = static_cast<Acc>(static_cast<S>(delta));
  for (Eigen::Index j = 0; j < n; ++j) {
    const S* kj = k.data() + (lo + j) * k.cols() + kv_col;
    const S* vj = v.data() + (lo + j) * v.cols() + kv_col;
    Acc dot = 0;  // 1. s_j, exactly as the forward
    for (int d = 0; d < head_dim; ++d) dot += static_cast<Acc>(q[d]) * static_cast<Acc>(kj[d]);
    const Acc s = static_cast<Acc>(static_cast<S>(dot * scale));
    const Acc p = static_cast<Acc>(static_cast<S>(std::exp(s - lse)));  // 2.
    Acc dp = 0;  // 3. dP_j = dO·v_j
    for (int d = 0; d < head_dim; ++d) dp += static_cast<Acc>(dout[d]) * static_cast<Acc>(vj[d]);
    dp = static_cast<Acc>(static_cast<S>(dp));
    row.p[static_cast<size_t>(j)] = static_cast<S>(p);
    row.ds[static_cast<size_t>(j)] = static_cast<S>(p * (dp - delta));  // 5.
  }
  std::vector<Acc> acc(static_cast<size_t>(head_dim), Acc(0));
  for (Eigen::Index j = 0; j < n; ++j) {  // 6. dq = s Σ_j dS_j k_j
    const Acc ds = static_cast<Acc>(row.ds[static_cast<size_t>(j)]);
    const S* kj = k.data() + (lo + j) * k.cols() + kv_col;
    for (int d = 0; d < head_dim; ++d) acc[d] += ds * static_cast<Acc>(kj[d]);
  }
  for (int d = 0; d < head_dim; ++d) dq[d] = static_cast<S>(scale * acc[d]);
}

/// Backward of the Orthros attention operator (paper Eq. 2; orthros_attention in attention.hpp):
/// \f[
///   dS_j = P_j\,(dO\cdot v_j - dO\cdot o), \quad dq = s\sum_j dS_j\,k_j, \quad
///   dk_j = s\sum_{i \ni j} dS_{ij}\,q_i, \quad dv_j = \sum_{i \ni j} P_{ij}\,dO_i
/// \f]
/// (\f$i \ni j\f$: the queries of both streams and of every head of the GQA group that see key j).
///
/// Given the forward's inputs and outputs and the upstream gradients of both streams, returns
/// dq, dq_out, dk, dv (see AttentionGrads). Shapes (row-major, `[T, H, D]` stored as `[T, H*D]`):
///   - `q` `[T, H_q*D]`, `k`/`v` `[P+T, H_kv*D]`, `q_out` `[T_out, H_q*D]`: as for orthros_attention
///   - `fwd`: the forward's result on exactly these inputs (o, o_out, lse, lse_out). The LSE is
///     what makes the backward O(keys seen) per row without a second softmax pass; a wrong LSE
///     gives wrong gradients (only its shape and finiteness are checked)
///   - `dout` `[T, H_q*D]` = dL/do, `dout_out` `[T_out, H_q*D]` = dL/do_out
/// Cache rows that no query sees (before every window, when T_out = 0) get dk = dv = 0.
/// Derivation: the file comment; the softmax backward is FlashAttention-2's (Dao 2023, Alg. 2).
///
/// \throws orthros::Error on everything orthros_attention rejects, on `fwd`/`dout`/`dout_out`
///   shapes that do not match (named, with both shapes), on a non-finite upstream gradient or
///   saved forward (`fwd.lse contains a non-finite value (nan) at [row, head] = [2, 1]: ...`), and
///   (message starting with kGradientOverflowPrefix) when a gradient of finite inputs overflows S.
template <typename S>
AttentionGrads<S> orthros_attention_backward(const Mat<S>& q, const Mat<S>& k, const Mat<S>& v, const Mat<S>& q_out,
                                             const AttentionResult<S>& fwd, const Mat<S>& dout, const Mat<S>& dout_out,
                                             const AttentionDims& dims, const AttentionOptions& opt) {
  using Acc = AccumT<S>;
  using Index = Eigen::Index;
  check_dims(dims);
  check_window(opt.window);
  const int Hq = dims.num_q_heads, Hkv = dims.num_kv_heads, D = dims.head_dim, group = Hq / Hkv;
  const Index T = q.rows(), T_out = q_out.rows(), P = k.rows() - T, N = k.rows();
  require(q.cols() == Index(Hq) * D && q_out.cols() == Index(Hq) * D, "q and q_out must have H_q*D = ", Hq * D,
          " columns; got ", q.cols(), " and ", q_out.cols());
  require(k.cols() == Index(Hkv) * D && v.rows() == k.rows() && v.cols() == k.cols(), "k and v must both be [P+T, ",
          Hkv * D, "]; got [", k.rows(), ", ", k.cols(), "] and [", v.rows(), ", ", v.cols(), "]");
  require(P >= 0, "k/v must hold P+T >= T rows (T = q rows = ", T, "); got ", k.rows(), " rows");
  require(T_out <= T, "T_out must be <= T (got T_out = ", T_out, ", T = ", T, ")");
  auto shape = [](const char* name, const auto& m, Index r, Index c) {
    require(m.rows() == r && m.cols() == c, name, " must be [", r, ", ", c, "]; got [", m.rows(), ", ", m.cols(), "]");
  };
  shape("do (dL/do)", dout, T, Index(Hq) * D);
  shape("do_out (dL/do_out)", dout_out, T_out, Index(Hq) * D);
  shape("fwd.o", fwd.o, T, Index(Hq) * D);
  shape("fwd.o_out", fwd.o_out, T_out, Index(Hq) * D);
  shape("fwd.lse", fwd.lse, T, Index(Hq));
  shape("fwd.lse_out", fwd.lse_out, T_out, Index(Hq));
  detail::require_finite(q, "q", D);
  detail::require_finite(q_out, "q_out", D);
  detail::require_finite(k, "k", D);
  detail::require_finite(v, "v", D);
  detail::require_finite(dout, "do", D);
  detail::require_finite(dout_out, "do_out", D);
  // The saved forward: a NaN/Inf in it (an LSE above all) would otherwise come out as NaN gradients,
  // reported as a gradient overflow.
  detail::require_finite(fwd.o, "fwd.o", D);
  detail::require_finite(fwd.o_out, "fwd.o_out", D);
  for (auto [m, name] : {std::pair<const Mat<AccumT<S>>*, const char*>{&fwd.lse, "fwd.lse"}, {&fwd.lse_out, "fwd.lse_out"}})
    for (Index r = 0; r < m->rows(); ++r)
      for (Index h = 0; h < m->cols(); ++h)
        if (!std::isfinite(static_cast<double>((*m)(r, h))))
          throw Error(detail::cat(name, " contains a non-finite value (", static_cast<double>((*m)(r, h)),
                                  ") at [row, head] = [", r, ", ", h, "]: the saved forward must be orthros_attention's "
                                  "finite result on these inputs"));
  const Acc scale = static_cast<Acc>(softmax_scale(opt, D));

  AttentionGrads<S> g;
  g.dq.resize(T, Index(Hq) * D);
  g.dq_out.resize(T_out, Index(Hq) * D);
  g.dk.resize(N, Index(Hkv) * D);
  g.dv.resize(N, Index(Hkv) * D);

  // ---- query side: per query row and head, dS and dq (rows are independent) ----
  // rows_base[i*Hq + h], rows_out[i*Hq + h]
  std::vector<detail::RowGrad<S>> rows_base(static_cast<size_t>(T * Hq)), rows_out(static_cast<size_t>(T_out * Hq));
  const bool parallel_base = T * Hq * std::min<Index>(opt.window, N) * D >= (Index(1) << 18);
  const bool parallel_out = T_out * Hq * N * D >= (Index(1) << 18);
  // Base stream: query at cache row t = P+i sees [max(0, t-w+1), t]   (Eq. 2, left)
#pragma omp parallel for collapse(2) schedule(static) if (parallel_base)
  for (Index i = 0; i < T; ++i)
    for (int h = 0; h < Hq; ++h) {
      const Index t = P + i, lo = std::max<Index>(0, t - opt.window + 1), col = Index(h) * D;
      attend_row_backward<S>(q.data() + i * q.cols() + col, fwd.o.data() + i * fwd.o.cols() + col,
                             dout.data() + i * dout.cols() + col, k, v, Index(h / group) * D, D, lo, t, scale,
                             fwd.lse(i, h), g.dq.data() + i * g.dq.cols() + col, rows_base[size_t(i * Hq + h)]);
    }
  // Output stream: query at cache row t = P+T-T_out+i sees [0, t]   (Eq. 2, right)
#pragma omp parallel for collapse(2) schedule(static) if (parallel_out)
  for (Index i = 0; i < T_out; ++i)
    for (int h = 0; h < Hq; ++h) {
      const Index t = P + (T - T_out) + i, col = Index(h) * D;
      attend_row_backward<S>(q_out.data() + i * q_out.cols() + col, fwd.o_out.data() + i * fwd.o_out.cols() + col,
                             dout_out.data() + i * dout_out.cols() + col, k, v, Index(h / group) * D, D, 0, t, scale,
                             fwd.lse_out(i, h), g.dq_out.data() + i * g.dq_out.cols() + col,
                             rows_out[size_t(i * Hq + h)]);
    }

  // ---- key side: dk_j, dv_j summed in the fixed order of the file comment ----
  // Base query i (cache row P+i) sees key j iff P+i-w+1 <= j <= P+i; output query i iff j <= P+T-T_out+i.
  const bool parallel_keys = N * Hq * (std::min<Index>(opt.window, N) + T_out) * D >= (Index(1) << 18);
#pragma omp parallel for schedule(static) if (parallel_keys)
  for (Index j = 0; j < N; ++j) {
    std::vector<Acc> dk_head(static_cast<size_t>(D)), dv_head(static_cast<size_t>(D));
    std::vector<Acc> dk_sum(static_cast<size_t>(D)), dv_sum(static_cast<size_t>(D));
    std::vector<Acc> dk_out(static_cast<size_t>(D)), dv_out(static_cast<size_t>(D));
    for (int kvh = 0; kvh < Hkv; ++kvh) {
      std::fill(dk_sum.begin(), dk_sum.end(), Acc(0));
      std::fill(dv_sum.begin(), dv_sum.end(), Acc(0));
      for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
        const Index col = Index(h) * D;
        std::fill(dk_head.begin(), dk_head.end(), Acc(0));
        std::fill(dv_head.begin(), dv_head.end(), Acc(0));
        // base stream: rows i with max(0, j-P) <= i <= min(T-1, j-P+w-1)
        const Index i_lo = std::max<Index>(0, j - P), i_hi = std::min<Index>(T - 1, j - P + opt.window - 1);
        for (Index i = i_lo; i <= i_hi; ++i) {
          const detail::RowGrad<S>& r = rows_base[size_t(i * Hq + h)];
          const Acc ds = static_cast<Acc>(r.ds[size_t(j - r.lo)]), p = static_cast<Acc>(r.p[size_t(j - r.lo)]);
          const S* qi = q.data() + i * q.cols() + col;
          const S* doi = dout.data() + i * dout.cols() + col;
          for (int d = 0; d < D; ++d) {
            dk_head[d] += ds * static_cast<Acc>(qi[d]);
            dv_head[d] += p * static_cast<Acc>(doi[d]);
          }
        }
        // output stream: rows i with P+T-T_out+i >= j
        std::fill(dk_out.begin(), dk_out.end(), Acc(0));
        std::fill(dv_out.begin(), dv_out.end(), Acc(0));
        for (Index i = std::max<Index>(0, j - (P + T - T_out)); i < T_out; ++i) {
          const detail::RowGrad<S>& r = rows_out[size_t(i * Hq + h)];
          const Acc ds = static_cast<Acc>(r.ds[size_t(j - r.lo)]), p = static_cast<Acc>(r.p[size_t(j - r.lo)]);
          const S* qi = q_out.data() + i * q_out.cols() + col;
          const S* doi = dout_out.data() + i * dout_out.cols() + col;
          for (int d = 0; d < D; ++d) {
            dk_out[d] += ds * static_cast<Acc>(qi[d]);
            dv_out[d] += p * static_cast<Acc>(doi[d]);
          }
        }
        for (int d = 0; d < D; ++d) {  // this query head's share: s (base + output) for dk
          dk_sum[d] += scale * (dk_head[d] + dk_out[d]);
          dv_sum[d] += dv_head[d] + dv_out[d];
        }
      }
      for (int d = 0; d < D; ++d) {
        g.dk(j, Index(kvh) * D + d) = static_cast<S>(dk_sum[d]);
        g.dv(j, Index(kvh) * D + d) = static_cast<S>(dv_sum[d]);
      }
    }
  }

  // Finite inputs can still overflow S in a gradient; never return NaN/Inf for them.
  auto finite = [&](const Mat<S>& m, const char* name) {
    for (Index r = 0; r < m.rows(); ++r)
      for (Index c = 0; c < m.cols(); ++c)
        if (!std::isfinite(static_cast<double>(m(r, c))))
          throw Error(detail::cat(kGradientOverflowPrefix, " ", dtype_name<S>(), ": ", name, " at [row ", r, ", head ",
                                  c / D, ", dim ", c % D, "] would be ", static_cast<double>(m(r, c)),
                                  "; scale the inputs or upstream gradients down or compute at a wider precision"));
  };
  finite(g.dq, "dq");
  finite(g.dq_out, "dq_out");
  finite(g.dk, "dk");
  finite(g.dv, "dv");
  return g;
}

/// Convenience: runs the forward (orthros_attention) and then orthros_attention_backward.
/// Same shapes and errors; returns the gradients only.
template <typename S>
AttentionGrads<S> orthros_attention_backward(const Mat<S>& q, const Mat<S>& k, const Mat<S>& v, const Mat<S>& q_out,
                                             const Mat<S>& dout, const Mat<S>& dout_out, const AttentionDims& dims,
                                             const AttentionOptions& opt) {
  const AttentionResult<S> fwd = orthros_attention<S>(q, k, v, q_out, dims, opt);
  return orthros_attention_backward<S>(q, k, v, q_out, fwd, dout, dout_out, dims, opt);
}

}  // namespace orthros
