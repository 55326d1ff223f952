/// \file error.hpp
/// \brief orthros::Error, the exception of every invalid argument or malformed input, and
/// require(), which throws it. Plain C++17 without Eigen: the CUDA library's headers include it.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace orthros {

/// Thrown for every invalid argument or malformed input. The message names the
/// parameter and the offending values, e.g. `window must be >= 1 (got 0)`.
class Error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

namespace detail {
/// The concatenation of `args` as written by `operator<<`.
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

}  // namespace orthros
