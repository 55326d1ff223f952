/// \file check.hpp
/// \brief The SPEC §6 acceptance criterion: does a port's (or a kernel's) output agree with the
/// float64 oracle closely enough for its dtype?
///
/// A port computing in dtype X passes on one output tensor when ALL of these hold (SPEC §6):
///   1. relative Frobenius error  `‖out − ref‖_F / ‖ref‖_F  ≤ rel_tolerance(X)`
///      (1e-5 f32, 2e-3 f16, 1e-2 bf16; 1e-12 for f64 — see rel_tolerance());
///   2. max abs error  `max_i |out_i − ref_i|  ≤  2 · E_X + 1e-6`, where `E_X` is the max abs error
///      of the oracle itself run at precision X on the same inputs (FlashAttention's criterion:
///      a kernel may be no worse than a naive implementation at its own precision);
///   3. no NaN or Inf in `out` (the reference of finite inputs is always finite);
///   4. `out` has the reference's shape.
///
/// When the reference tensor is exactly zero everywhere (structural zeros of the backward: `dq`
/// with w = 1, every gradient of a one-key softmax row, `dq_out`/`dk` when a single key is seen),
/// criterion 1 is *not applicable* — `‖out − ref‖_F / 0` is infinite for any rounding noise — and
/// the tensor is judged by criteria 2-4 (TensorReport::rel_applicable, rel_note).
///
/// When the naive oracle at X has no finite answer on the inputs (its scaled scores overflow X,
/// e.g. |q·k·scale| > 65504 at f16: `orthros_attention<S>` throws; or, for the gradients of the
/// backward, a gradient overflows X: `orthros_attention_backward<S>` throws), `E_X` does not exist and
/// criterion 2 is *not applicable*: the port is judged by criteria 1, 3 and 4 only, and every
/// report says so (AbsBaseline::not_applicable, TensorReport::abs_note). A missing `E_X` is never
/// taken as 0 (that would shrink the bound to 1e-6 and fail correct ports).
///
/// `ref` is always the float64 oracle's result on the case's inputs widened exactly to float64.
/// This header has no file IO: the `orthros check` command, the Python bindings and the GPU
/// tests all call compare() on flat, row-major float64 buffers (or on `Mat<S>`).
#pragma once

#include "orthros/attention_backward.hpp"  // kGradientOverflowPrefix
#include "orthros/tensor.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace orthros::check {

/// Relative Frobenius tolerance of SPEC §6 for a port computing in `dtype`
/// ("f64", "f32", "bf16", "f16"). f64 is not in SPEC §6; we use 1e-12, i.e. ~4500 ulp of a
/// double: a float64 port that only reorders sums stays far below it (our own float64 ports
/// reach ~1e-16), while any mask or indexing error is orders of magnitude above it.
/// \throws orthros::Error for an unknown dtype name.
inline double rel_tolerance(const std::string& dtype) {
  if (dtype == "f64") return 1e-12;
  if (dtype == "f32") return 1e-5;
  if (dtype == "f16") return 2e-3;
  if (dtype == "bf16") return 1e-2;
  throw Error("dtype must be one of f64, f32, bf16, f16 (got \"" + dtype + "\")");
}

/// Absolute slack added to the max-abs bound of SPEC §6 (criterion 2).
constexpr double kAbsSlack = 1e-6;

/// Max-abs tolerance of SPEC §6: `2 · oracle_at_dtype_maxabs + 1e-6`, where `oracle_at_dtype_maxabs`
/// is the max abs error of the oracle run at the port's dtype against the float64 oracle
/// (0 for f64, where the oracle *is* the reference).
/// \throws orthros::Error if `oracle_at_dtype_maxabs` is negative or not finite.
inline double abs_tolerance(double oracle_at_dtype_maxabs) {
  require(std::isfinite(oracle_at_dtype_maxabs) && oracle_at_dtype_maxabs >= 0,
          "oracle_at_dtype_maxabs must be finite and >= 0 (got ", oracle_at_dtype_maxabs, ")");
  return 2.0 * oracle_at_dtype_maxabs + kAbsSlack;
}

