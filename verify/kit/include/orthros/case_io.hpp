/// \file case_io.hpp
/// \brief Attention-operator cases and results as safetensors files (SPEC §5).
///
/// Case file (inputs of orthros_attention):
///   - tensors `q` `[T, H_q, D]`, `k` `[P+T, H_kv, D]`, `v` `[P+T, H_kv, D]`,
///     `q_out` `[T_out, H_q, D]`; each F64, F32, F16 or BF16 (they may differ; every one is
///     widened exactly). All four are required and must be rank 3: a case with no output
///     queries stores `q_out` with shape `[0, H_q, D]` (zero bytes), so a forgotten
///     tensor is never mistaken for `T_out = 0`.
///   - `__metadata__`: `window` (required; a decimal integer >= 1, digits only, e.g. "128"),
///     `scale` (optional; a finite decimal floating-point number; default 1/sqrt(D)).
///   - Other tensors and metadata keys are ignored (a golden file may carry its expected
///     outputs and provenance next to the inputs).
///   - H_q, H_kv, D, T, P and T_out come from the shapes; they must agree (SPEC §2).
/// Result file: `o` `[T, H_q, D]`, `o_out` `[T_out, H_q, D]`, `lse` `[T, H_q]`,
///   `lse_out` `[T_out, H_q]` (natural log), F64 by default or F32.
#pragma once

#include "orthros/attention.hpp"
#include "orthros/safetensors.hpp"
#include "orthros/tensor.hpp"

#include <cerrno>
#include <cstdio>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace orthros {

/// An attention-operator case, inputs converted to scalar type S (`Mat` layout `[rows, H*D]`).
template <typename S>
struct AttentionCase {
  Mat<S> q;                  ///< [T, H_q*D]
  Mat<S> k;                  ///< [P+T, H_kv*D]
  Mat<S> v;                  ///< [P+T, H_kv*D]
  Mat<S> q_out;              ///< [T_out, H_q*D]
  AttentionDims dims;        ///< H_q, H_kv, D from the shapes
  AttentionOptions options;  ///< window, optional scale from the metadata
  std::int64_t T = 0;        ///< base tokens
  std::int64_t P = 0;        ///< KV-cache length before this call
  std::int64_t T_out = 0;    ///< output tokens (the last T_out base positions)
};

namespace detail {

/// Strict decimal integer: optional '-', then digits only; no spaces, signs '+', or fractions.
inline bool parse_int64_strict(const std::string& s, std::int64_t& out) {
  if (s.empty()) return false;
  size_t i = (s[0] == '-') ? 1 : 0;
  if (i == s.size()) return false;
  for (size_t j = i; j < s.size(); ++j)
    if (s[j] < '0' || s[j] > '9') return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno == ERANGE || end != s.c_str() + s.size()) return false;
  out = v;
  return true;
}

/// Strict decimal floating-point number (strtod syntax minus leading space or '+', hex, inf and
/// nan); a value that overflows a double or underflows it to zero is rejected too.
inline bool parse_double_strict(const std::string& s, double& out) {
  if (s.empty() || s[0] == '+') return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-')) return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtod(s.c_str(), &end);
  if (errno == ERANGE && (out == 0 || std::isinf(out))) return false;
  return end == s.c_str() + s.size();
}

/// "NaN", "inf" or "-inf": how messages name a non-finite value.
inline std::string non_finite_name(double x) { return std::isnan(x) ? "NaN" : (x > 0 ? "inf" : "-inf"); }

/// Throws unless every value `t` stores (widened exactly) is finite, naming the tensor, what it holds
/// and the first index: `<what> holds NaN at [2, 0, 5] (the first of 3 non-finite values; <why>)`.
inline void require_finite_tensor(const st::Tensor& t, const std::string& what, const char* why) {
  const std::int64_t n = t.numel();
  for (std::int64_t i = 0; i < n; ++i) {
    const double x = st::element(t, i);
    if (std::isfinite(x)) continue;
    std::int64_t bad = 0;
    for (std::int64_t j = i; j < n; ++j) bad += std::isfinite(st::element(t, j)) ? 0 : 1;
    std::vector<std::int64_t> idx(t.shape.size(), 0);
    for (std::size_t d = t.shape.size(), flat = static_cast<std::size_t>(i); d-- > 0;) {
      idx[d] = static_cast<std::int64_t>(flat % static_cast<std::size_t>(t.shape[d]));
      flat /= static_cast<std::size_t>(t.shape[d]);
    }
    throw Error(cat(what, " holds ", non_finite_name(x), " at ", st::shape_string(idx), " (the first of ", bad,
                    bad == 1 ? " non-finite value; " : " non-finite values; ", why, ")"));
  }
}

