/// \file attention.hpp
/// \brief The Orthros attention operator (paper Eq. 2; SPEC §2 and §5), post-projection.
///
/// Two streams over one KV cache:
///   - base queries: sliding-window attention, query at absolute position t sees keys
///     `[max(1, t-w+1), t]` (the window includes the token itself: w keys at most);
///   - output queries: full causal cross-attention, query at position t sees keys `[1, t]`.
///
/// Every query row is computed by the same function, `attend_row`, whose arithmetic
/// depends only on the query, the key/value rows in its range and the scale: never on
/// how many other queries share the call. That is what makes PT, SFT, prefill, chunked
/// prefill and decode agree bitwise (SPEC §4.2).
#pragma once

#include "orthros/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

namespace orthros {

/// Head layout of an attention operator. Grouped-query attention: query head `h` reads
/// KV head `h / (num_q_heads / num_kv_heads)`.
struct AttentionDims {
  int num_q_heads = 0;   ///< H_q
  int num_kv_heads = 0;  ///< H_kv; must divide H_q
  int head_dim = 0;      ///< D
};

/// Options of the operator.
struct AttentionOptions {
  std::int64_t window = 128;    ///< w >= 1 keys, current token included (SPEC §2)
  std::optional<double> scale;  ///< softmax scale s; default 1/sqrt(D)
};

/// Outputs of the operator. o/o_out are in the input scalar type; the LSEs are kept in
/// the accumulator type (float32 for bf16/f16 inputs), as attention kernels return them.
template <typename S>
struct AttentionResult {
  Mat<S> o;                 ///< [T, H_q*D]     base-stream outputs
  Mat<S> o_out;             ///< [T_out, H_q*D] output-stream outputs
  Mat<AccumT<S>> lse;       ///< [T, H_q]       natural-log sum-exp of scaled scores, base
  Mat<AccumT<S>> lse_out;   ///< [T_out, H_q]   same, output stream
};

/// Validates head dims: all positive and H_q % H_kv == 0. Throws orthros::Error.
inline void check_dims(const AttentionDims& d) {
  require(d.num_q_heads >= 1, "num_q_heads (H_q) must be >= 1 (got ", d.num_q_heads, ")");
  require(d.num_kv_heads >= 1, "num_kv_heads (H_kv) must be >= 1 (got ", d.num_kv_heads, ")");
  require(d.head_dim >= 1, "head_dim (D) must be >= 1 (got ", d.head_dim, ")");
  require(d.num_q_heads % d.num_kv_heads == 0, "H_q % H_kv must be 0 for grouped-query attention (got H_q=",
          d.num_q_heads, ", H_kv=", d.num_kv_heads, ")");
}

/// Validates a window size: w >= 1. Throws orthros::Error.
inline void check_window(std::int64_t window) {
  require(window >= 1, "window must be >= 1 (got ", window, "); w = 1 means a token sees only itself");
}

/// Softmax scale actually used: `opt.scale` if set (must be finite), else 1/sqrt(D).
inline double softmax_scale(const AttentionOptions& opt, int head_dim) {
  if (opt.scale) {
    require(std::isfinite(*opt.scale), "scale must be finite (got ", *opt.scale, ")");
    return *opt.scale;
  }
  return 1.0 / std::sqrt(static_cast<double>(head_dim));
}

namespace detail {

template <typename S>
void require_finite(const Mat<S>& m, const char* name, int head_dim) {
  for (Eigen::Index r = 0; r < m.rows(); ++r)
    for (Eigen::Index c = 0; c < m.cols(); ++c)
      if (!std::isfinite(static_cast<double>(m(r, c))))
        throw Error(cat(name, " contains a non-finite value (", static_cast<double>(m(r, c)), ") at [row, head, dim] = [", r, ", ",
                        c / head_dim, ", ", c % head_dim, "]"));
}

/// Throws if any output of finite inputs is not finite: the scaled scores overflowed S.
template <typename S>
void require_finite_result(const AttentionResult<S>& r, int head_dim) {
  auto check = [&](const auto& m, const char* name, int cols_per_head) {
    for (Eigen::Index i = 0; i < m.rows(); ++i)
      for (Eigen::Index c = 0; c < m.cols(); ++c)
        if (!std::isfinite(static_cast<double>(m(i, c))))
          throw Error(cat("scaled scores q.k*scale overflow ", dtype_name<S>(), " (largest finite ",
                          static_cast<double>(std::numeric_limits<S>::max()), "): ", name, " at [row ", i, ", head ",
                          c / cols_per_head, "] would be ", static_cast<double>(m(i, c)),
                          "; scale the inputs down or compute at a wider precision"));
  };
  check(r.o, "o", head_dim);
  check(r.o_out, "o_out", head_dim);
  check(r.lse, "lse", 1);
  check(r.lse_out, "lse_out", 1);
}

}  // namespace detail

/// One query row of one head against the contiguous key range `[lo, hi]` (0-based cache
/// rows, inclusive) of one KV head: the softmax-weighted sum of paper Eq. 2.
///
/// Arithmetic (identical for every regime; `Acc = AccumT<S>`):
///   1. s_j  = S(Acc(sum_d q_d k_jd) * scale)             scores, summed over d ascending
///   2. m    = max_j s_j;  l = sum_j exp(s_j - m)         max subtraction: no overflow at |s| ~ 1e4
///   3. p_j  = S(exp(s_j - m) / l)                        probabilities, stored at precision S
///   4. o_d  = S(sum_j p_j v_jd)                          summed over j ascending
///   5. lse  = m + log(l)
/// When every score rounds to -inf (S overflowed), the row is an empty softmax: o = 0, lse = -inf.
/// At S = double/float each rounding S(.) is exact, so this is the plain two-pass softmax;
/// at S = bf16/f16 it is the "naive implementation at the kernel's own precision" that
/// SPEC §6 measures a kernel against.
///
/// \param q        pointer to D query values
/// \param k        keys `[P+T, H_kv*D]`, row-major
/// \param v        values `[P+T, H_kv*D]`, row-major
/// \param kv_col   first column of the KV head (kv_head * D)
/// \param head_dim D
/// \param lo       first cache row the query sees (0-based)
/// \param hi       last cache row the query sees (inclusive)
/// \param scale    softmax scale s
/// \param out      receives D outputs
/// \param lse      receives the log-sum-exp of the scaled scores (natural log)
template <typename S>
void attend_row(const S* q, const Mat<S>& k, const Mat<S>& v, Eigen::Index kv_col, int head_dim, Eigen::Index lo,
                Eigen::Index hi, AccumT<S> scale, S* out, AccumT<S>* lse) {
  using Acc = AccumT<S>;
  const Eigen::Index n = hi - lo + 1;
  std::vector<Acc> s(static_cast<size_t>(n));
  Acc m = -std::numeric_limits<Acc>::infinity();
  for (Eigen::Index j = 0; j < n; ++j) {  // 1. scores q.k_j * s
    const S* kj = k.data() + (lo + j) * k.cols() + kv_col;
    Acc dot = 0;
    for (int d = 0; d < head_dim; ++d) dot += static_cast<Acc>(q[d]) * static_cast<Acc>(kj[d]);
    s[j] = static_cast<Acc>(static_cast<S>(dot * scale));
    m = std::max(m, s[j]);
  }
  if (m == -std::numeric_limits<Acc>::infinity()) {  // every score rounded to -inf: no weight anywhere
    std::fill(out, out + head_dim, S(0));             // (an empty softmax; orthros_attention rejects
    *lse = m;                                         // the row as an overflow, a split-KV merge skips it)
    return;
  }
  Acc l = 0;  // 2. softmax denominator
  for (Eigen::Index j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - m);
    l += s[j];
  }
  std::vector<Acc> acc(static_cast<size_t>(head_dim), Acc(0));
  for (Eigen::Index j = 0; j < n; ++j) {  // 3-4. o = sum_j p_j v_j
    const Acc p = static_cast<Acc>(static_cast<S>(s[j] / l));
    const S* vj = v.data() + (lo + j) * v.cols() + kv_col;
    for (int d = 0; d < head_dim; ++d) acc[d] += p * static_cast<Acc>(vj[d]);
  }
  for (int d = 0; d < head_dim; ++d) out[d] = static_cast<S>(acc[d]);
  *lse = m + std::log(l);  // 5.
}

