// Bad input to the attention operator: every case throws orthros::Error (never crashes, never
// returns garbage) and the message names the parameter and the offending values.
#include "orthros_testing.hpp"

#include <gtest/gtest.h>

#include <initializer_list>
#include <limits>
#include <string>

using namespace orthros;
using namespace orthros::testing;

namespace {

struct Inputs {
  Mat<double> q, k, v, q_out;
  AttentionDims dims{4, 2, 8};
  AttentionOptions opt;
};

// Seeded random (non-zero) matrix.
Mat<double> rmat(Index rows, Index cols, std::uint64_t seed) {
  Rng rng(seed);
  return random_mat<double>(rows, cols, rng);
}

// A valid case: T = 5, P = 2, T_out = 2, H_q = 4, H_kv = 2, D = 8, w = 3.
Inputs valid_inputs() {
  Rng rng(1234);
  Inputs in;
  in.q = random_mat<double>(5, 32, rng);
  in.k = random_mat<double>(7, 16, rng);
  in.v = random_mat<double>(7, 16, rng);
  in.q_out = random_mat<double>(2, 32, rng);
  in.opt.window = 3;
  return in;
}

// Expects orthros::Error whose message contains every string of `parts`.
void expect_error(const Inputs& in, std::initializer_list<std::string> parts) {
  try {
    (void)orthros_attention<double>(in.q, in.k, in.v, in.q_out, in.dims, in.opt);
    ADD_FAILURE() << "no exception thrown";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' missing in: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-orthros exception: " << e.what();
  }
}

}  // namespace

TEST(OperatorErrors, ValidInputIsAccepted) {
  const Inputs in = valid_inputs();
  const auto r = orthros_attention<double>(in.q, in.k, in.v, in.q_out, in.dims, in.opt);
  EXPECT_EQ(r.o.rows(), 5);
  EXPECT_EQ(r.o_out.rows(), 2);
  EXPECT_TRUE(all_finite(r.o) && all_finite(r.o_out));
}

TEST(OperatorErrors, WrongQueryColumns) {
  Inputs in = valid_inputs();
  in.q = rmat(5, 31, 1);
  expect_error(in, {"q must be", "32", "31"});
}

TEST(OperatorErrors, WrongOutputQueryColumns) {
  Inputs in = valid_inputs();
  in.q_out = rmat(2, 33, 2);
  expect_error(in, {"q_out", "32", "33"});
}

TEST(OperatorErrors, WrongKeyColumns) {
  Inputs in = valid_inputs();
  in.k = rmat(7, 32, 3);  // H_q*D instead of H_kv*D
  in.v = in.k;
  expect_error(in, {"k must be", "16", "32"});
}

TEST(OperatorErrors, KeyValueShapeMismatch) {
  Inputs in = valid_inputs();
  in.v = rmat(6, 16, 4);
  // Named in the caller's layout [P+T, H_kv, D] (H_kv = 2, D = 8), the matrix shapes beside it.
  expect_error(in, {"v must have the shape of k [P+T, H_kv, D] = [7, 2, 8] ([7, 16] as a matrix); got [6, 2, 8] ([6, 16])"});
  in = valid_inputs();
  in.v = rmat(7, 24, 5);
  expect_error(in, {"v", "[7, 2, 8]", "got [7, 3, 8] ([7, 24])"});
  in = valid_inputs();
  in.v = rmat(7, 12, 6);  // 12 columns: not a whole number of heads of D = 8
  expect_error(in, {"got [7 rows, 12 columns] ([7, 12])"});
}

TEST(OperatorErrors, OutputQueriesExceedT) {
  Inputs in = valid_inputs();
  in.q_out = rmat(6, 32, 6);
  expect_error(in, {"T_out", "6", "T = 5"});
}

TEST(OperatorErrors, CacheShorterThanT) {
  Inputs in = valid_inputs();
  in.k = rmat(4, 16, 7);
  in.v = rmat(4, 16, 8);
  expect_error(in, {"k/v", "4 rows", "T", "5"});
}

TEST(OperatorErrors, WindowBelowOne) {
  Inputs in = valid_inputs();
  in.opt.window = 0;
  expect_error(in, {"window", "0"});
  in.opt.window = -7;
  expect_error(in, {"window", "-7"});
}

TEST(OperatorErrors, HeadsNotDivisible) {
  Inputs in = valid_inputs();
  in.dims = AttentionDims{6, 4, 8};
  in.q = rmat(5, 48, 9);
  in.q_out = rmat(2, 48, 10);
  in.k = rmat(7, 32, 11);
  in.v = rmat(7, 32, 12);
  expect_error(in, {"H_q % H_kv", "H_q=6", "H_kv=4"});
}

