/// \file tensor.hpp
/// \brief Tensor storage, scalar traits and the error type shared by the whole oracle.
///
/// Every activation tensor is a row-major Eigen matrix whose rows are tokens: a
/// `[T, H, D]` tensor is stored as `Mat<S>` with `T` rows and `H*D` columns, so head
/// `h` of token `t` is the contiguous slice `m.row(t).segment(h*D, D)`. This is the
/// same memory layout as a C-contiguous `[T, H, D]` array in PyTorch or NumPy.
#pragma once

#include <Eigen/Core>

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace orthros {

/// Row-major dynamic matrix; rows are tokens (or positions), columns are features.
template <typename S>
using Mat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
/// Dynamic column vector.
template <typename S>
using Vec = Eigen::Matrix<S, Eigen::Dynamic, 1>;

/// Thrown for every invalid argument or malformed input. The message names the
/// parameter and the offending values, e.g. `window must be >= 1 (got 0)`.
class Error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

namespace detail {
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

/// Throws orthros::Error with the concatenation of `args` when `cond` is false.
template <typename... Args>
inline void require(bool cond, const Args&... args) {
  if (!cond) throw Error(detail::cat(args...));
}

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

/// Converts a matrix to another scalar type element by element (round to nearest even).
template <typename To, typename From>
Mat<To> cast(const Mat<From>& m) {
  return m.template cast<To>();
}

}  // namespace orthros
