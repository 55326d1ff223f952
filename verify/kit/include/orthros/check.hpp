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
/// For `lse` and `lse_out` of a port in f32, bf16 or f16 (a float32 LSE, as attention kernels
/// return it) the bound of criterion 2 is `2 · E_X + 1e-6 + F`, with F the float32 rounding floor
/// of an online-softmax LSE derived at lse_f32_floor() (SPEC §6): compare() adds it when given the
/// most keys a row of the tensor sees (`lse_max_keys`, lse_max_keys()).
///
/// For the same LSE tensors (any dtype) criterion 1 measures the error against the elementwise
/// scale max(|lse_i|, 1): `‖out − ref‖_F / ‖max(|ref|, 1)‖_F ≤ rel_tolerance(X)`
/// (lse_rel_scale(); TensorReport::rel_lse_scale). An LSE is a logarithm: its error is relative
/// to |L| where |L| ≥ 1 and, below, the relative error of the normalizer e^L, which is absolute in L.
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

#include <algorithm>
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

/// Unit roundoff of float32, round to nearest: u = 2^-24 (|fl(x) - x| <= u |x|).
inline constexpr double kF32UnitRoundoff = 0x1p-24;

/// The float32 rounding floor F of an LSE computed by an online softmax in float32 (SPEC §6),
/// added to the max-abs bound of `lse` / `lse_out`:
///
///     F = u · (5 · max_i |lse_i| + 6 · ln n),   u = 2^-24,
///
/// `max_i |lse_i|` over the tensor's reference values (natural log), `n` the most keys a row of
/// the tensor sees. Derivation, first order in u, per row: scaled scores s_j (j = 1..n) as the
/// oracle has them, m = max_j s_j, L = m + ln l with l = Σ_j e^(s_j − m), p_j = e^(s_j − L).
/// Since s_j ≤ m ≤ L ≤ m + ln n:  Σ_j p_j (L − s_j) = H(p) ≤ ln n (H the entropy of p), hence
/// Σ_j p_j |s_j| ≤ |L| + ln n, Σ_j p_j (m − s_j) ≤ ln n and |m| ≤ |L| + ln n. L is the
/// log-sum-exp of the scores with gradient p, so exponent errors Δ_j cost Σ_j p_j |Δ_j|.
/// FlashAttention-2/3, cuDNN and Triton/FlexAttention fold the scale into exp2: in log2 units
/// a_j = s_j log2(e), running max M and sum l in float32.
///  - log2 form (L = fl(fl(M + fl(log2 l)) · fl(ln 2))):
///    1. a_j = fl(c · r_j), c = fl(scale · log2 e), r_j the raw dot: 2u |a_j|  -> 2u (|L| + ln n);
///    2. fl(a_j − M) and the rescaling exponents fl(M_old − M_new) telescope to u (M − a_j) per
///       key (the M used cancels in M + log2 Σ 2^(a_j − M))          ->  u ln n;
///       (a rescaling exponent formed as fma(M_old, c, −fl(M_new c)) instead is the rounding
///       residual, not 0, when the max is unchanged: l drifts by 2^(u |M c|) per block, a bias
///       this bound does not cover; the kernels subtract the maxima first);
///    3. fl(log2 l), l ≤ n                                              ->  u ln n;
///    4. M + log2 l rounded (u |L|), ln 2 rounded (u |L|), the product rounded to float32
///       (u |L|, the floor of any float32 result)                       ->  3u |L|;
///    total u (5 |L| + 4 ln n).
///  - natural form (FlashAttention-2: exponents fma(r_j, c, −fl(M_r c)), L = fma(M_r, fl(scale),
///    logf(l)) with M_r the raw max): c rounded -> u (|L| + ln n); the fma -> u ln n; logf ->
///    u ln n; M_r · fl(scale) differs from the exponents' fl(M_r c) · ln 2 by 3 roundings of |m|
///    -> 3u (|L| + ln n); the final fma -> u |L|; total u (5 |L| + 6 ln n).
/// F takes the larger. What the naive float32 oracle does as well — the n-term float32 sum of l,
/// exp and log of O(1) arguments: absolute errors in L that do not grow with |L| (and the
/// hardware exp2/log2 approximations, ~2^-22 each) — stays judged by 2 · E_X + 1e-6 as for every
/// tensor, and F is added (first order the errors add). F is what E_X misses: the oracle computes
/// in natural units with the scores as given, rounding an |L|-sized value once (0.5 ulp(L), and
/// near 0 by luck on a small tensor), while the log2 path rounds |L|-sized values 3-5 times.
/// Measured on `edge_grad_large_logits` (|lse| 234, n ≤ 8): cuDNN, FlexAttention and Triton
/// kernels 1.7e-5, the PyTorch example port 2.3e-5, against 2 E_X + 1e-6 = 1.6e-5; F = 7.1e-5.
/// What it does not let pass: an LSE in log2 is off by (log2(e) − 1) |L| = 0.44 |L| ≫ 5u |L|; a
/// window off by one moves L by ln(1 ± p) for the key's probability p (~1/n for comparable
/// scores, ≥ 3e-4 for a key within 8 of the row max among ≤ 8 keys) (verify/portkit/test_check_lse.cpp).
/// \throws orthros::Error if max_abs_lse is negative or not finite, or max_keys < 1.
inline double lse_f32_floor(double max_abs_lse, std::int64_t max_keys) {
  require(std::isfinite(max_abs_lse) && max_abs_lse >= 0, "max_abs_lse must be finite and >= 0 (got ", max_abs_lse,
          ")");
  require(max_keys >= 1, "max_keys (most keys a row sees) must be >= 1 (got ", max_keys, ")");
  return kF32UnitRoundoff * (5.0 * max_abs_lse + 6.0 * std::log(static_cast<double>(max_keys)));
}