TEST(OperatorErrors, NonPositiveDims) {
  for (auto d : {AttentionDims{0, 2, 8}, AttentionDims{4, 0, 8}, AttentionDims{4, 2, 0}, AttentionDims{4, -2, 8}}) {
    Inputs in = valid_inputs();
    in.dims = d;
    const char* which = d.num_q_heads < 1 ? "num_q_heads" : d.num_kv_heads < 1 ? "num_kv_heads" : "head_dim";
    const int val = d.num_q_heads < 1 ? d.num_q_heads : d.num_kv_heads < 1 ? d.num_kv_heads : d.head_dim;
    expect_error(in, {which, "(got " + std::to_string(val) + ")"});
  }
}

// NaN, +Inf and -Inf in each input tensor: the message names the tensor and the
// [row, head, dim] index of the bad value.
TEST(OperatorErrors, NonFiniteInput) {
  const double bad_values[] = {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                               -std::numeric_limits<double>::infinity()};
  for (double bad : bad_values) {
    for (int which = 0; which < 4; ++which) {
      Inputs in = valid_inputs();
      Mat<double>* m[] = {&in.q, &in.k, &in.v, &in.q_out};
      const char* names[] = {"q ", "k ", "v ", "q_out "};
      const int D = 8;
      (*m[which])(1, 1 * D + 3) = bad;  // row 1, head 1, dim 3
      SCOPED_TRACE(::testing::Message() << names[which] << bad);
      expect_error(in, {names[which], "non-finite", "[1, 1, 3]"});
    }
  }
}

TEST(OperatorErrors, NonFiniteScale) {
  for (double s : {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                   std::numeric_limits<double>::quiet_NaN()}) {
    Inputs in = valid_inputs();
    in.opt.scale = s;
    expect_error(in, {"scale", "finite"});
  }
}

// Finite inputs whose scaled scores overflow the working type must not come back as NaN/Inf.
// |q|, |k| ~ 1e20 with D = 8: |q.k| reaches ~1e40 > FLT_MAX (3.4e38) in float, but is finite in
// double, where the same case must still succeed (the largest score wins the softmax).
TEST(OperatorErrors, ScoreOverflowIsAnErrorNotNaN) {
  Inputs in = valid_inputs();
  in.q *= 1e20;
  in.k *= 1e20;
  in.q_out *= 1e20;
  const AttentionResult<double> r = orthros_attention<double>(in.q, in.k, in.v, in.q_out, in.dims, in.opt);
  EXPECT_TRUE(r.o.allFinite() && r.o_out.allFinite());
  try {
    (void)orthros_attention<float>(in.q.cast<float>(), in.k.cast<float>(), in.v.cast<float>(),
                                   in.q_out.cast<float>(), in.dims, in.opt);
    ADD_FAILURE() << "no exception for scores beyond FLT_MAX";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("overflow f32"), std::string::npos) << msg;
  }
  // f16 holds at most 65504: |s| = 300^2 * 8 / sqrt(8) ~ 2.5e5 overflows it.
  Mat<Eigen::half> big = Mat<double>::Constant(5, 32, 300.0).cast<Eigen::half>();
  Mat<Eigen::half> kbig = Mat<double>::Constant(7, 16, 300.0).cast<Eigen::half>();
  Mat<Eigen::half> v = in.v.cast<Eigen::half>(), qo = Mat<double>::Constant(2, 32, 300.0).cast<Eigen::half>();
  EXPECT_THROW((void)orthros_attention<Eigen::half>(big, kbig, v, qo, in.dims, in.opt), Error);
}

// Errors are reported the same way at kernel precision (bf16 input).
TEST(OperatorErrors, LowPrecisionInputAlsoChecked) {
  Inputs in = valid_inputs();
  Mat<Eigen::bfloat16> q = in.q.cast<Eigen::bfloat16>(), k = in.k.cast<Eigen::bfloat16>(),
                       v = in.v.cast<Eigen::bfloat16>(), qo = in.q_out.cast<Eigen::bfloat16>();
  k(2, 5) = Eigen::bfloat16(std::numeric_limits<float>::infinity());
  try {
    (void)orthros_attention<Eigen::bfloat16>(q, k, v, qo, in.dims, in.opt);
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("k contains a non-finite value"), std::string::npos) << e.what();
  }
}