inline const st::Tensor& case_tensor(const st::File& f, const char* name, const char* shape_doc) {
  auto it = f.tensors.find(name);
  require(it != f.tensors.end(), "missing tensor \"", name, "\" ", shape_doc);
  require(it->second.shape.size() == 3, "tensor \"", name, "\" must be rank 3 ", shape_doc, "; got shape ",
          st::shape_string(it->second.shape));
  return it->second;
}

}  // namespace detail

/// Reads and validates an attention case from a parsed safetensors file (format: file comment).
/// Derives H_q = q.shape[1], D = q.shape[2], H_kv = k.shape[1], T = q.shape[0],
/// P = k.shape[0] - T, T_out = q_out.shape[0].
/// \throws orthros::Error naming the tensor/metadata and the values on: a missing tensor; a
///   tensor that is not rank 3; H_q, H_kv or D < 1 or too large for int; `q_out` heads/head_dim
///   differing from `q`; `k` head_dim differing from `q`; `v` shape != `k` shape;
///   `H_q % H_kv != 0`; `k.shape[0] < T` (P < 0); `T_out > T`; a missing or non-integer
///   `window` or one < 1; a `scale` that is not a finite number; a NaN or Inf in q, k, v or q_out
///   (named with its first index, e.g. `tensor "k" holds NaN at [3, 0, 7] (...)`).
template <typename S>
AttentionCase<S> load_attention_case(const st::File& f) {
  const st::Tensor& q = detail::case_tensor(f, "q", "[T, H_q, D]");
  const st::Tensor& k = detail::case_tensor(f, "k", "[P+T, H_kv, D]");
  const st::Tensor& v = detail::case_tensor(f, "v", "[P+T, H_kv, D]");
  const st::Tensor& qo = detail::case_tensor(f, "q_out", "[T_out, H_q, D] (use shape [0, H_q, D] for T_out = 0)");
  const auto ss = [](const st::Tensor& t) { return st::shape_string(t.shape); };
  for (auto [name, val] : {std::pair<const char*, std::int64_t>{"q.shape[1] (H_q)", q.shape[1]},
                           {"q.shape[2] (D)", q.shape[2]},
                           {"k.shape[1] (H_kv)", k.shape[1]}})
    require(val >= 1 && val <= INT_MAX, name, " must be in [1, ", INT_MAX, "] (got ", val, "; q ", ss(q), ", k ",
            ss(k), ")");
  require(qo.shape[1] == q.shape[1] && qo.shape[2] == q.shape[2], "q_out must be [T_out, H_q, D] with H_q, D of q ",
          ss(q), "; got ", ss(qo));
  require(k.shape[2] == q.shape[2], "k must be [P+T, H_kv, D] with D = ", q.shape[2], " of q ", ss(q), "; got ",
          ss(k));
  require(v.shape == k.shape, "v must have the shape of k ", ss(k), "; got ", ss(v));
  require(q.shape[1] % k.shape[1] == 0, "H_q % H_kv must be 0 for grouped-query attention (q ", ss(q), " has H_q = ",
          q.shape[1], ", k ", ss(k), " has H_kv = ", k.shape[1], ")");
  require(k.shape[0] >= q.shape[0], "k/v must hold P+T >= T rows (q ", ss(q), " has T = ", q.shape[0], "; k ",
          ss(k), ")");
  require(qo.shape[0] <= q.shape[0], "T_out must be <= T (q_out ", ss(qo), ", q ", ss(q), ")");

  AttentionCase<S> c;
  c.dims.num_q_heads = static_cast<int>(q.shape[1]);
  c.dims.head_dim = static_cast<int>(q.shape[2]);
  c.dims.num_kv_heads = static_cast<int>(k.shape[1]);
  c.T = q.shape[0];
  c.P = k.shape[0] - q.shape[0];
  c.T_out = qo.shape[0];

  auto w = f.metadata.find("window");
  require(w != f.metadata.end(), "missing metadata \"window\" (an integer >= 1, in __metadata__)");
  std::int64_t window = 0;
  require(detail::parse_int64_strict(w->second, window), "metadata \"window\" must be a decimal integer in [1, 2^63-1] (got \"",
          w->second, "\")");
  require(window >= 1, "metadata \"window\" must be >= 1 (got \"", w->second, "\")");
  c.options.window = window;
  auto sc = f.metadata.find("scale");
  if (sc != f.metadata.end()) {
    double s = 0;
    require(detail::parse_double_strict(sc->second, s) && std::isfinite(s),
            "metadata \"scale\" must be a finite number (got \"", sc->second, "\")");
    c.options.scale = s;
  }
  for (auto [name, t] : {std::pair<const char*, const st::Tensor*>{"q", &q}, {"k", &k}, {"v", &v}, {"q_out", &qo}})
    detail::require_finite_tensor(*t, detail::cat("tensor \"", name, "\""), "case inputs must be finite");
  c.q = st::to_matrix<S>(q, "q");
  c.k = st::to_matrix<S>(k, "k");
  c.v = st::to_matrix<S>(v, "v");
  c.q_out = st::to_matrix<S>(qo, "q_out");
  return c;
}