/// The scale of criterion 1 for an LSE tensor (SPEC §6): `‖max(|ref_i|, 1)‖_F`, i.e.
/// `sqrt(Σ_i max(ref_i², 1))`, in place of `‖ref‖_F`.
///
/// Why: L = ln Z with Z = Σ_j e^(s_j) the row's softmax normalizer. Adding c to every score of a
/// row adds c to L and changes nothing else (the probabilities, o, every gradient), so the size of
/// |L| — how far it lies from an arbitrary origin — says nothing about the precision it needs: an
/// LSE near 0 is as hard to compute as one near 10. What a port's LSE is used for is e^L (the
/// backward's P = e^(s − L), merges of split-KV partials): an error ΔL is a relative error ΔZ/Z = ΔL
/// of Z. So below |L| = 1 the tolerance is the relative tolerance of Z, |ΔL| ≤ rel_X; at |L| ≥ 1
/// it is the relative tolerance of L itself, as for every tensor (F's derivation at
/// lse_f32_floor() has both parts: roundings of |L|-sized values, u |L|, and errors in Z's sum and
/// log, absolute in L). With ‖ref‖_F alone a row whose L is near 0 by cancellation (one key with
/// s = q·k·scale ≈ 0) fails every float32 implementation, the naive oracle included: the float32
/// dot product's rounding, ~u Σ_i |q_i k_i| scale, is then many times rel_X |L|
/// (verify/portkit/test_check_lse.cpp builds such rows). What still fails: an LSE off by more than
/// rel_X · max(|L|, 1) in RMS — e.g. an LSE in log2 (off by 0.44 |L|) wherever |L| is not tiny,
/// or a window off by one (ln(1 ± p)). Where every |ref_i| ≥ 1 the scale is ‖ref‖_F exactly.
inline double lse_rel_scale(const std::vector<double>& ref) {
  double s2 = 0;
  for (double x : ref) s2 += std::max(x * x, 1.0);
  return std::sqrt(s2);
}