/// The `E_X` of criterion 2 for one tensor, or the reason there is none.
struct AbsBaseline {
  std::optional<double> maxabs;  ///< E_X (max abs error of the oracle at the dtype); empty: n/a
  std::string why_na;            ///< when `maxabs` is empty: why, e.g. "naive f16 oracle overflows: ..."
  /// A measured E_X. \throws orthros::Error if it is negative or not finite.
  static AbsBaseline of(double e) {
    require(std::isfinite(e) && e >= 0, "oracle_at_dtype_maxabs must be finite and >= 0 (got ", e, ")");
    return AbsBaseline{e, ""};
  }
  /// No E_X: criterion 2 does not apply. \throws orthros::Error if `why` is empty (say why).
  static AbsBaseline not_applicable(std::string why) {
    require(!why.empty(), "AbsBaseline::not_applicable needs a reason");
    return AbsBaseline{std::nullopt, std::move(why)};
  }
};

/// Prefix of the orthros::Error that `orthros_attention<S>` throws when finite inputs make the
/// scaled scores overflow S (attention.hpp).
inline constexpr const char* kOracleOverflowPrefix = "scaled scores q.k*scale overflow";

/// True when `e` says the naive oracle at some precision has no finite answer on finite inputs,
/// as opposed to bad input: the forward's "scaled scores overflow" error (kOracleOverflowPrefix,
/// `orthros_attention<S>`) or the backward's "attention gradients overflow" error
/// (orthros::kGradientOverflowPrefix, `orthros_attention_backward<S>` in attention_backward.hpp).
inline bool is_oracle_overflow(const std::exception& e) {
  const std::string what = e.what();
  return what.rfind(kOracleOverflowPrefix, 0) == 0 || what.rfind(orthros::kGradientOverflowPrefix, 0) == 0;
}

/// The not-applicable baseline for an oracle at `dtype` that threw the overflow error `e`:
/// reason "naive <dtype> oracle overflows: <e.what()>".
inline AbsBaseline overflow_baseline(const std::string& dtype, const std::exception& e) {
  return AbsBaseline::not_applicable("naive " + dtype + " oracle overflows: " + e.what());
}

/// Everything the checker reports about one output tensor (SPEC §6; issue 3).
struct TensorReport {
  std::string name;                  ///< tensor name ("o", "o_out", "lse", "lse_out", ...)
  std::vector<std::int64_t> shape;   ///< reference shape, e.g. [T, H_q, D]
  std::vector<std::int64_t> actual_shape;  ///< the port's shape (differs from `shape` when shape_ok is false)
  std::string dtype;                 ///< dtype whose tolerance applies
  bool shape_ok = true;              ///< actual has the reference's shape (criterion 4)
  double rel_fro = 0;                ///< ‖out − ref‖_F / ‖ref‖_F (0/0 := 0, x/0 := inf; inf when out holds NaN/Inf)
  /// Criterion 1 applies: false when the reference is exactly zero everywhere (‖ref‖_F = 0, e.g.
  /// dq with w = 1 or every gradient of a one-key softmax row): a relative error has no scale
  /// there, and the tensor is judged by criteria 2-4 (`rel_note` says so).
  bool rel_applicable = true;
  std::string rel_note;              ///< "n/a (...)" when criterion 1 does not apply, else ""
  /// max_i |out_i − ref_i|; +inf when out holds a NaN or Inf (as rel_fro: the error is unbounded,
  /// never the max over the finite entries alone, which is 0 for an all-NaN tensor)
  double max_abs = 0;
  /// max_i |out_i − ref_i| / max(|ref_i|, 1e-6·max|ref|) (informational); +inf when out holds NaN/Inf
  double max_rel = 0;
  std::vector<std::int64_t> worst_index;  ///< multi-index of the max-abs error (first NaN/Inf if any)
  double worst_actual = 0;           ///< out at worst_index
  double worst_ref = 0;              ///< ref at worst_index
  std::int64_t nan_count = 0;        ///< NaNs in out
  std::int64_t inf_count = 0;        ///< ±Infs in out
  double rel_tol = 0;                ///< criterion 1 bound
  double abs_tol = 0;                ///< criterion 2 bound (+inf when not applicable)
  double oracle_at_dtype_maxabs = 0; ///< E_X used for abs_tol (NaN when not applicable)
  bool abs_applicable = true;        ///< criterion 2 applies (E_X exists)
  /// "n/a (<why>)" when criterion 2 does not apply (AbsBaseline::why_na), else "".
  std::string abs_note;
  bool pass_rel = false;             ///< criterion 1
  bool pass_abs = false;             ///< criterion 2 (when not applicable: true iff out is finite)
  bool pass_finite = false;          ///< criterion 3
  bool pass = false;                 ///< all four criteria
  /// Rows (first index) whose max abs error exceeds abs_tol, or that hold NaN/Inf; at most
  /// `kMaxBadRows` listed, ascending. Points a porter at the wrong tokens.
  std::vector<std::int64_t> bad_rows;
  std::int64_t bad_row_count = 0;    ///< total number of such rows (may exceed bad_rows.size())
  /// Every such row as ascending, disjoint runs of consecutive rows `{first, last}` (inclusive;
  /// a single row is `{r, r}`): all bad rows, not only the first kMaxBadRows, in as many runs as
  /// the rows form (e.g. rows 3..174 are one run {3, 174}).
  std::vector<std::pair<std::int64_t, std::int64_t>> bad_row_ranges;
};

