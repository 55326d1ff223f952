/// \file portkit.hpp
/// \brief Shared by `orthros golden` and `orthros check` (issue 3): the expected results of an
/// attention case under SPEC §6 — the float64 oracle's outputs and, per output tensor, the max
/// abs error of the oracle run at the port's dtype (the `E_X` of the max-abs criterion).
#pragma once

#include "orthros/attention.hpp"
#include "orthros/case_io.hpp"
#include "orthros/check.hpp"
#include "orthros/safetensors.hpp"

#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

namespace orthros::portkit {

/// Names of the four output tensors of an attention case, in report order (SPEC §5).
inline const std::array<const char*, 4>& output_names() {
  static const std::array<const char*, 4> n{"o", "o_out", "lse", "lse_out"};
  return n;
}

/// Expected outputs of a case: float64 tensors in the result-file layout plus E_X per tensor.
struct Expected {
  st::File file;                                     ///< o, o_out, lse, lse_out as F64 (+ metadata)
  std::map<std::string, check::AbsBaseline> oracle_err;  ///< tensor name -> E_X (0 for f64), or n/a
  std::string dtype;                                 ///< the dtype whose tolerance applies
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

namespace detail {
template <typename S>
void oracle_errors(const st::File& case_file, const AttentionResult<double>& ref,
                   std::map<std::string, check::AbsBaseline>& err) {
  const AttentionCase<S> c = load_attention_case<S>(case_file);
  AttentionResult<S> low;
  try {
    low = orthros_attention<S>(c.q, c.k, c.v, c.q_out, c.dims, c.options);
  } catch (const Error& e) {
    if (!check::is_oracle_overflow(e)) throw;
    // No finite naive answer at S: E_X does not exist, criterion 2 is n/a (check.hpp).
    for (const char* n : {"o", "o_out", "lse", "lse_out"}) err[n] = check::overflow_baseline(dtype_name<S>(), e);
    return;
  }
  err["o"] = check::AbsBaseline::of(check::max_abs_diff(low.o, ref.o));
  err["o_out"] = check::AbsBaseline::of(check::max_abs_diff(low.o_out, ref.o_out));
  err["lse"] = check::AbsBaseline::of(check::max_abs_diff(low.lse, ref.lse));
  err["lse_out"] = check::AbsBaseline::of(check::max_abs_diff(low.lse_out, ref.lse_out));
}
}  // namespace detail

/// Runs the float64 oracle on `case_file` (inputs widened exactly) and the oracle at `dtype`
/// (inputs converted to it: exact when the file already stores that dtype) and returns the
/// expected file (F64 results; metadata `dtype` and `oracle_at_dtype_maxabs.<tensor>`). When the
/// oracle at `dtype` overflows (no finite naive answer), every E_X is "n/a" and metadata
/// `abs_criterion` holds "n/a (naive <dtype> oracle overflows: <message>)".
/// \throws orthros::Error on a malformed case (see load_attention_case) or an unknown dtype.
inline Expected compute_expected(const st::File& case_file, const std::string& dtype) {
  Expected e;
  e.dtype = dtype;
  const AttentionCase<double> c = load_attention_case<double>(case_file);
  const AttentionResult<double> ref = orthros_attention<double>(c.q, c.k, c.v, c.q_out, c.dims, c.options);
  const st::DType dt = parse_check_dtype(dtype);
  if (dt == st::DType::F64) {
    for (const char* n : output_names()) e.oracle_err[n] = check::AbsBaseline::of(0.0);
  } else if (dt == st::DType::F32) {
    detail::oracle_errors<float>(case_file, ref, e.oracle_err);
  } else if (dt == st::DType::BF16) {
    detail::oracle_errors<Eigen::bfloat16>(case_file, ref, e.oracle_err);
  } else {
    detail::oracle_errors<Eigen::half>(case_file, ref, e.oracle_err);
  }
  e.file = make_attention_result<double>(ref, c.dims, st::DType::F64);
  e.file.metadata["producer"] = "orthros golden (float64 oracle)";
  e.file.metadata["dtype"] = dtype;
  for (const char* n : output_names()) {
    const check::AbsBaseline& b = e.oracle_err.at(n);
    e.file.metadata[err_key(n)] = b.maxabs ? fmt17(*b.maxabs) : kNotApplicable;
    if (!b.maxabs) e.file.metadata[kAbsCriterionKey] = "n/a (" + b.why_na + ")";
  }
  return e;
}

/// Reads E_X and the dtype back from an expected file written by compute_expected().
/// \throws orthros::Error if a tensor (o, o_out, lse, lse_out) or the metadata is missing, or the
/// metadata is neither a number nor "n/a" (which needs an `abs_criterion` note "n/a (<reason>)").
inline Expected load_expected(const st::File& f) {
  Expected e;
  e.file = f;
  for (const char* n : output_names())
    require(f.tensors.count(n), "not an expected file: it has no tensor \"", n, "\" (needs o, o_out, lse, lse_out)");
  auto d = f.metadata.find("dtype");
  require(d != f.metadata.end(), "expected file lacks metadata \"dtype\"");
  e.dtype = d->second;
  for (const char* n : output_names()) {
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

/// Flat float64 values of a tensor (exact widening).
inline std::vector<double> values(const st::Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (std::int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = st::element(t, i);
  return v;
}

}  // namespace orthros::portkit
