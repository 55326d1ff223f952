/// \file finite_difference.hpp
/// \brief The finite-difference derivative that every float64 gradient check of the project uses
/// (the oracle's and the model's backward tests, `orthros verify --grad`): central differences
/// with one Richardson extrapolation step. Header-only, no test framework.
///
/// Derivation. For f(s) = L(x + s u) (u a coordinate vector or a unit direction, f five times
/// continuously differentiable on [-2h, 2h]), Taylor's theorem with the Lagrange remainder gives
///   D(s) = (f(s) - f(-s)) / 2s = f'(0) + s^2/6 f'''(0) + s^4/120 f^(5)(xi_s),  |xi_s| < s,
/// and the extrapolation cancels the s^2 term:
///   R(h) = (4 D(h) - D(2h)) / 3 = f'(0) + (4 h^4 f^(5)(xi_h) - 16 h^4 f^(5)(xi_2h)) / 360.
///   truncation  |R(h) - f'(0)| <= (4 + 16)/360 h^4 M5 = h^4/18 M5   (M5 = max |f^(5)| on [-2h, 2h];
///               the leading term is -h^4/30 f^(5)(0)); h = 1e-5: <= 5.6e-22 M5.
///   rounding    each evaluation of f carries an absolute error eps (about n u |L| for a loss summed
///               over n terms, u = 2^-53); D(h) then errs by <= 2 eps / 2h = eps/h, D(2h) by
///               <= eps/2h, so R by <= (4 eps/h + eps/2h) / 3 = 1.5 eps/h.
///               n = 1e3, |L| = 1, h = 1e-5: 1.5 * 1e3 * 1.1e-16 / 1e-5 = 1.7e-8.
/// The plain D(h) errs by h^2/6 |f'''| instead, which is not negligible where |f'''| is large: a
/// q/k RMSNorm over D = 2 near a vector of small RMS r has |f'''| ~ 1/r^3. Example: the model of
/// TrainingGradients' seed 2842518900507580988 (H_q = 2, D = 2, qk_norm, T = 2), where D(h) is
/// 6.9e-6 and D(2h) 2.8e-5 off a correct analytic 5.68 (the h^2 law), beyond a 1e-6 bound.
/// Each caller states its tolerance from these two terms beside its constant.
#pragma once

#include <type_traits>

namespace orthros::verify {

/// Step h of R(h): large enough that the rounding term 1.5 eps/h stays ~1e-8 |L| in float64, small
/// enough that the truncation term h^4/18 M5 (5.6e-22 M5) is negligible for M5 < 1e12.
constexpr double kRichardsonStep = 1e-5;

/// R(h) = (4 D(h) - D(2h)) / 3 with D(s) = (f(s) - f(-s)) / 2s: the derivative f'(0) with the
/// error derived in the file comment (truncation <= h^4/18 max|f^(5)|, rounding <= 1.5 eps/h).
/// \param f  f(s), the loss with the input moved by s along one direction (4 evaluations, at
///           s = -2h, -h, h, 2h); its result may be double or long double, and the differences are
///           taken in the wider of it and double.
/// \param h  step, > 0 (default kRichardsonStep).
/// \returns  R(h) rounded to double.
template <typename F>
double richardson_derivative(F&& f, double h = kRichardsonStep) {
  using R = std::common_type_t<decltype(f(h)), double>;
  const R d1 = (R(f(h)) - R(f(-h))) / (2 * R(h));
  const R d2 = (R(f(2 * h)) - R(f(-2 * h))) / (4 * R(h));
  return static_cast<double>((4 * d1 - d2) / 3);
}

/// richardson_derivative of `loss()` in the one input entry `x`: x is set to x0 + s for each
/// evaluation and restored to x0 (bit for bit) before returning.
/// \param x     the entry (a coordinate of an input tensor or of a parameter), read and restored.
/// \param loss  callable with no arguments returning the loss at the current value of x.
/// \param h     step (default kRichardsonStep).
template <typename Loss>
double richardson_partial(double& x, Loss&& loss, double h = kRichardsonStep) {
  const double x0 = x;
  const double r = richardson_derivative(
      [&](double s) {
        x = x0 + s;
        return loss();
      },
      h);
  x = x0;
  return r;
}

}  // namespace orthros::verify
