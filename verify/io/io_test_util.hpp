/// \file io_test_util.hpp
/// \brief Helpers of the verify/io tests: raw safetensors byte building (to craft malformed
/// files), seeded never-zero random matrices and an "expect this orthros::Error" matcher.
#pragma once

#include "orthros/safetensors.hpp"
#include "orthros/tensor.hpp"
#include "orthros/seeded_inputs.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace orthros::iotest {

/// A safetensors file from a literal JSON header and a data section (no padding added).
inline std::vector<std::uint8_t> raw_file(const std::string& header, const std::vector<std::uint8_t>& data) {
  const std::uint64_t n = header.size();
  std::vector<std::uint8_t> b(8 + header.size() + data.size());
  for (int i = 0; i < 8; ++i) b[i] = static_cast<std::uint8_t>(n >> (8 * i));
  std::copy(header.begin(), header.end(), b.begin() + 8);
  std::copy(data.begin(), data.end(), b.begin() + 8 + static_cast<std::ptrdiff_t>(header.size()));
  return b;
}

/// `n` data bytes with non-zero, non-NaN content (0x3F: positive finite in every dtype).
inline std::vector<std::uint8_t> filler(std::size_t n) { return std::vector<std::uint8_t>(n, 0x3F); }

/// Seeded random matrix of verify::nonzero_uniform values: |x| in [0.05 mag, mag), random sign
/// (never zero).
inline Mat<double> random_mat(std::mt19937_64& rng, Eigen::Index rows, Eigen::Index cols, double mag = 1.0) {
  return verify::nonzero_mat(rows, cols, rng, mag);
}

/// Runs `f` and returns the orthros::Error message; fails the test if nothing (or another
/// exception type) was thrown, if the message lacks `needle`, or if it spans several lines.
template <typename F>
std::string expect_error(F&& f, const std::string& needle) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg << "\nexpected to contain: " << needle;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "message is not one line: " << msg;
    return msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-orthros exception: " << e.what() << " (expected: " << needle << ")";
    return {};
  }
  ADD_FAILURE() << "nothing thrown (expected an error containing: " << needle << ")";
  return {};
}

/// Bits of a double (for bitwise comparisons that distinguish -0 and NaN payloads).
inline std::uint64_t bits(double x) {
  std::uint64_t b;
  std::memcpy(&b, &x, 8);
  return b;
}

}  // namespace orthros::iotest
