/// \file portkit.hpp
/// \brief Shared by `orthros golden` and `orthros check`: the expected results of an
/// attention case under SPEC §6 — the float64 oracle's outputs and, per output tensor, the max
/// abs error of the oracle run at the port's dtype (the `E_X` of the max-abs criterion).
///
/// Gradients: a case file that also holds the upstream gradients `do` `[T, H_q, D]`
/// and `do_out` `[T_out, H_q, D]` (written by `orthros golden --grad`) gets the expected
/// gradients `dq` `[T, H_q, D]`, `dq_out` `[T_out, H_q, D]`, `dk` and `dv` `[P+T, H_kv, D]`
/// (float64 oracle, orthros_attention_backward in attention_backward.hpp), each with its own E_X:
/// the max abs error of the oracle at the dtype (orthros_attention<S> then
/// orthros_attention_backward<S> on the inputs and upstream gradients in S) against float64.
/// In a `--grad` suite each case says whether it is judged on gradients (manifest `"grad"` per
/// case, suite_case_grad()): `edge_large_logits` is a forward-only probe there.
#pragma once

#include "orthros/attention.hpp"
#include "orthros/attention_backward.hpp"
#include "orthros/case_io.hpp"
#include "orthros/check.hpp"
#include "orthros/safetensors.hpp"

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace orthros::portkit {

/// Names of the four output tensors of an attention case, in report order (SPEC §5).
inline const std::array<const char*, 4>& output_names() {
  static const std::array<const char*, 4> n{"o", "o_out", "lse", "lse_out"};
  return n;
}

/// Names of the four gradient tensors, in report order: dq `[T, H_q, D]`,
/// dq_out `[T_out, H_q, D]`, dk `[P+T, H_kv, D]`, dv `[P+T, H_kv, D]`.
inline const std::array<const char*, 4>& grad_names() {
  static const std::array<const char*, 4> n{"dq", "dq_out", "dk", "dv"};
  return n;
}

/// Names of the upstream gradients a gradient case holds: do `[T, H_q, D]` = dL/do and
/// do_out `[T_out, H_q, D]` = dL/do_out.
inline const std::array<const char*, 2>& upstream_names() {
  static const std::array<const char*, 2> n{"do", "do_out"};
  return n;
}

/// Names of the four tensors a layer case (layer_suite.hpp, `orthros golden --level layer`) is
/// judged on, in report order: y `[T, d_model]`, y_out `[T_out, d_model]`, k_cache_after and
/// v_cache_after `[P+T, H_kv, D]`.
inline const std::array<const char*, 4>& layer_output_names() {
  static const std::array<const char*, 4> n{"y", "y_out", "k_cache_after", "v_cache_after"};
  return n;
}

/// Absolute (1-based) position of row `row` of result tensor `name` in a case with P cached
/// tokens, T base tokens and T_out output tokens (SPEC §2): base rows (o, lse, dq, y) are position
/// P+row+1, output rows (o_out, lse_out, dq_out, y_out) P+T-T_out+row+1, and cache rows (dk, dv:
/// the rows of k/v; k_cache_after, v_cache_after) row+1.
inline std::int64_t row_position(const std::string& name, std::int64_t row, std::int64_t P, std::int64_t T,
                                 std::int64_t T_out) {
  if (name == "o_out" || name == "lse_out" || name == "dq_out" || name == "y_out") return P + T - T_out + row + 1;
  if (name == "dk" || name == "dv" || name == "k_cache_after" || name == "v_cache_after") return row + 1;
  return P + row + 1;
}

/// Expected outputs of a case: float64 tensors in the result-file layout plus E_X per tensor.
struct Expected {
  st::File file;                                     ///< o, o_out, lse, lse_out (+ dq, dq_out, dk, dv) as F64 (+ metadata)
  std::map<std::string, check::AbsBaseline> oracle_err;  ///< tensor name -> E_X (0 for f64), or n/a
  std::string dtype;                                 ///< the dtype whose tolerance applies
  bool grad = false;                                 ///< holds the gradients dq, dq_out, dk, dv
  bool layer = false;  ///< a layer case's (layer_suite.hpp): y, y_out, k_cache_after, v_cache_after
  /// The tensors a port's result must hold, in report order: layer_output_names() for a layer
  /// case; else output_names(), then grad_names() when `grad`.
  std::vector<std::string> names() const {
    if (layer) return {layer_output_names().begin(), layer_output_names().end()};
    std::vector<std::string> n(output_names().begin(), output_names().end());
    if (grad) n.insert(n.end(), grad_names().begin(), grad_names().end());
    return n;
  }
};

/// Metadata key under which an expected file stores E_X of tensor `name` ("n/a" when the naive
/// oracle at the dtype overflows; the reason is then under kAbsCriterionKey).
inline std::string err_key(const std::string& name) { return "oracle_at_dtype_maxabs." + name; }
/// Value of err_key() when E_X does not exist.
inline constexpr const char* kNotApplicable = "n/a";
/// Metadata key of the abs criterion's note when it is not applicable: "n/a (<reason>)".
inline constexpr const char* kAbsCriterionKey = "abs_criterion";

/// "%.17g": prints a double so that it reads back exactly.
inline std::string fmt17(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

/// Map from the safetensors dtype to the check dtype name.
inline std::string check_dtype(st::DType t) {
  switch (t) {
    case st::DType::F64: return "f64";
    case st::DType::F32: return "f32";
    case st::DType::F16: return "f16";
    case st::DType::BF16: return "bf16";
  }
  return "f64";
}

/// Parses a dtype name (f64, f32, bf16, f16). \throws orthros::Error otherwise.
inline st::DType parse_check_dtype(const std::string& s) {
  if (s == "f64") return st::DType::F64;
  if (s == "f32") return st::DType::F32;
  if (s == "bf16") return st::DType::BF16;
  if (s == "f16") return st::DType::F16;
  throw Error("dtype must be one of f64, f32, bf16, f16 (got \"" + s + "\")");
}

/// True when `case_file` holds the upstream gradients `do` and `do_out` (a gradient case).
/// \throws orthros::Error if it holds only one of them (named).
inline bool has_upstream(const st::File& case_file) {
  const bool d = case_file.tensors.count("do") > 0, dout = case_file.tensors.count("do_out") > 0;
  require(d == dout, "a gradient case needs both upstream gradients \"do\" [T, H_q, D] and \"do_out\" [T_out, H_q, D]; ",
          "it has only \"", d ? "do" : "do_out", "\"");
  return d;
}

/// The upstream gradients of a gradient case, converted to S (exact when the file stores S):
/// `do` `[T, H_q*D]`, `do_out` `[T_out, H_q*D]` (Mat layout), shapes checked against case `c`.
/// \throws orthros::Error if a tensor is missing or its shape is not `[T, H_q, D]` /
/// `[T_out, H_q, D]` (named, with both shapes), or holds a NaN or Inf (named, with its first index).
template <typename S>
std::pair<Mat<S>, Mat<S>> load_upstream(const st::File& case_file, const AttentionCase<S>& c) {
  auto get = [&](const char* name, std::int64_t rows, const char* doc) -> Mat<S> {
    auto it = case_file.tensors.find(name);
    require(it != case_file.tensors.end(), "missing tensor \"", name, "\" ", doc);
    const std::vector<std::int64_t> want{rows, c.dims.num_q_heads, c.dims.head_dim};
    require(it->second.shape == want, "tensor \"", name, "\" must be ", doc, " = ", st::shape_string(want),
            " (from q and q_out); got ", st::shape_string(it->second.shape));
    orthros::detail::require_finite_tensor(it->second, orthros::detail::cat("tensor \"", name, "\""),
                                           "upstream gradients must be finite");
    return st::to_matrix<S>(it->second, name);
  };
  return {get("do", c.T, "[T, H_q, D]"), get("do_out", c.T_out, "[T_out, H_q, D]")};
}

namespace detail {
/// E_X of every tensor of the case at S: the oracle at S (orthros_attention<S>, and when `gref`
/// is given orthros_attention_backward<S> on the upstream gradients in S) against the float64
/// results `ref` / `gref`. A forward overflow at S makes every E_X n/a; a gradient overflow (the
/// forward at S being finite) makes the four gradients' E_X n/a.
template <typename S>
void oracle_errors(const st::File& case_file, const AttentionResult<double>& ref, const AttentionGrads<double>* gref,
                   std::map<std::string, check::AbsBaseline>& err) {
  const AttentionCase<S> c = load_attention_case<S>(case_file);
  AttentionResult<S> low;
  try {
    low = orthros_attention<S>(c.q, c.k, c.v, c.q_out, c.dims, c.options);
  } catch (const Error& e) {
    if (!check::is_oracle_overflow(e)) throw;
    // No finite naive answer at S: E_X does not exist, criterion 2 is n/a (check.hpp).
    for (const char* n : output_names()) err[n] = check::overflow_baseline(dtype_name<S>(), e);
    if (gref)  // the backward at S needs the forward at S: no finite naive gradients either
      for (const char* n : grad_names()) err[n] = check::overflow_baseline(dtype_name<S>(), e);
    return;
  }
  err["o"] = check::AbsBaseline::of(check::max_abs_diff(low.o, ref.o));
  err["o_out"] = check::AbsBaseline::of(check::max_abs_diff(low.o_out, ref.o_out));
  err["lse"] = check::AbsBaseline::of(check::max_abs_diff(low.lse, ref.lse));
  err["lse_out"] = check::AbsBaseline::of(check::max_abs_diff(low.lse_out, ref.lse_out));
  if (!gref) return;
  const auto [dout, dout_out] = load_upstream<S>(case_file, c);
  AttentionGrads<S> g;
  try {
    g = orthros_attention_backward<S>(c.q, c.k, c.v, c.q_out, low, dout, dout_out, c.dims, c.options);
  } catch (const Error& e) {
    if (!check::is_oracle_overflow(e)) throw;
    for (const char* n : grad_names()) err[n] = check::overflow_baseline(dtype_name<S>(), e);
    return;
  }
  err["dq"] = check::AbsBaseline::of(check::max_abs_diff(g.dq, gref->dq));
  err["dq_out"] = check::AbsBaseline::of(check::max_abs_diff(g.dq_out, gref->dq_out));
  err["dk"] = check::AbsBaseline::of(check::max_abs_diff(g.dk, gref->dk));
  err["dv"] = check::AbsBaseline::of(check::max_abs_diff(g.dv, gref->dv));
}
}  // namespace detail

/// Writes E_X of every tensor of `e` into its file's metadata (err_key(name): "%.17g" or "n/a",
/// with the reason under kAbsCriterionKey). Shared by the operator and layer suites.
inline void record_oracle_errors(Expected& e) {
  for (const std::string& n : e.names()) {
    const check::AbsBaseline& b = e.oracle_err.at(n);
    e.file.metadata[err_key(n)] = b.maxabs ? fmt17(*b.maxabs) : kNotApplicable;
    if (!b.maxabs) e.file.metadata[kAbsCriterionKey] = "n/a (" + b.why_na + ")";
  }
}

/// Runs the float64 oracle on `case_file` (inputs widened exactly) and the oracle at `dtype`
/// (inputs converted to it: exact when the file already stores that dtype) and returns the
/// expected file (F64 results; metadata `dtype` and `oracle_at_dtype_maxabs.<tensor>`). When the
/// oracle at `dtype` overflows (no finite naive answer), every E_X is "n/a" and metadata
/// `abs_criterion` holds "n/a (naive <dtype> oracle overflows: <message>)".
///
/// When the case holds `do` and `do_out` (has_upstream()), the expected file also holds the
/// float64 gradients dq `[T, H_q, D]`, dq_out `[T_out, H_q, D]`, dk and dv `[P+T, H_kv, D]`
/// (orthros_attention_backward<double> after the float64 forward) and their E_X
/// (`oracle_at_dtype_maxabs.dq` etc.); Expected::grad is set. If only the backward at `dtype`
/// overflows, only the gradients' E_X are "n/a" (the note then quotes the gradient overflow).
/// \throws orthros::Error on a malformed case (see load_attention_case, load_upstream), an
///   unknown dtype, or non-finite upstream gradients.
inline Expected compute_expected(const st::File& case_file, const std::string& dtype) {
  Expected e;
  e.dtype = dtype;
  const AttentionCase<double> c = load_attention_case<double>(case_file);
  e.grad = has_upstream(case_file);
  const AttentionResult<double> ref = orthros_attention<double>(c.q, c.k, c.v, c.q_out, c.dims, c.options);
  AttentionGrads<double> gref;
  if (e.grad) {
    const auto [dout, dout_out] = load_upstream<double>(case_file, c);
    gref = orthros_attention_backward<double>(c.q, c.k, c.v, c.q_out, ref, dout, dout_out, c.dims, c.options);
  }
  const AttentionGrads<double>* g = e.grad ? &gref : nullptr;
  const st::DType dt = parse_check_dtype(dtype);
  if (dt == st::DType::F64) {
    for (const std::string& n : e.names()) e.oracle_err[n] = check::AbsBaseline::of(0.0);
  } else if (dt == st::DType::F32) {
    detail::oracle_errors<float>(case_file, ref, g, e.oracle_err);
  } else if (dt == st::DType::BF16) {
    detail::oracle_errors<Eigen::bfloat16>(case_file, ref, g, e.oracle_err);
  } else {
    detail::oracle_errors<Eigen::half>(case_file, ref, g, e.oracle_err);
  }
  e.file = make_attention_result<double>(ref, c.dims, st::DType::F64);
  if (e.grad) {
    const std::int64_t Hq = c.dims.num_q_heads, Hkv = c.dims.num_kv_heads, D = c.dims.head_dim;
    e.file.tensors["dq"] = st::from_matrix<double>(gref.dq, {gref.dq.rows(), Hq, D}, st::DType::F64);
    e.file.tensors["dq_out"] = st::from_matrix<double>(gref.dq_out, {gref.dq_out.rows(), Hq, D}, st::DType::F64);
    e.file.tensors["dk"] = st::from_matrix<double>(gref.dk, {gref.dk.rows(), Hkv, D}, st::DType::F64);
    e.file.tensors["dv"] = st::from_matrix<double>(gref.dv, {gref.dv.rows(), Hkv, D}, st::DType::F64);
  }
  e.file.metadata["producer"] = "orthros golden (float64 oracle)";
  e.file.metadata["dtype"] = dtype;
  record_oracle_errors(e);
  return e;
}

/// Reads E_X and the dtype back from an expected file written by compute_expected() or, for a
/// layer case, compute_layer_expected() (a file holding `y`: Expected::layer, needs y, y_out,
/// k_cache_after, v_cache_after and their E_X). A file with
/// any gradient tensor is a gradient expected file (Expected::grad): it must hold all four
/// (dq, dq_out, dk, dv) and their `oracle_at_dtype_maxabs.*` metadata.
/// \throws orthros::Error if a tensor (o, o_out, lse, lse_out; in a gradient file also dq, dq_out,
/// dk, dv) or the metadata is missing, or the metadata is neither a number nor "n/a" (which needs
/// an `abs_criterion` note "n/a (<reason>)").
inline Expected load_expected(const st::File& f) {
  Expected e;
  e.file = f;
  e.layer = f.tensors.count("y") > 0;  // a layer expected file (layer_suite.hpp)
  if (e.layer)
    for (const char* n : layer_output_names())
      require(f.tensors.count(n), "not a layer expected file: it has no tensor \"", n,
              "\" (needs y, y_out, k_cache_after, v_cache_after)");
  for (const char* n : output_names())
    require(e.layer || f.tensors.count(n), "not an expected file: it has no tensor \"", n,
            "\" (needs o, o_out, lse, lse_out; a layer expected file y, y_out, k_cache_after, v_cache_after)");
  for (const char* n : grad_names()) e.grad = e.grad || (!e.layer && f.tensors.count(n) > 0);
  if (e.grad)
    for (const char* n : grad_names())
      require(f.tensors.count(n), "gradient expected file without tensor \"", n,
              "\" (a file with gradients needs all of dq, dq_out, dk, dv)");
  for (const std::string& n : e.names())  // the float64 oracle's results are finite: anything else is damage
    orthros::detail::require_finite_tensor(f.tensors.at(n), "expected tensor \"" + n + "\"",
                                           "the oracle's expected results are always finite: the file is damaged");
  auto d = f.metadata.find("dtype");
  require(d != f.metadata.end(), "expected file lacks metadata \"dtype\"");
  e.dtype = d->second;
  for (const std::string& n : e.names()) {
    auto it = f.metadata.find(err_key(n));
    require(it != f.metadata.end(), "expected file lacks metadata \"", err_key(n), "\"");
    if (it->second == kNotApplicable) {
      auto note = f.metadata.find(kAbsCriterionKey);
      const std::string pre = "n/a (";
      require(note != f.metadata.end() && note->second.rfind(pre, 0) == 0 && note->second.size() > pre.size() + 1 &&
                  note->second.back() == ')',
              "metadata \"", err_key(n), "\" is n/a but \"", kAbsCriterionKey,
              "\" does not say why (needs \"n/a (<reason>)\")");
      e.oracle_err[n] =
          check::AbsBaseline::not_applicable(note->second.substr(pre.size(), note->second.size() - pre.size() - 1));
      continue;
    }
    double x = 0;
    require(orthros::detail::parse_double_strict(it->second, x), "metadata \"", err_key(n),
            "\" is not a number or n/a (got \"", it->second, "\")");
    require(std::isfinite(x) && x >= 0, "metadata \"", err_key(n), "\" must be finite and >= 0 (got ", it->second,
            ")");
    e.oracle_err[n] = check::AbsBaseline::of(x);
  }
  return e;
}

/// Whether `orthros check --suite` judges a case's gradients, from the manifest's
/// top-level `"grad"` (`suite_grad`, absent: nullopt), the case's own `"grad"` (`case_grad`) and
/// whether its expected file holds dq, dq_out, dk, dv (`expected_has_grad`):
/// - a per-case flag decides and must match the expected file: `"grad": false` is a forward-only
///   case (only o, o_out, lse, lse_out judged, even in a `--grad` suite: `edge_large_logits`,
///   whose one-hot softmax leaves no resolvable gradient); `"grad": true` needs the gradients;
/// - without one, a suite with `"grad": true` (written before per-case flags) needs gradients in
///   every expected file, and any other suite judges what its expected file holds.
/// \throws orthros::Error (a bad suite: exit 2) when the flag and the expected file disagree.
inline bool suite_case_grad(std::optional<bool> suite_grad, std::optional<bool> case_grad, bool expected_has_grad) {
  if (case_grad) {
    require(!*case_grad || expected_has_grad,
            "the manifest says \"grad\": true for this case but its expected file has no gradients (dq, dq_out, "
            "dk, dv)");
    require(*case_grad || !expected_has_grad,
            "the manifest says \"grad\": false for this case (forward only) but its expected file holds gradients "
            "(dq, dq_out, dk, dv)");
    return *case_grad;
  }
  require(!suite_grad.value_or(false) || expected_has_grad,
          "the manifest says \"grad\": true (and the case has no \"grad\" of its own) but its expected file has no "
          "gradients (dq, dq_out, dk, dv)");
  return expected_has_grad;
}

/// Flat float64 values of a tensor (exact widening).
inline std::vector<double> values(const st::Tensor& t) {
  const std::int64_t n = t.numel();
  std::vector<double> v(static_cast<size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = st::element(t, i);
  return v;
}

}  // namespace orthros::portkit
