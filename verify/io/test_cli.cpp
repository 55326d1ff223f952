// Tests of `orthros attention` as a process (SPEC §5): a valid case reproduces the in-process
// oracle bitwise at f64 and f32; every kind of bad input exits with status 2 and one line
// `orthros: error: ...` naming the problem, and writes no result file.
#include "io_test_util.hpp"

#include "orthros/attention.hpp"
#include "orthros/case_io.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

#ifndef ORTHROS_BIN
#error "ORTHROS_BIN (path of the orthros binary) must be defined by the build"
#endif

namespace orthros::iotest {
namespace {

namespace fs = std::filesystem;
using st::DType;

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("orthros-io-cli-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  struct Result {
    int status = -1;     ///< exit status (-1 if killed by a signal)
    std::string output;  ///< stdout + stderr
  };

  Result run(const std::string& args) const {
    const std::string log = path("log.txt");
    const std::string cmd = std::string("'") + ORTHROS_BIN + "' " + args + " > '" + log + "' 2>&1";
    const int rc = std::system(cmd.c_str());
    Result r;
    r.status = (rc != -1 && WIFEXITED(rc)) ? WEXITSTATUS(rc) : -1;
    std::ifstream in(log);
    std::stringstream ss;
    ss << in.rdbuf();
    r.output = ss.str();
    return r;
  }

  void write_bytes(const std::string& p, const std::vector<std::uint8_t>& b) const {
    std::ofstream out(p, std::ios::binary);
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  }

  // A valid case: GQA 3:1, cache P = 4, T = 6, T_out = 2, window 3, F32 inputs.
  st::File valid_case(std::uint64_t seed) const {
    std::mt19937_64 rng(seed);
    const AttentionDims dims{6, 2, 8};
    AttentionOptions opt;
    opt.window = 3;
    return make_attention_case<double>(random_mat(rng, 6, 48), random_mat(rng, 10, 16), random_mat(rng, 10, 16),
                                       random_mat(rng, 2, 48), dims, opt, DType::F32);
  }

  // Runs on `bytes` and expects status 2, one line "orthros: error: ..." containing `needle`, no result.
  void expect_rejected(const std::vector<std::uint8_t>& bytes, const std::string& needle) const {
    const std::string in = path("bad.safetensors"), out = path("result.safetensors");
    write_bytes(in, bytes);
    fs::remove(out);
    const Result r = run("attention --in '" + in + "' --out '" + out + "'");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_EQ(r.output.rfind("orthros: error: ", 0), 0u) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << r.output << "\nexpected to contain: " << needle;
    EXPECT_NE(r.output.find(in), std::string::npos) << "message should name the file: " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_FALSE(fs::exists(out)) << "no result may be written for a bad case";
  }

  fs::path dir_;
};

TEST_F(Cli, F64ResultEqualsInProcessOracleBitwise) {
  const std::uint64_t seed = 21;
  SCOPED_TRACE("seed " + std::to_string(seed));
  const st::File cf = valid_case(seed);
  st::write_file(path("case.safetensors"), cf);
  const Result r = run("attention --in '" + path("case.safetensors") + "' --out '" + path("res.safetensors") + "'");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("T=6 P=4 T_out=2 H_q=6 H_kv=2 D=8 window=3"), std::string::npos) << r.output;
  const st::File rf = st::read_file(path("res.safetensors"));
  for (const char* name : {"o", "o_out", "lse", "lse_out"}) EXPECT_EQ(rf.tensors.at(name).dtype, DType::F64) << name;
  EXPECT_EQ(rf.metadata.at("precision"), "f64");
  const AttentionCase<double> c = load_attention_case<double>(cf);
  const AttentionResult<double> want = orthros_attention<double>(c.q, c.k, c.v, c.q_out, c.dims, c.options);
  const AttentionResult<double> got = load_attention_result(rf);
  EXPECT_TRUE(got.o == want.o);
  EXPECT_TRUE(got.o_out == want.o_out);
  EXPECT_TRUE(got.lse == want.lse);
  EXPECT_TRUE(got.lse_out == want.lse_out);
}

