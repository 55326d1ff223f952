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
  st::File file;                           ///< o, o_out, lse, lse_out as F64 (+ metadata)
  std::map<std::string, double> oracle_err;///< tensor name -> E_X (0 when dtype is f64)
  std::string dtype;                       ///< the dtype whose tolerance applies
};

/// Metadata key under which an expected file stores E_X of tensor `name`.
inline std::string err_key(const std::string& name) { return "oracle_at_dtype_maxabs." + name; }

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
void oracle_errors(const st::File& case_file, const AttentionResult<double>& ref, std::map<std::string, double>& err) {
  const AttentionCase<S> c = load_attention_case<S>(case_file);
  const AttentionResult<S> low = orthros_attention<S>(c.q, c.k, c.v, c.q_out, c.dims, c.options);
  err["o"] = check::max_abs_diff(low.o, ref.o);
  err["o_out"] = check::max_abs_diff(low.o_out, ref.o_out);
  err["lse"] = check::max_abs_diff(low.lse, ref.lse);
  err["lse_out"] = check::max_abs_diff(low.lse_out, ref.lse_out);
}
}  // namespace detail

/// Runs the float64 oracle on `case_file` (inputs widened exactly) and the oracle at `dtype`
/// (inputs converted to it: exact when the file already stores that dtype) and returns the
/// expected file (F64 results; metadata `dtype` and `oracle_at_dtype_maxabs.<tensor>`).
/// \throws orthros::Error on a malformed case (see load_attention_case) or an unknown dtype.
inline Expected compute_expected(const st::File& case_file, const std::string& dtype) {
  Expected e;
  e.dtype = dtype;
  const AttentionCase<double> c = load_attention_case<double>(case_file);
  const AttentionResult<double> ref = orthros_attention<double>(c.q, c.k, c.v, c.q_out, c.dims, c.options);
  const st::DType dt = parse_check_dtype(dtype);
  if (dt == st::DType::F64) {
    for (const char* n : output_names()) e.oracle_err[n] = 0.0;
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
  for (const char* n : output_names()) e.file.metadata[err_key(n)] = fmt17(e.oracle_err[n]);
  return e;
}

/// Reads E_X and the dtype back from an expected file written by compute_expected().
/// \throws orthros::Error if a tensor (o, o_out, lse, lse_out) or the metadata is missing, or the
/// metadata is not a number.
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
    double x = 0;
    require(orthros::detail::parse_double_strict(it->second, x), "metadata \"", err_key(n),
            "\" is not a number (got \"", it->second, "\")");
    e.oracle_err[n] = x;
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
