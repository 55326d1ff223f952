// Tests of attention case/result files (verify/kit/include/orthros/case_io.hpp, SPEC §5):
// dims derived from shapes, strict metadata parsing, every consistency error, and that a
// case read from a file runs the oracle bitwise like the in-memory inputs.
#include "io_test_util.hpp"

#include "orthros/attention.hpp"
#include "orthros/case_io.hpp"

#include <gtest/gtest.h>

#include <random>

namespace orthros::iotest {
namespace {

using st::DType;

struct Inputs {
  Mat<double> q, k, v, q_out;
  AttentionDims dims;
  AttentionOptions opt;
};

Inputs make_inputs(std::uint64_t seed, int T, int P, int T_out, int Hq, int Hkv, int D, std::int64_t w) {
  std::mt19937_64 rng(seed);
  Inputs in;
  in.dims = {Hq, Hkv, D};
  in.opt.window = w;
  in.q = random_mat(rng, T, Hq * D);
  in.k = random_mat(rng, P + T, Hkv * D);
  in.v = random_mat(rng, P + T, Hkv * D);
  in.q_out = random_mat(rng, T_out, Hq * D);
  return in;
}

st::File case_file(const Inputs& in, DType dt = DType::F64) {
  return make_attention_case<double>(in.q, in.k, in.v, in.q_out, in.dims, in.opt, dt);
}

TEST(CaseIo, LoadDerivesDimsAndRunsBitwiseLikeInMemory) {
  const std::uint64_t seed = 11;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Inputs in = make_inputs(seed, 7, 5, 3, 6, 2, 8, 4);
  in.opt.scale = 0.1;  // not exactly representable: must survive the text round trip
  const st::File f = st::parse(st::serialize(case_file(in)));
  const AttentionCase<double> c = load_attention_case<double>(f);
  EXPECT_EQ(c.dims.num_q_heads, 6);
  EXPECT_EQ(c.dims.num_kv_heads, 2);
  EXPECT_EQ(c.dims.head_dim, 8);
  EXPECT_EQ(c.T, 7);
  EXPECT_EQ(c.P, 5);
  EXPECT_EQ(c.T_out, 3);
  EXPECT_EQ(c.options.window, 4);
  ASSERT_TRUE(c.options.scale.has_value());
  EXPECT_EQ(*c.options.scale, 0.1);
  const AttentionResult<double> a = orthros_attention<double>(c.q, c.k, c.v, c.q_out, c.dims, c.options);
  const AttentionResult<double> b = orthros_attention<double>(in.q, in.k, in.v, in.q_out, in.dims, in.opt);
  EXPECT_TRUE(a.o == b.o && a.o_out == b.o_out && a.lse == b.lse && a.lse_out == b.lse_out);
  // ... and the result file carries them exactly (F64) or rounded to nearest (F32).
  const AttentionResult<double> r = load_attention_result(st::parse(st::serialize(make_attention_result(a, c.dims))));
  EXPECT_TRUE(r.o == a.o && r.o_out == a.o_out && r.lse == a.lse && r.lse_out == a.lse_out);
  const st::File f32 = make_attention_result(a, c.dims, DType::F32);
  EXPECT_EQ(f32.tensors.at("o").dtype, DType::F32);
  EXPECT_EQ(f32.tensors.at("lse").shape, (std::vector<std::int64_t>{7, 6}));
  EXPECT_EQ(f32.tensors.at("o_out").shape, (std::vector<std::int64_t>{3, 6, 8}));
  const AttentionResult<double> r32 = load_attention_result(f32);
  EXPECT_EQ(r32.o(2, 9), static_cast<double>(static_cast<float>(a.o(2, 9))));
}

TEST(CaseIo, NoOutputQueriesIsAnEmptyQOut) {
  const Inputs in = make_inputs(12, 4, 3, 0, 2, 1, 4, 2);
  const AttentionCase<double> c = load_attention_case<double>(case_file(in));
  EXPECT_EQ(c.T_out, 0);
  EXPECT_EQ(c.q_out.rows(), 0);
  EXPECT_EQ(c.q_out.cols(), 8);
  EXPECT_EQ(case_file(in).tensors.at("q_out").shape, (std::vector<std::int64_t>{0, 2, 4}));
}

TEST(CaseIo, MixedInputDtypesAreWidenedExactly) {
  const Inputs in = make_inputs(13, 3, 1, 1, 2, 2, 4, 2);
  st::File f = case_file(in);
  f.tensors["q"] = st::from_matrix<double>(in.q, {3, 2, 4}, DType::BF16);
  f.tensors["k"] = st::from_matrix<double>(in.k, {4, 2, 4}, DType::F16);
  f.tensors["v"] = st::from_matrix<double>(in.v, {4, 2, 4}, DType::F32);
  const AttentionCase<double> c = load_attention_case<double>(f);
  EXPECT_EQ(c.q(1, 3), static_cast<double>(static_cast<float>(st::round_to<Eigen::bfloat16>(in.q(1, 3)))));
  EXPECT_EQ(c.k(2, 5), static_cast<double>(static_cast<float>(st::round_to<Eigen::half>(in.k(2, 5)))));
  EXPECT_EQ(c.v(3, 7), static_cast<double>(static_cast<float>(in.v(3, 7))));
  EXPECT_EQ(c.q_out(0, 1), in.q_out(0, 1));
}

TEST(CaseIo, ExtraTensorsAndMetadataAreIgnored) {
  const Inputs in = make_inputs(14, 3, 0, 1, 2, 1, 4, 8);
  st::File f = case_file(in);
  f.tensors["expected_o"] = st::from_matrix<double>(in.q, {3, 2, 4}, DType::F64);
  f.metadata["seed"] = "14";
  EXPECT_NO_THROW(load_attention_case<double>(f));
}

TEST(CaseIoErrors, MissingOrWrongRankTensors) {
  const Inputs in = make_inputs(15, 4, 2, 2, 4, 2, 8, 3);
  for (const char* name : {"q", "k", "v", "q_out"}) {
    SCOPED_TRACE(name);
    st::File f = case_file(in);
    f.tensors.erase(name);
    expect_error([&] { load_attention_case<double>(f); }, std::string("missing tensor \"") + name + "\"");
  }
  st::File f = case_file(in);
  f.tensors.erase("q_out");
  expect_error([&] { load_attention_case<double>(f); }, "use shape [0, H_q, D] for T_out = 0");
  f = case_file(in);
  f.tensors["q"] = st::from_matrix<double>(in.q, {4, 32}, DType::F64);
  expect_error([&] { load_attention_case<double>(f); }, "tensor \"q\" must be rank 3 [T, H_q, D]; got shape [4, 32]");
}

TEST(CaseIoErrors, InconsistentShapes) {
  std::mt19937_64 rng(16);
  const Inputs in = make_inputs(16, 4, 2, 2, 4, 2, 8, 3);
  auto with = [&](const char* name, std::vector<std::int64_t> shape) {
    st::File f = case_file(in);
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    f.tensors[name] = st::from_matrix<double>(random_mat(rng, 1, n), shape, DType::F32);
    return f;
  };
  st::File g = with("k", {6, 3, 8});
  g.tensors["v"] = g.tensors["k"];
  expect_error([&] { load_attention_case<double>(g); }, "H_q % H_kv must be 0 for grouped-query attention (q [4, 4, 8] has H_q = 4, k [6, 3, 8] has H_kv = 3)");
  expect_error([&] { load_attention_case<double>(with("k", {6, 2, 4})); }, "k must be [P+T, H_kv, D] with D = 8");
  expect_error([&] { load_attention_case<double>(with("v", {5, 2, 8})); },
               "v must have the shape of k [6, 2, 8]; got [5, 2, 8]");
  st::File f = with("k", {3, 2, 8});
  f.tensors["v"] = f.tensors["k"];
  expect_error([&] { load_attention_case<double>(f); }, "k/v must hold P+T >= T rows (q [4, 4, 8] has T = 4; k [3, 2, 8])");
  expect_error([&] { load_attention_case<double>(with("q_out", {5, 4, 8})); },
               "T_out must be <= T (q_out [5, 4, 8], q [4, 4, 8])");
  expect_error([&] { load_attention_case<double>(with("q_out", {2, 2, 8})); }, "q_out must be [T_out, H_q, D]");
  expect_error([&] { load_attention_case<double>(with("q", {4, 0, 8})); }, "q.shape[1] (H_q) must be in [1, ");
  expect_error([&] { load_attention_case<double>(with("q", {4, 4, 0})); }, "q.shape[2] (D) must be in [1, ");
  f = case_file(in);
  f.tensors["q"] = st::Tensor{DType::F32, {0, 4, 3000000000LL}, {}};  // zero bytes, absurd D
  expect_error([&] { load_attention_case<double>(f); }, "q.shape[2] (D) must be in [1, 2147483647] (got 3000000000");
}

TEST(CaseIoErrors, WindowMetadataIsStrict) {
  const Inputs in = make_inputs(17, 4, 0, 1, 2, 1, 4, 3);
  st::File f = case_file(in);
  f.metadata.erase("window");
  expect_error([&] { load_attention_case<double>(f); }, "missing metadata \"window\"");
  for (const char* bad : {"abc", "1.5", "", " 8", "8 ", "+8", "0x10", "8e0", "-", "99999999999999999999"}) {
    SCOPED_TRACE(bad);
    f.metadata["window"] = bad;
    expect_error([&] { load_attention_case<double>(f); },
                 std::string("metadata \"window\" must be a decimal integer in [1, 2^63-1] (got \"") + bad + "\")");
  }
  for (const char* bad : {"0", "-3"}) {
    f.metadata["window"] = bad;
    expect_error([&] { load_attention_case<double>(f); }, std::string("metadata \"window\" must be >= 1 (got \"") + bad);
  }
  f.metadata["window"] = "1";
  EXPECT_EQ(load_attention_case<double>(f).options.window, 1);
  f.metadata["window"] = "131072";
  EXPECT_EQ(load_attention_case<double>(f).options.window, 131072);
}

TEST(CaseIoErrors, ScaleMetadataMustBeAFiniteNumber) {
  st::File f = case_file(make_inputs(18, 4, 0, 1, 2, 1, 4, 3));
  // "+0.5" is refused like "+8" for the window; "1e-400" would underflow to a zero scale.
  for (const char* bad : {"abc", "", "inf", "nan", "1e999", "0.5x", " 0.5", "0x1p-3", "+0.5", "1e-400"}) {
    SCOPED_TRACE(bad);
    f.metadata["scale"] = bad;
    expect_error([&] { load_attention_case<double>(f); },
                 std::string("metadata \"scale\" must be a finite number (got \"") + bad + "\")");
  }
  f.metadata["scale"] = "0.125";
  EXPECT_EQ(*load_attention_case<double>(f).options.scale, 0.125);
  f.metadata["scale"] = "-0.25";  // any finite scale is valid, 0 (uniform weights) included
  EXPECT_EQ(*load_attention_case<double>(f).options.scale, -0.25);
  f.metadata["scale"] = "0";
  EXPECT_EQ(*load_attention_case<double>(f).options.scale, 0.0);
  f.metadata.erase("scale");
  EXPECT_FALSE(load_attention_case<double>(f).options.scale.has_value());
}

TEST(CaseIoErrors, ResultFileChecks) {
  const Inputs in = make_inputs(19, 3, 0, 1, 2, 1, 4, 3);
  const AttentionResult<double> a = orthros_attention<double>(in.q, in.k, in.v, in.q_out, in.dims, in.opt);
  st::File f = make_attention_result(a, in.dims);
  f.tensors.erase("lse_out");
  expect_error([&] { load_attention_result(f); }, "missing result tensor \"lse_out\"");
  f = make_attention_result(a, in.dims);
  f.tensors["lse"] = st::from_matrix<double>(a.lse, {6}, DType::F64);
  expect_error([&] { load_attention_result(f); }, "result tensor \"lse\" must be rank 2");
}

}  // namespace
}  // namespace orthros::iotest
