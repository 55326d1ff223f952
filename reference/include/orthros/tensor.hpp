/// \file tensor.hpp
/// \brief Tensor storage and scalar traits shared by the whole oracle (its error type: error.hpp).
///
/// Every activation tensor is a row-major Eigen matrix whose rows are tokens: a
/// `[T, H, D]` tensor is stored as `Mat<S>` with `T` rows and `H*D` columns, so head
/// `h` of token `t` is the contiguous slice `m.row(t).segment(h*D, D)`. This is the
/// same memory layout as a C-contiguous `[T, H, D]` array in PyTorch or NumPy.
#pragma once

#include "orthros/error.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

namespace orthros {

/// Row-major dynamic matrix; rows are tokens (or positions), columns are features.
template <typename S>
using Mat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
/// Dynamic column vector.
template <typename S>
using Vec = Eigen::Matrix<S, Eigen::Dynamic, 1>;

/// Accumulator type used for reductions (dot products, softmax sums) at scalar type S.
/// float64 and float32 accumulate in themselves; bfloat16 and float16 accumulate in
/// float32, as tensor-core kernels and PyTorch's own bf16/fp16 matmuls do.
template <typename S>
struct Accum {
  using type = S;  ///< accumulator of S
};
/// bfloat16 accumulates in float32.
template <>
struct Accum<Eigen::bfloat16> {
  using type = float;  ///< float32
};
/// float16 accumulates in float32.
template <>
struct Accum<Eigen::half> {
  using type = float;  ///< float32
};
/// Shorthand for `Accum<S>::type`.
template <typename S>
using AccumT = typename Accum<S>::type;

/// Human-readable name of a scalar type ("f64", "f32", "bf16", "f16").
template <typename S>
constexpr const char* dtype_name() {
  if constexpr (std::is_same_v<S, double>) return "f64";
  else if constexpr (std::is_same_v<S, float>) return "f32";
  else if constexpr (std::is_same_v<S, Eigen::bfloat16>) return "bf16";
  else if constexpr (std::is_same_v<S, Eigen::half>) return "f16";
  else return "?";
}

namespace detail {
/// Correctly rounded double -> binary floating-point format with `mant` explicit mantissa bits,
/// minimum normal exponent `emin` and maximum exponent `emax`, to nearest with ties to even
/// (under the default rounding mode). Returns the rounded value as a double (exact). Overflow
/// gives ±inf, NaN/±inf/±0 pass through; subnormals of the target are rounded at its quantum.
inline double round_binary(double x, int mant, int emin, int emax) {
  if (std::isnan(x) || std::isinf(x) || x == 0.0) return x;
  const double a = std::fabs(x);
  int E = 0;
  std::frexp(a, &E);                          // a = f * 2^E, f in [0.5, 1): floor(log2 a) = E - 1
  const int e = std::max(E - 1, emin);        // exponent of the quantum (subnormals share emin)
  const double q = std::ldexp(a, mant - e);   // a in units of the quantum 2^(e-mant), exact
  const double r = std::nearbyint(q);         // default rounding mode: to nearest, ties to even
  double y = std::ldexp(r, e - mant);
  if (y >= std::ldexp(1.0, emax + 1)) y = std::numeric_limits<double>::infinity();
  return std::copysign(y, x);
}
}  // namespace detail

/// The project's single rule for narrowing a double to scalar type S (docs/conventions.md,
/// "Conversions"): one rounding, to nearest with ties to even, directly from the double — no
/// intermediate float rounding for bf16/f16 (Eigen's `static_cast<Eigen::bfloat16>(double)` and
/// `.cast<Eigen::bfloat16>()` round twice, through float32). Matches NumPy's float16 and
/// ml_dtypes' bfloat16 conversions from float64. Overflow gives ±inf; NaN stays NaN.
/// S is one of double, float, Eigen::bfloat16, Eigen::half.
template <typename S>
inline S round_rne(double x) {
  if constexpr (std::is_same_v<S, double>) {
    return x;
  } else if constexpr (std::is_same_v<S, float>) {
    return static_cast<float>(x);  // IEEE conversion: a single round to nearest even
  } else if constexpr (std::is_same_v<S, Eigen::bfloat16>) {
    // 7 mantissa bits, float's exponent range; the rounded value is exact in float, so the
    // float -> bfloat16 conversion does not round again.
    return Eigen::bfloat16(static_cast<float>(detail::round_binary(x, 7, -126, 127)));
  } else if constexpr (std::is_same_v<S, Eigen::half>) {
    return Eigen::half(static_cast<float>(detail::round_binary(x, 10, -14, 15)));  // binary16
  } else {
    static_assert(!sizeof(S), "round_rne: S must be double, float, Eigen::bfloat16 or Eigen::half");
  }
}

/// Rounds every element of a float64 matrix to S with round_rne() (the single direct rounding;
/// use it instead of `m.cast<S>()` whenever S is narrower than double). Shape is kept.
template <typename S>
Mat<S> round_matrix(const Mat<double>& m) {
  Mat<S> out(m.rows(), m.cols());
  for (Eigen::Index i = 0; i < m.size(); ++i) out.data()[i] = round_rne<S>(m.data()[i]);
  return out;
}

}  // namespace orthros