/// The most keys a row of result tensor `name` sees in a case with P cached tokens, T base tokens,
/// T_out output tokens and window w (SPEC §2): `lse` min(w, P+T), `lse_out` P+T (0 when T_out = 0);
/// 0 for every other tensor (no LSE floor). \throws orthros::Error on negative sizes or w < 1.
inline std::int64_t lse_max_keys(const std::string& name, std::int64_t P, std::int64_t T, std::int64_t T_out,
                                 std::int64_t window) {
  require(P >= 0 && T >= 0 && T_out >= 0 && T_out <= T, "lse_max_keys: need 0 <= T_out <= T and P >= 0 (got P=", P,
          ", T=", T, ", T_out=", T_out, ")");
  require(window >= 1, "window must be >= 1 (got ", window, ")");
  if (name == "lse") return std::min(window, P + T);
  if (name == "lse_out") return T_out > 0 ? P + T : 0;
  return 0;
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

/// Everything the checker reports about one output tensor (SPEC §6).
struct TensorReport {
  std::string name;                  ///< tensor name ("o", "o_out", "lse", "lse_out", ...)
  std::vector<std::int64_t> shape;   ///< reference shape, e.g. [T, H_q, D]
  std::vector<std::int64_t> actual_shape;  ///< the port's shape (differs from `shape` when shape_ok is false)
  std::string dtype;                 ///< dtype whose tolerance applies
  bool shape_ok = true;              ///< actual has the reference's shape (criterion 4)
  /// ‖out − ref‖_F / ‖ref‖_F (0/0 := 0, x/0 := inf; inf when out holds NaN/Inf); for an LSE tensor
  /// (`rel_lse_scale`) ‖out − ref‖_F / ‖max(|ref|, 1)‖_F (lse_rel_scale())
  double rel_fro = 0;
  bool rel_lse_scale = false;        ///< criterion 1 used the LSE scale max(|ref_i|, 1) (lse_max_keys > 0)
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
  /// F of lse_f32_floor() included in abs_tol (lse/lse_out of an f32/bf16/f16 port), else 0
  double lse_floor = 0;
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
/// \param lse_max_keys for an LSE tensor (`lse`, `lse_out`): the most keys one of its rows sees
///   (lse_max_keys()); when > 0 and `dtype` is f32, bf16 or f16 the bound of criterion 2 gains
///   F = lse_f32_floor(max |ref|, lse_max_keys) (TensorReport::lse_floor), and (any dtype)
///   criterion 1 divides by lse_rel_scale(ref) instead of ‖ref‖_F (TensorReport::rel_lse_scale).
///   0: not an LSE tensor (no floor, the plain relative error).
/// \returns the full report; a shape mismatch is reported (shape_ok = false, pass = false), not thrown.
/// \throws orthros::Error if `ref` is not finite, a buffer size disagrees with its shape, or the
///   dtype/oracle error are invalid, or lse_max_keys < 0.
inline TensorReport compare(const std::string& name, const std::vector<double>& actual,
                            const std::vector<std::int64_t>& actual_shape, const std::vector<double>& ref,
                            const std::vector<std::int64_t>& ref_shape, const std::string& dtype,
                            const AbsBaseline& baseline, std::int64_t lse_max_keys = 0) {
  TensorReport r;
  r.name = name;
  r.shape = ref_shape;
  r.actual_shape = actual_shape;
  r.dtype = dtype;
  r.rel_tol = rel_tolerance(dtype);
  require(lse_max_keys >= 0, "lse_max_keys must be >= 0 (got ", lse_max_keys, ")");
  if (baseline.maxabs) {
    r.abs_tol = abs_tolerance(*baseline.maxabs);
    r.oracle_at_dtype_maxabs = *baseline.maxabs;
    if (lse_max_keys > 0 && dtype != "f64") {  // a float32 LSE: its rounding floor (lse_f32_floor)
      double lse_max = 0;
      for (double x : ref)
        if (std::isfinite(x)) lse_max = std::max(lse_max, std::abs(x));  // a non-finite ref throws below
      r.lse_floor = lse_f32_floor(lse_max, lse_max_keys);
      r.abs_tol += r.lse_floor;
    }
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
  } else if (lse_max_keys > 0 && !ref.empty()) {  // an LSE: error relative to max(|L|, 1) (lse_rel_scale)
    r.rel_lse_scale = true;
    r.rel_fro = std::sqrt(diff2) / lse_rel_scale(ref);
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
                            double oracle_at_dtype_maxabs, std::int64_t lse_max_keys = 0) {
  rel_tolerance(dtype);  // an unknown dtype is reported before a bad E_X
  return compare(name, actual, actual_shape, ref, ref_shape, dtype, AbsBaseline::of(oracle_at_dtype_maxabs),
                 lse_max_keys);
}

/// One line for reports: "max|out-ref| <= 2*E_X + 1e-6 = <tol>" (with "+ F_lse" when the float32
/// LSE floor is included) or the n/a note.
inline std::string abs_criterion_text(const TensorReport& r) {
  if (!r.abs_applicable) return r.abs_note;
  std::ostringstream os;
  os.precision(3);
  os << "max|out-ref| <= 2*E_X + 1e-6" << (r.lse_floor > 0 ? " + F_lse" : "") << " = " << r.abs_tol;
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
                     const std::string& dtype, const AbsBaseline& baseline, std::int64_t lse_max_keys = 0) {
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
  return compare(name, to_f64(actual), as, to_f64(ref), shape_of(ref.rows(), ref.cols()), dtype, baseline,
                 lse_max_keys);
}

/// Mat overload with a measured E_X (see above).
template <typename A>
TensorReport compare(const std::string& name, const Mat<A>& actual, const Mat<double>& ref, int heads, int inner,
                     const std::string& dtype, double oracle_at_dtype_maxabs, std::int64_t lse_max_keys = 0) {
  return compare(name, actual, ref, heads, inner, dtype, AbsBaseline::of(oracle_at_dtype_maxabs), lse_max_keys);
}

}  // namespace orthros::check