/// Reads, parses and validates an attention case file. \throws orthros::Error as st::read_file
/// and load_attention_case do (messages prefixed with the path).
template <typename S>
AttentionCase<S> load_attention_case(const std::string& path) {
  const st::File f = st::read_file(path);
  try {
    return load_attention_case<S>(f);
  } catch (const Error& e) {
    throw Error(detail::cat(path, ": ", e.what()));
  }
}

/// Builds a case file from inputs in `Mat` layout (inverse of load_attention_case): tensors
/// q, k, v, q_out as `[rows, H, D]` in `dtype` (rounded to nearest even), metadata `window`
/// and, when set, `scale` (printed with 17 significant digits, so it reads back exactly).
/// \throws orthros::Error on invalid dims/window or column counts that are not H*D.
template <typename S>
st::File make_attention_case(const Mat<S>& q, const Mat<S>& k, const Mat<S>& v, const Mat<S>& q_out,
                             const AttentionDims& dims, const AttentionOptions& opt, st::DType dtype) {
  check_dims(dims);
  check_window(opt.window);
  const std::int64_t Hq = dims.num_q_heads, Hkv = dims.num_kv_heads, D = dims.head_dim;
  st::File f;
  f.tensors["q"] = st::from_matrix<S>(q, {q.rows(), Hq, D}, dtype);
  f.tensors["k"] = st::from_matrix<S>(k, {k.rows(), Hkv, D}, dtype);
  f.tensors["v"] = st::from_matrix<S>(v, {v.rows(), Hkv, D}, dtype);
  f.tensors["q_out"] = st::from_matrix<S>(q_out, {q_out.rows(), Hq, D}, dtype);
  f.metadata["window"] = std::to_string(opt.window);
  if (opt.scale) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", *opt.scale);
    f.metadata["scale"] = buf;
  }
  return f;
}

/// Builds a result file: o `[T, H_q, D]`, o_out `[T_out, H_q, D]`, lse `[T, H_q]`,
/// lse_out `[T_out, H_q]`, in `dtype` (F64 by default; SPEC §5), rounded to nearest even.
template <typename S>
st::File make_attention_result(const AttentionResult<S>& r, const AttentionDims& dims,
                               st::DType dtype = st::DType::F64) {
  const std::int64_t Hq = dims.num_q_heads, D = dims.head_dim;
  st::File f;
  f.tensors["o"] = st::from_matrix<S>(r.o, {r.o.rows(), Hq, D}, dtype);
  f.tensors["o_out"] = st::from_matrix<S>(r.o_out, {r.o_out.rows(), Hq, D}, dtype);
  f.tensors["lse"] = st::from_matrix<AccumT<S>>(r.lse, {r.lse.rows(), Hq}, dtype);
  f.tensors["lse_out"] = st::from_matrix<AccumT<S>>(r.lse_out, {r.lse_out.rows(), Hq}, dtype);
  return f;
}

/// Reads a result file (any of the four dtypes) into double precision, `Mat` layout:
/// o `[T, H_q*D]`, o_out `[T_out, H_q*D]`, lse `[T, H_q]`, lse_out `[T_out, H_q]`.
/// \throws orthros::Error on a missing tensor, o/o_out not rank 3, lse/lse_out not rank 2,
///   or inconsistent T, T_out, H_q, D between them.
inline AttentionResult<double> load_attention_result(const st::File& f) {
  auto get = [&](const char* name, size_t rank) -> const st::Tensor& {
    auto it = f.tensors.find(name);
    require(it != f.tensors.end(), "missing result tensor \"", name, "\"");
    require(it->second.shape.size() == rank, "result tensor \"", name, "\" must be rank ", rank, "; got shape ",
            st::shape_string(it->second.shape));
    return it->second;
  };
  const st::Tensor &o = get("o", 3), &oo = get("o_out", 3), &l = get("lse", 2), &lo = get("lse_out", 2);
  require(oo.shape[1] == o.shape[1] && oo.shape[2] == o.shape[2], "o_out ", st::shape_string(oo.shape),
          " must have the heads/head_dim of o ", st::shape_string(o.shape));
  require(l.shape[0] == o.shape[0] && l.shape[1] == o.shape[1], "lse ", st::shape_string(l.shape),
          " must be [T, H_q] of o ", st::shape_string(o.shape));
  require(lo.shape[0] == oo.shape[0] && lo.shape[1] == o.shape[1], "lse_out ", st::shape_string(lo.shape),
          " must be [T_out, H_q] of o_out ", st::shape_string(oo.shape));
  AttentionResult<double> r;
  r.o = st::to_matrix<double>(o, "o");
  r.o_out = st::to_matrix<double>(oo, "o_out");
  r.lse = st::to_matrix<double>(l, "lse");
  r.lse_out = st::to_matrix<double>(lo, "lse_out");
  return r;
}

}  // namespace orthros
