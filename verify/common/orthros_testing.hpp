/// \file orthros_testing.hpp
/// \brief Shared helpers of the verify/ suites: seeded random tensors (never zero),
/// bitwise and tolerance comparisons, and an independent long-double transcription of
/// the Orthros attention operator (SPEC §2) used as a second oracle.
///
/// Randomness: every generator takes an explicit `std::mt19937_64` and draws its values with
/// seeded_inputs.hpp's nonzero_uniform (the golden suite's and the command's draw). Inside rapidcheck
/// properties draw the seed with `*rc::gen::arbitrary<std::uint64_t>()` so the seed is
/// part of the printed counterexample; in plain GoogleTest tests put the seed in a
/// SCOPED_TRACE.
#pragma once

#include "orthros/attention.hpp"
#include "orthros/tensor.hpp"
#include "orthros/seeded_inputs.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>

namespace orthros::testing {

using Rng = std::mt19937_64;
using Index = Eigen::Index;

/// Long double matrix used by the independent transcription.
using MatL = Eigen::Matrix<long double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Unit roundoff (half an ulp of 1) of scalar type S: 2^-53 f64, 2^-24 f32, 2^-8 bf16, 2^-11 f16.
/// Computed from numeric_limits<S>::digits because Eigen 3.4.0's
/// numeric_limits<Eigen::half>::epsilon() is wrong (returns 2^-13 instead of 2^-10).
template <typename S>
long double unit_roundoff() {
  return std::ldexp(1.0L, -std::numeric_limits<S>::digits);
}

/// Exact widening of any supported scalar (f64, f32, bf16, f16, long double) to long double.
template <typename S>
long double to_ld(const S& x) {
  if constexpr (std::is_arithmetic_v<S>)
    return static_cast<long double>(x);
  else
    return static_cast<long double>(static_cast<float>(x));
}

/// nonzero_uniform(rng, amp, lo_frac): the project's one draw, |x| in [amp lo_frac, amp) with a
/// random sign, portable (seeded_inputs.hpp).
using verify::nonzero_uniform;

/// `rows x cols` matrix of `nonzero_uniform` values (verify::nonzero_mat, drawn row by row in
/// double) rounded once to S (round to nearest even, orthros::round_matrix). Rows are tokens;
/// `[T, H, D]` is `random_mat<S>(T, H*D, ...)`.
template <typename S>
Mat<S> random_mat(Index rows, Index cols, Rng& rng, double amp = 1.0) {
  return round_matrix<S>(verify::nonzero_mat(rows, cols, rng, amp));  // the project's single double -> S rounding
}

/// Widens any scalar matrix to double exactly (bf16/f16/f32 are subsets of f64).
template <typename S>
Mat<double> to_double(const Mat<S>& m) {
  Mat<double> r(m.rows(), m.cols());
  for (Index i = 0; i < m.rows(); ++i)
    for (Index j = 0; j < m.cols(); ++j) r(i, j) = static_cast<double>(m(i, j));
  return r;
}

/// nullopt when `a` and `b` have the same shape and identical bytes; otherwise a message
/// naming `what`, the first differing element and both values (printed with 17 digits).
template <typename S>
std::optional<std::string> bitwise_diff(const Mat<S>& a, const Mat<S>& b, const std::string& what) {
  std::ostringstream os;
  os.precision(17);
  if (a.rows() != b.rows() || a.cols() != b.cols()) {
    os << what << ": shape [" << a.rows() << ", " << a.cols() << "] vs [" << b.rows() << ", " << b.cols() << "]";
    return os.str();
  }
  for (Index r = 0; r < a.rows(); ++r)
    for (Index c = 0; c < a.cols(); ++c)
      if (std::memcmp(&a(r, c), &b(r, c), sizeof(S)) != 0) {
        os << what << ": first bitwise difference at [" << r << ", " << c << "]: " << static_cast<double>(a(r, c))
           << " vs " << static_cast<double>(b(r, c));
        return os.str();
      }
  return std::nullopt;
}

/// Same as bitwise_diff for one row of each matrix (row ra of a vs row rb of b).
template <typename S>
std::optional<std::string> bitwise_row_diff(const Mat<S>& a, Index ra, const Mat<S>& b, Index rb,
                                            const std::string& what) {
  Mat<S> x = a.row(ra), y = b.row(rb);
  return bitwise_diff(x, y, what);
}

/// True when every entry is finite (no NaN, no Inf).
template <typename S>
bool all_finite(const Mat<S>& m) {
  for (Index r = 0; r < m.rows(); ++r)
    for (Index c = 0; c < m.cols(); ++c)
      if (!std::isfinite(static_cast<double>(m(r, c)))) return false;
  return true;
}

/// ‖a − ref‖_F / ‖ref‖_F computed in long double (SPEC §6 relative error).
template <typename A, typename B>
long double rel_frobenius(const Mat<A>& a, const Mat<B>& ref) {
  long double num = 0, den = 0;
  for (Index r = 0; r < ref.rows(); ++r)
    for (Index c = 0; c < ref.cols(); ++c) {
      const long double x = static_cast<long double>(static_cast<double>(a(r, c)));
      const long double y = static_cast<long double>(static_cast<double>(ref(r, c)));
      num += (x - y) * (x - y);
      den += y * y;
    }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

/// max |a − ref| in long double.
template <typename A, typename B>
long double max_abs_diff(const Mat<A>& a, const Mat<B>& ref) {
  long double m = 0;
  for (Index r = 0; r < ref.rows(); ++r)
    for (Index c = 0; c < ref.cols(); ++c)
      m = std::max(m, std::fabs(static_cast<long double>(static_cast<double>(a(r, c))) -
                                static_cast<long double>(static_cast<double>(ref(r, c)))));
  return m;
}

/// Result of the transcription: same fields as AttentionResult, in long double.
struct TranscriptionResult {
  MatL o, o_out;      // [T, Hq*D], [T_out, Hq*D]
  MatL lse, lse_out;  // [T, Hq], [T_out, Hq]
};

/// Independent transcription of SPEC §2, written as a dense masked softmax and kept
/// deliberately different from attend_row: for each query head it stacks base and output
/// queries into one matrix Q_all [T+T_out, D], forms the full score matrix
/// S = s · Q_all K^T over all P+T keys, adds a mask that is 0 on
/// [max(1, t-w+1), t] (base rows) or [1, t] (output rows) and -inf elsewhere, and applies a
/// row softmax with max subtraction via Eigen array ops, all in long double. The inputs are
/// widened exactly.
template <typename S>
TranscriptionResult transcribe_attention(const Mat<S>& q, const Mat<S>& k, const Mat<S>& v, const Mat<S>& q_out,
                                         const AttentionDims& dims, std::int64_t window, long double scale) {
  const int Hq = dims.num_q_heads, Hkv = dims.num_kv_heads, D = dims.head_dim;
  const Index T = q.rows(), T_out = q_out.rows(), N = k.rows(), P = N - T;
  const Index R = T + T_out;
  const long double NEG_INF = -std::numeric_limits<long double>::infinity();
  // Additive mask, rows = [base queries; output queries], columns = absolute key positions 1..N.
  MatL mask = MatL::Constant(R, N, NEG_INF);
  for (Index r = 0; r < R; ++r) {
    const bool base = r < T;
    const Index t = base ? P + r + 1 : P + (T - T_out) + (r - T) + 1;  // 1-based absolute position
    const Index first = base ? std::max<Index>(1, t - window + 1) : 1;
    for (Index j = first; j <= t; ++j) mask(r, j - 1) = 0;
  }
  TranscriptionResult res;
  res.o.setZero(T, Index(Hq) * D);
  res.o_out.setZero(T_out, Index(Hq) * D);
  res.lse.setZero(T, Hq);
  res.lse_out.setZero(T_out, Hq);
  const int group = Hq / Hkv;
  for (int h = 0; h < Hq; ++h) {
    const int g = h / group;
    MatL Qa(R, D), K(N, D), V(N, D);
    for (Index r = 0; r < T; ++r)
      for (int d = 0; d < D; ++d) Qa(r, d) = to_ld(q(r, Index(h) * D + d));
    for (Index r = 0; r < T_out; ++r)
      for (int d = 0; d < D; ++d) Qa(T + r, d) = to_ld(q_out(r, Index(h) * D + d));
    for (Index j = 0; j < N; ++j)
      for (int d = 0; d < D; ++d) {
        K(j, d) = to_ld(k(j, Index(g) * D + d));
        V(j, d) = to_ld(v(j, Index(g) * D + d));
      }
    MatL Sc = (Qa * K.transpose()) * scale;
    Sc += mask;
    Eigen::Matrix<long double, Eigen::Dynamic, 1> rmax = Sc.rowwise().maxCoeff();
    MatL E = (Sc.colwise() - rmax).array().exp().matrix();  // exp(-inf) = 0 outside the mask
    Eigen::Matrix<long double, Eigen::Dynamic, 1> Z = E.rowwise().sum();
    MatL Pm = E.array().colwise() / Z.array();
    MatL O = Pm * V;
    for (Index r = 0; r < R; ++r) {
      const long double lse = rmax(r) + std::log(Z(r));
      for (int d = 0; d < D; ++d) {
        if (r < T)
          res.o(r, Index(h) * D + d) = O(r, d);
        else
          res.o_out(r - T, Index(h) * D + d) = O(r, d);
      }
      if (r < T)
        res.lse(r, h) = lse;
      else
        res.lse_out(r - T, h) = lse;
    }
  }
  return res;
}

/// The message of the orthros::Error that `f()` throws, or "no error" when it throws none (for
/// tests of error messages: compare with `.find(expected)`).
template <typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

/// Default softmax scale 1/sqrt(D) in long double.
inline long double default_scale(int head_dim) { return 1.0L / std::sqrt(static_cast<long double>(head_dim)); }

/// Casts a long double matrix to double (for reporting / comparison helpers).
inline Mat<double> to_double(const MatL& m) { return m.cast<double>(); }

}  // namespace orthros::testing