/// Most rows listed in TensorReport::bad_rows.
constexpr std::size_t kMaxBadRows = 16;

/// Row-major multi-index of flat offset `flat` in a tensor of `shape` (empty shape: scalar).
inline std::vector<std::int64_t> unravel(std::int64_t flat, const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> idx(shape.size(), 0);
  for (std::size_t i = shape.size(); i-- > 0;) {
    const std::int64_t n = shape[i] > 0 ? shape[i] : 1;
    idx[i] = flat % n;
    flat /= n;
  }
  return idx;
}

/// Number of elements of `shape` (1 for a scalar). \throws orthros::Error on a negative extent.
inline std::int64_t numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto s : shape) {
    require(s >= 0, "tensor extents must be >= 0 (got ", s, ")");
    n *= s;
  }
  return n;
}

/// Compares a port's output with the float64 oracle under SPEC §6.
///
/// \param name    tensor name, for the report
/// \param actual  the port's output, flat row-major, widened to float64 (exactly, from any dtype)
/// \param actual_shape its shape
/// \param ref     the float64 oracle's output, flat row-major; must be finite
/// \param ref_shape its shape, e.g. `[T, H_q, D]` for o or `[T, H_q]` for lse
/// \param dtype   the dtype the port computed in (selects the relative tolerance)
/// \param baseline E_X of `dtype` on this tensor (AbsBaseline::of(0) for f64), or not applicable
///   (criterion 2 skipped, the reason recorded in TensorReport::abs_note)
/// \returns the full report; a shape mismatch is reported (shape_ok = false, pass = false), not thrown.
/// \throws orthros::Error if `ref` is not finite, a buffer size disagrees with its shape, or the
///   dtype/oracle error are invalid.
inline TensorReport compare(const std::string& name, const std::vector<double>& actual,
                            const std::vector<std::int64_t>& actual_shape, const std::vector<double>& ref,
                            const std::vector<std::int64_t>& ref_shape, const std::string& dtype,
                            const AbsBaseline& baseline) {
  TensorReport r;
  r.name = name;
  r.shape = ref_shape;
  r.actual_shape = actual_shape;
  r.dtype = dtype;
  r.rel_tol = rel_tolerance(dtype);
  if (baseline.maxabs) {
    r.abs_tol = abs_tolerance(*baseline.maxabs);
    r.oracle_at_dtype_maxabs = *baseline.maxabs;
  } else {
    require(!baseline.why_na.empty(), "compare: a baseline without E_X must say why");
    r.abs_applicable = false;
    r.abs_note = "n/a (" + baseline.why_na + ")";
    r.abs_tol = std::numeric_limits<double>::infinity();
    r.oracle_at_dtype_maxabs = std::numeric_limits<double>::quiet_NaN();
  }
  require(static_cast<std::int64_t>(ref.size()) == numel(ref_shape), "reference '", name, "' holds ", ref.size(),
          " values but its shape needs ", numel(ref_shape));
  require(static_cast<std::int64_t>(actual.size()) == numel(actual_shape), "actual '", name, "' holds ",
          actual.size(), " values but its shape needs ", numel(actual_shape));
  if (actual_shape != ref_shape) {
    r.shape_ok = false;
    r.rel_fro = r.max_abs = r.max_rel = std::numeric_limits<double>::infinity();
    return r;  // all pass_* stay false
  }
  double ref_max = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(ref[i])) {
      std::ostringstream at;
      const std::vector<std::int64_t> idx = unravel(static_cast<std::int64_t>(i), ref_shape);
      for (std::size_t d = 0; d < idx.size(); ++d) at << (d ? ", " : "[") << idx[d];
      throw Error(detail::cat("reference '", name, "' holds ",
                              std::isnan(ref[i]) ? "NaN" : (ref[i] > 0 ? "inf" : "-inf"), " at ",
                              idx.empty() ? "[" : at.str(), "] (flat index ", i,
                              "; the first non-finite value: a reference must be finite)"));
    }
    ref_max = std::max(ref_max, std::abs(ref[i]));
  }
  const double rel_floor = std::max(1e-6 * ref_max, std::numeric_limits<double>::min());
  const std::int64_t rows = ref_shape.empty() ? 1 : ref_shape[0];
  const std::int64_t per_row = rows > 0 ? static_cast<std::int64_t>(ref.size()) / rows : 0;

  double diff2 = 0, ref2 = 0;
  std::int64_t worst = -1, first_bad = -1;
  std::int64_t last_bad_row = -1;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double a = actual[i], b = ref[i];
    ref2 += b * b;
    const std::int64_t row = per_row > 0 ? static_cast<std::int64_t>(i) / per_row : 0;
    bool bad = false;
    if (std::isnan(a)) {
      ++r.nan_count;
      bad = true;
      if (first_bad < 0) first_bad = static_cast<std::int64_t>(i);
    } else if (std::isinf(a)) {
      ++r.inf_count;
      bad = true;
      if (first_bad < 0) first_bad = static_cast<std::int64_t>(i);
    } else {
      const double e = std::abs(a - b);
      diff2 += e * e;
      if (worst < 0 || e > r.max_abs) {
        r.max_abs = e;
        worst = static_cast<std::int64_t>(i);
      }
      r.max_rel = std::max(r.max_rel, e / std::max(std::abs(b), rel_floor));
      bad = e > r.abs_tol;
    }
    if (bad && row != last_bad_row) {
      ++r.bad_row_count;
      if (r.bad_rows.size() < kMaxBadRows) r.bad_rows.push_back(row);
      if (!r.bad_row_ranges.empty() && r.bad_row_ranges.back().second + 1 == row) r.bad_row_ranges.back().second = row;
      else r.bad_row_ranges.emplace_back(row, row);
      last_bad_row = row;
    }
  }
  const bool finite = r.nan_count == 0 && r.inf_count == 0;
  if (!finite) {  // a NaN or Inf has no finite error: every error measure is +inf (nan_count, inf_count say why)
    r.rel_fro = r.max_abs = r.max_rel = std::numeric_limits<double>::infinity();
  } else if (ref2 == 0) {
    r.rel_fro = diff2 == 0 ? 0.0 : std::numeric_limits<double>::infinity();
    r.rel_applicable = false;
    r.rel_note = "n/a (the reference is exactly zero: judged by the max-abs bound)";
  } else {
    r.rel_fro = std::sqrt(diff2) / std::sqrt(ref2);
  }
  const std::int64_t at = first_bad >= 0 ? first_bad : worst;
  if (at >= 0) {
    r.worst_index = unravel(at, ref_shape);
    r.worst_actual = actual[static_cast<std::size_t>(at)];
    r.worst_ref = ref[static_cast<std::size_t>(at)];
  }
  r.pass_finite = finite;
  r.pass_rel = finite && (!r.rel_applicable || r.rel_fro <= r.rel_tol);
  r.pass_abs = finite && (!r.abs_applicable || r.max_abs <= r.abs_tol);
  r.pass = r.shape_ok && r.pass_finite && r.pass_rel && r.pass_abs;
  return r;
}