/// The Orthros attention operator (paper Eq. 2, Algorithm 1 lines "SWA" and "cross-attn"; SPEC §2/§5):
/// \f[
///   o_t = \sum_{j=\max(1,t-w+1)}^{t} \operatorname{softmax}_j(s\,q_t\cdot k_j)\,v_j, \qquad
///   o'_t = \sum_{j=1}^{t} \operatorname{softmax}_j(s\,q'_t\cdot k_j)\,v_j .
/// \f]
///
/// Shapes (row-major, rows are positions; `[T, H, D]` is stored as `[T, H*D]`):
///   - `q`     `[T, H_q*D]`      base queries of absolute positions P+1 .. P+T
///   - `k`,`v` `[P+T, H_kv*D]`   keys/values of positions 1 .. P+T (the KV cache incl. this call's tokens)
///   - `q_out` `[T_out, H_q*D]`  output-specific queries of the last T_out base positions (0 <= T_out <= T)
/// Returns o `[T, H_q*D]`, o_out `[T_out, H_q*D]`, lse `[T, H_q]`, lse_out `[T_out, H_q]`.
/// P is inferred as `k.rows() - T`.
///
/// \throws orthros::Error on: non-positive dims, `H_q % H_kv != 0`, a column count that is not
///   H*D, `k`/`v` shape mismatch, `k.rows() < T` (negative P), `T_out > T`, `window < 1`,
///   a non-finite scale or a non-finite input value, and when finite inputs make the scaled
///   scores overflow S (the result would be NaN/Inf). Messages name the parameter and values.
template <typename S>
AttentionResult<S> orthros_attention(const Mat<S>& q, const Mat<S>& k, const Mat<S>& v, const Mat<S>& q_out,
                                     const AttentionDims& dims, const AttentionOptions& opt) {
  using Acc = AccumT<S>;
  using Index = Eigen::Index;
  check_dims(dims);
  check_window(opt.window);
  const int Hq = dims.num_q_heads, Hkv = dims.num_kv_heads, D = dims.head_dim;
  const Index T = q.rows(), T_out = q_out.rows(), P = k.rows() - T;
  require(q.cols() == Index(Hq) * D, "q must be [T, H_q, D] = [T, ", Hq, ", ", D, "] (", Hq * D,
          " columns); got ", q.cols(), " columns");
  require(q_out.cols() == Index(Hq) * D, "q_out must be [T_out, H_q, D] = [T_out, ", Hq, ", ", D, "] (", Hq * D,
          " columns); got ", q_out.cols(), " columns");
  require(k.cols() == Index(Hkv) * D, "k must be [P+T, H_kv, D] = [P+T, ", Hkv, ", ", D, "] (", Hkv * D,
          " columns); got ", k.cols(), " columns");
  if (v.rows() != k.rows() || v.cols() != k.cols()) {  // named as [P+T, H_kv, D], the layout a caller knows
    const std::string got = v.cols() % D == 0 ? detail::cat("[", v.rows(), ", ", v.cols() / D, ", ", D, "]")
                                              : detail::cat("[", v.rows(), " rows, ", v.cols(), " columns]");
    throw Error(detail::cat("v must have the shape of k [P+T, H_kv, D] = [", k.rows(), ", ", Hkv, ", ", D, "] ([",
                            k.rows(), ", ", k.cols(), "] as a matrix); got ", got, " ([", v.rows(), ", ", v.cols(),
                            "])"));
  }
  require(P >= 0, "k/v must hold P+T >= T rows (T = q rows = ", T, "); got ", k.rows(), " rows");
  require(T_out <= T, "T_out must be <= T (got T_out = ", T_out, ", T = ", T, ")");
  detail::require_finite(q, "q", D);
  detail::require_finite(q_out, "q_out", D);
  detail::require_finite(k, "k", D);
  detail::require_finite(v, "v", D);
  const Acc scale = static_cast<Acc>(softmax_scale(opt, D));
  const int group = Hq / Hkv;

  AttentionResult<S> r;
  r.o.resize(T, Index(Hq) * D);
  r.o_out.resize(T_out, Index(Hq) * D);
  r.lse.resize(T, Hq);
  r.lse_out.resize(T_out, Hq);

  // Threads only where there is enough work: a decode step's single base query (w keys) stays serial.
  const bool parallel_base = T * Hq * std::min<Index>(opt.window, P + T) * D >= (Index(1) << 20);
  const bool parallel_out = T_out * Hq * (P + T) * D >= (Index(1) << 20);
  // Base stream: o_t = softmax_{j in [max(1,t-w+1), t]}(q_t.k_j s) v_j   (paper Eq. 2, left)
#pragma omp parallel for collapse(2) schedule(static) if (parallel_base)
  for (Index i = 0; i < T; ++i)
    for (int h = 0; h < Hq; ++h) {
      const Index t = P + i;  // 0-based cache row of this token
      const Index lo = std::max<Index>(0, t - opt.window + 1);
      attend_row<S>(q.data() + i * q.cols() + Index(h) * D, k, v, Index(h / group) * D, D, lo, t, scale,
                    r.o.data() + i * r.o.cols() + Index(h) * D, &r.lse(i, h));
    }
  // Output stream: o'_t = softmax_{j in [1, t]}(q'_t.k_j s) v_j for the last T_out positions (Eq. 2, right)
#pragma omp parallel for collapse(2) schedule(static) if (parallel_out)
  for (Index i = 0; i < T_out; ++i)
    for (int h = 0; h < Hq; ++h) {
      const Index t = P + (T - T_out) + i;
      attend_row<S>(q_out.data() + i * q_out.cols() + Index(h) * D, k, v, Index(h / group) * D, D, 0, t, scale,
                    r.o_out.data() + i * r.o_out.cols() + Index(h) * D, &r.lse_out(i, h));
    }
  // Finite inputs can still overflow S (or the accumulator) in q.k*s; never return NaN/Inf for them.
  detail::require_finite_result(r, D);
  return r;
}

}  // namespace orthros
