// RoPE hand-derived values and bad input (unit tests).
#include "orthros_testing.hpp"

#include "orthros/rope.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

using namespace orthros;

// D = 2: the only pair has frequency theta^0 = 1, so position p rotates (1, 0) by p radians:
// (cos p, sin p). D = 4, theta = 100: pair 1 has frequency 100^(-2/4) = 0.1, so position 3
// rotates (x_1, x_3) by 0.3 rad. Rotate-half: pairs are (x_i, x_{i+D/2}), not (x_{2i}, x_{2i+1}).
TEST(RopeUnit, HandDerivedRotations) {
  double a[2] = {1.0, 0.0};
  apply_rope(a, 2, 2, 1e4);
  EXPECT_NEAR(a[0], std::cos(2.0), 1e-15);
  EXPECT_NEAR(a[1], std::sin(2.0), 1e-15);
  double b[4] = {0.5, 2.0, -0.25, 1.0};  // pairs (b0, b2) freq 1, (b1, b3) freq 0.1
  apply_rope(b, 4, 3, 100.0);
  EXPECT_NEAR(b[0], 0.5 * std::cos(3.0) + 0.25 * std::sin(3.0), 1e-15);
  EXPECT_NEAR(b[2], -0.25 * std::cos(3.0) + 0.5 * std::sin(3.0), 1e-15);
  EXPECT_NEAR(b[1], 2.0 * std::cos(0.3) - 1.0 * std::sin(0.3), 1e-14);
  EXPECT_NEAR(b[3], 1.0 * std::cos(0.3) + 2.0 * std::sin(0.3), 1e-14);
}

TEST(RopeUnit, BadInputRejectedWithMessage) {
  double x[4] = {1, 2, 3, 4};
  auto expect_msg = [&](int D, std::int64_t pos, double theta, const std::string& a, const std::string& b) {
    try {
      apply_rope(x, D, pos, theta);
      ADD_FAILURE() << "accepted D=" << D << " pos=" << pos << " theta=" << theta;
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(a), std::string::npos) << m;
      EXPECT_NE(m.find(b), std::string::npos) << m;
    }
  };
  expect_msg(3, 1, 1e4, "head_dim", "3");
  expect_msg(4, -1, 1e4, "position", "-1");
  expect_msg(4, 1, 0.0, "theta", "0");
  expect_msg(4, 1, -5.0, "theta", "-5");
}