/// compare() with a measured E_X: `oracle_at_dtype_maxabs` (0 for f64). Same criterion and errors.
inline TensorReport compare(const std::string& name, const std::vector<double>& actual,
                            const std::vector<std::int64_t>& actual_shape, const std::vector<double>& ref,
                            const std::vector<std::int64_t>& ref_shape, const std::string& dtype,
                            double oracle_at_dtype_maxabs) {
  rel_tolerance(dtype);  // an unknown dtype is reported before a bad E_X
  return compare(name, actual, actual_shape, ref, ref_shape, dtype, AbsBaseline::of(oracle_at_dtype_maxabs));
}

/// One line for reports: "max|out-ref| <= 2*E_X + 1e-6 = <tol>" or the n/a note.
inline std::string abs_criterion_text(const TensorReport& r) {
  if (!r.abs_applicable) return r.abs_note;
  std::ostringstream os;
  os.precision(3);
  os << "max|out-ref| <= 2*E_X + 1e-6 = " << r.abs_tol;
  return os.str();
}

/// Flattens a row-major `Mat<S>` (a `[rows, H*D]` tensor) to float64, exactly.
template <typename S>
std::vector<double> to_f64(const Mat<S>& m) {
  std::vector<double> out(static_cast<std::size_t>(m.size()));
  for (Eigen::Index i = 0; i < m.size(); ++i) out[static_cast<std::size_t>(i)] = static_cast<double>(m.data()[i]);
  return out;
}