TEST_F(Cli, F32PrecisionWritesF32EqualToFloatOracle) {
  const std::uint64_t seed = 22;
  SCOPED_TRACE("seed " + std::to_string(seed));
  const st::File cf = valid_case(seed);
  st::write_file(path("case.safetensors"), cf);
  const Result r = run("attention --in '" + path("case.safetensors") + "' --out '" + path("res.safetensors") +
                       "' --precision f32");
  ASSERT_EQ(r.status, 0) << r.output;
  const st::File rf = st::read_file(path("res.safetensors"));
  for (const char* name : {"o", "o_out", "lse", "lse_out"}) EXPECT_EQ(rf.tensors.at(name).dtype, DType::F32) << name;
  const AttentionCase<float> c = load_attention_case<float>(cf);
  const AttentionResult<float> want = orthros_attention<float>(c.q, c.k, c.v, c.q_out, c.dims, c.options);
  const AttentionResult<double> got = load_attention_result(rf);
  EXPECT_TRUE(got.o == want.o.cast<double>());
  EXPECT_TRUE(got.o_out == want.o_out.cast<double>());
  EXPECT_TRUE(got.lse == want.lse.cast<double>());
  EXPECT_TRUE(got.lse_out == want.lse_out.cast<double>());
}

TEST_F(Cli, MissingInputFile) {
  const Result r = run("attention --in '" + path("nope.safetensors") + "' --out '" + path("r.safetensors") + "'");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_EQ(r.output.rfind("orthros: error: cannot open \"" + path("nope.safetensors") + "\"", 0), 0u) << r.output;
}

TEST_F(Cli, MalformedFilesAreRejected) {
  const std::vector<std::uint8_t> good = st::serialize(valid_case(23));
  {
    SCOPED_TRACE("empty file");
    expect_rejected({}, "file has 0 bytes");
  }
  {
    SCOPED_TRACE("truncated");
    expect_rejected(std::vector<std::uint8_t>(good.begin(), good.end() - 3), "outside the data section");
  }
  {
    SCOPED_TRACE("header cut");
    expect_rejected(std::vector<std::uint8_t>(good.begin(), good.begin() + 40), "exceeds the file");
  }
  {
    SCOPED_TRACE("not JSON");
    expect_rejected(raw_file("{\"q\": [", filler(8)), "header is not valid JSON");
  }
  {
    SCOPED_TRACE("I32");
    expect_rejected(raw_file(R"({"k":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})", filler(8)),
                    "dtype I32 is not supported");
  }
  {
    SCOPED_TRACE("offsets");
    expect_rejected(raw_file(R"({"k":{"dtype":"F32","shape":[2],"data_offsets":[0,800]}})", filler(8)),
                    "outside the data section");
  }
}

TEST_F(Cli, BadCasesAreRejected) {
  const st::File good = valid_case(24);
  st::File f = good;
  f.tensors.erase("q_out");
  expect_rejected(st::serialize(f), "missing tensor \"q_out\"");
  f = good;
  f.metadata["window"] = "abc";
  expect_rejected(st::serialize(f), "metadata \"window\" must be a decimal integer in [1, 2^63-1] (got \"abc\")");
  f.metadata["window"] = "0";
  expect_rejected(st::serialize(f), "metadata \"window\" must be >= 1 (got \"0\")");
  f.metadata.erase("window");
  expect_rejected(st::serialize(f), "missing metadata \"window\"");
  f = good;
  f.tensors["k"].shape = {10, 4, 4};  // same bytes, H_kv = 4 does not divide H_q = 6 (and D differs)
  f.tensors["v"].shape = {10, 4, 4};
  expect_rejected(st::serialize(f), "k must be [P+T, H_kv, D] with D = 8");
  f = good;
  f.tensors["k"].shape = {5, 4, 8};
  f.tensors["v"].shape = {5, 4, 8};
  expect_rejected(st::serialize(f), "H_q % H_kv must be 0");
  f = good;
  Mat<double> q = st::to_matrix<double>(f.tensors["q"], "q");
  q(2, 7) = std::numeric_limits<double>::quiet_NaN();
  f.tensors["q"] = st::from_matrix<double>(q, {6, 6, 8}, DType::F32);
  // named as the case's tensor with what it holds and its first [t, h, d] index
  expect_rejected(st::serialize(f), "tensor \"q\" holds NaN at [2, 0, 7] (the first of 1 non-finite value; case "
                                    "inputs must be finite)");
}

TEST_F(Cli, UsageErrors) {
  st::write_file(path("case.safetensors"), valid_case(25));
  Result r = run("attention --out '" + path("r.safetensors") + "'");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("--in"), std::string::npos) << r.output;
  r = run("attention --in '" + path("case.safetensors") + "' --out '" + path("r.safetensors") + "' --precision f16");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("--precision"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(path("r.safetensors")));
  r = run("attention --in '" + path("case.safetensors") + "' --out /nonexistent-dir/r.safetensors");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("cannot write \"/nonexistent-dir/r.safetensors\""), std::string::npos) << r.output;
}

}  // namespace
}  // namespace orthros::iotest
