/// \file seeded_inputs.hpp
/// \brief The project's one generator of seeded random inputs, never zero: the golden suite
/// (`orthros golden`), the command's checks (`orthros verify --grad`, `--device cuda`) and the
/// tests (verify/common/orthros_testing.hpp) all draw their values with nonzero_uniform.
/// Header-only, no test framework.
///
/// Portability: a value is a fixed function of the engine's 64-bit outputs (no
/// std::*_distribution, whose algorithms the standard leaves to the library), and both engines
/// used here are specified bit for bit: std::mt19937_64 by the C++ standard, SplitMix64 below. So
/// a seed gives the same inputs with every compiler and standard library.
#pragma once

#include "orthros/tensor.hpp"

#include <cstdint>
#include <limits>

namespace orthros::verify {

/// splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", OOPSLA
/// 2014; constants of Vigna's reference implementation): one 64-bit state, seeding is free, so
/// the golden suite gives each case its own stream. A UniformRandomBitGenerator (min 0, max 2^64-1).
struct SplitMix64 {
  using result_type = std::uint64_t;
  std::uint64_t s;  ///< state; the seed is its initial value
  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return std::numeric_limits<result_type>::max(); }
  result_type operator()() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
};

/// Uniform in [0, 1) on the grid k 2^-53 from the top 53 bits of one draw of `g`, a generator of
/// full 64-bit words (std::mt19937_64, SplitMix64).
template <typename Engine>
double unit_uniform(Engine& g) {
  static_assert(Engine::min() == 0 && Engine::max() == std::numeric_limits<std::uint64_t>::max(),
                "unit_uniform needs an engine of full 64-bit outputs (std::mt19937_64, SplitMix64)");
  return static_cast<double>(g() >> 11) * 0x1.0p-53;
}

/// amp (lo_frac + (1 - lo_frac) U) with U = unit_uniform(g), then a random sign from the lowest bit
/// of the next draw: |x| in [amp lo_frac, amp), never zero and never tiny, so no input silently
/// degenerates to zeros (in any dtype: 0.05 is a normal number even in bf16/f16). Two draws.
/// \param amp      magnitude bound, > 0.
/// \param lo_frac  smallest magnitude as a fraction of amp, in (0, 1).
template <typename Engine>
double nonzero_uniform(Engine& g, double amp = 1.0, double lo_frac = 0.05) {
  const double m = amp * (lo_frac + (1.0 - lo_frac) * unit_uniform(g));
  return (g() & 1) ? -m : m;
}

/// `rows x cols` row-major float64 matrix of nonzero_uniform(g, amp) values drawn in storage order
/// (row by row). A tensor [T, H, D] is nonzero_mat(T, H*D, ...).
template <typename Engine>
Mat<double> nonzero_mat(Eigen::Index rows, Eigen::Index cols, Engine& g, double amp = 1.0) {
  Mat<double> m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = nonzero_uniform(g, amp);
  return m;
}

}  // namespace orthros::verify