/// Max abs difference of two same-shaped matrices, in float64 (for E_X: oracle at dtype vs f64 oracle).
/// \throws orthros::Error on a shape mismatch.
template <typename A, typename B>
double max_abs_diff(const Mat<A>& a, const Mat<B>& b) {
  require(a.rows() == b.rows() && a.cols() == b.cols(), "max_abs_diff: shapes differ ([", a.rows(), ", ", a.cols(),
          "] vs [", b.rows(), ", ", b.cols(), "])");
  double m = 0;
  for (Eigen::Index i = 0; i < a.size(); ++i)
    m = std::max(m, std::abs(static_cast<double>(a.data()[i]) - static_cast<double>(b.data()[i])));
  return m;
}

/// Convenience overload for Mat tensors `[rows, heads*inner]` reported as `[rows, heads, inner]`
/// (pass inner = 1 for a `[rows, heads]` LSE). Same criterion and errors as the flat overload.
template <typename A>
TensorReport compare(const std::string& name, const Mat<A>& actual, const Mat<double>& ref, int heads, int inner,
                     const std::string& dtype, const AbsBaseline& baseline) {
  auto shape_of = [&](Eigen::Index rows, Eigen::Index cols) {
    std::vector<std::int64_t> s{static_cast<std::int64_t>(rows)};
    if (inner == 1) {
      s.push_back(static_cast<std::int64_t>(cols));
    } else {
      s.push_back(heads);
      s.push_back(cols / heads);
    }
    return s;
  };
  require(heads >= 1 && inner >= 1, "compare: heads and inner must be >= 1 (got ", heads, ", ", inner, ")");
  require(ref.cols() == Eigen::Index(heads) * inner, "compare: reference '", name, "' has ", ref.cols(),
          " columns, expected heads*inner = ", heads * inner);
  auto as = shape_of(actual.rows(), actual.cols());
  if (inner != 1 && actual.cols() % heads != 0) as = {actual.rows(), actual.cols()};
  return compare(name, to_f64(actual), as, to_f64(ref), shape_of(ref.rows(), ref.cols()), dtype, baseline);
}

/// Mat overload with a measured E_X (see above).
template <typename A>
TensorReport compare(const std::string& name, const Mat<A>& actual, const Mat<double>& ref, int heads, int inner,
                     const std::string& dtype, double oracle_at_dtype_maxabs) {
  return compare(name, actual, ref, heads, inner, dtype, AbsBaseline::of(oracle_at_dtype_maxabs));
}

}  // namespace orthros::check
