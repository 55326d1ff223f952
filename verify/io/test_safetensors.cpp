// Tests of the safetensors layer (verify/kit/include/orthros/safetensors.hpp, SPEC §5):
// round trip in every dtype, on-disk encoding, round-to-nearest-even narrowing, and one
// test per malformed-file error, plus truncation and corruption sweeps (never a crash).
#include "io_test_util.hpp"

#include "orthros/safetensors.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <random>
#include <sys/stat.h>
#include <unistd.h>

namespace orthros::iotest {
namespace {

using st::DType;
constexpr DType kAllDtypes[] = {DType::F64, DType::F32, DType::F16, DType::BF16};

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("orthros-io-" + std::to_string(::getpid()) + "-" + name)).string();
}

double ldexp1(double m, int e) { return std::ldexp(m, e); }

template <typename S>
std::uint16_t bits16(S x) {
  return Eigen::numext::bit_cast<std::uint16_t>(x);
}

// Value of `x` after rounding to `dtype` (through the API under test), as a double.
double rounded(double x, DType dtype) {
  switch (dtype) {
    case DType::F64: return x;
    case DType::F32: return st::round_to<float>(x);
    case DType::F16: return static_cast<float>(st::round_to<Eigen::half>(x));
    case DType::BF16: return static_cast<float>(st::round_to<Eigen::bfloat16>(x));
  }
  return x;
}

// ---------------------------------------------------------------- round trip

TEST(Safetensors, RoundTripEveryDtypeThroughAFile) {
  const std::uint64_t seed = 20261013;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (DType dt : kAllDtypes) {
    SCOPED_TRACE(st::dtype_string(dt));
    // Values exactly representable in dt (rounded first), so the round trip must be the identity.
    Mat<double> a = random_mat(rng, 3, 20, 3.0), b = random_mat(rng, 1, 7, 0.01);
    for (Eigen::Index i = 0; i < a.size(); ++i) a.data()[i] = rounded(a.data()[i], dt);
    for (Eigen::Index i = 0; i < b.size(); ++i) b.data()[i] = rounded(b.data()[i], dt);
    st::File f;
    f.tensors["a"] = st::from_matrix<double>(a, {3, 4, 5}, dt);
    f.tensors["b"] = st::from_matrix<double>(b, {7}, dt);
    f.tensors["empty"] = st::from_matrix<double>(Mat<double>(0, 6), {0, 2, 3}, dt);
    f.metadata = {{"window", "8"}, {"note", "round trip"}};
    const std::string path = temp_path(std::string("rt-") + st::dtype_string(dt) + ".safetensors");
    st::write_file(path, f);
    const st::File g = st::read_file(path);
    std::filesystem::remove(path);

    EXPECT_EQ(g.metadata, f.metadata);
    ASSERT_EQ(g.tensors.size(), 3u);
    EXPECT_EQ(g.tensors.at("a").dtype, dt);
    EXPECT_EQ(g.tensors.at("a").shape, (std::vector<std::int64_t>{3, 4, 5}));
    EXPECT_EQ(g.tensors.at("b").shape, (std::vector<std::int64_t>{7}));
    EXPECT_EQ(g.tensors.at("empty").shape, (std::vector<std::int64_t>{0, 2, 3}));
    const Mat<double> a2 = st::to_matrix<double>(g.tensors.at("a"), "a");
    const Mat<double> b2 = st::to_matrix<double>(g.tensors.at("b"), "b");
    ASSERT_EQ(a2.rows(), 3);
    ASSERT_EQ(a2.cols(), 20);
    ASSERT_EQ(b2.rows(), 7);  // rank 1 [n] -> n x 1
    ASSERT_EQ(b2.cols(), 1);
    for (Eigen::Index i = 0; i < a.size(); ++i) ASSERT_EQ(bits(a2.data()[i]), bits(a.data()[i])) << "a[" << i << "]";
    for (Eigen::Index i = 0; i < b.size(); ++i) ASSERT_EQ(bits(b2.data()[i]), bits(b.data()[i])) << "b[" << i << "]";
    EXPECT_EQ(st::to_matrix<double>(g.tensors.at("empty"), "empty").rows(), 0);
    EXPECT_EQ(st::to_matrix<double>(g.tensors.at("empty"), "empty").cols(), 6);
    // Deterministic bytes: re-serializing what was read gives the same file.
    EXPECT_EQ(st::serialize(g), st::serialize(f));
  }
}

// A native matrix of S written in S's own dtype reads back bitwise.
template <typename S>
void native_round_trip(DType dt, std::uint64_t seed) {
  SCOPED_TRACE(std::string(dtype_name<S>()) + " seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Mat<S> m = st::to_matrix<S>(st::from_matrix<double>(random_mat(rng, 5, 12), {5, 3, 4}, DType::F64), "m");
  st::File f;
  f.tensors["m"] = st::from_matrix<S>(m, {5, 3, 4}, dt);
  const st::File g = st::parse(st::serialize(f));
  const Mat<S> m2 = st::to_matrix<S>(g.tensors.at("m"), "m");
  ASSERT_EQ(m2.rows(), 5);
  ASSERT_EQ(m2.cols(), 12);
  for (Eigen::Index i = 0; i < m.size(); ++i)
    ASSERT_EQ(bits(static_cast<double>(m2.data()[i])), bits(static_cast<double>(m.data()[i]))) << i;
}

TEST(Safetensors, NativeScalarRoundTrip) {
  native_round_trip<double>(DType::F64, 1);
  native_round_trip<float>(DType::F32, 2);
  native_round_trip<Eigen::half>(DType::F16, 3);
  native_round_trip<Eigen::bfloat16>(DType::BF16, 4);
}

TEST(Safetensors, SerializedLayoutIsAlignedSortedAndPacked) {
  st::File f;
  f.tensors["zeta"] = st::from_matrix<double>(Mat<double>::Constant(1, 3, 1.5), {3}, DType::F16);
  f.tensors["alpha"] = st::from_matrix<double>(Mat<double>::Constant(2, 2, -0.75), {2, 2}, DType::F32);
  f.metadata["k"] = "v";
  const std::vector<std::uint8_t> b = st::serialize(f);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[i];
  EXPECT_EQ((8 + n) % 8, 0u) << "data section must start 8-byte aligned";
  const std::string header(b.begin() + 8, b.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  // Sorted keys, packed from offset 0: alpha (16 bytes) then zeta (6 bytes).
  EXPECT_NE(header.find("\"alpha\":{\"data_offsets\":[0,16]"), std::string::npos) << header;
  EXPECT_NE(header.find("\"zeta\":{\"data_offsets\":[16,22]"), std::string::npos) << header;
  EXPECT_LT(header.find("__metadata__"), header.find("alpha"));
  EXPECT_EQ(b.size(), 8 + n + 22);
}

// Bit patterns derived from the IEEE layouts (sign | biased exponent | mantissa):
// 1.0 = 2^0, -2.0 = -2^1, 0.5 = 2^-1, 1.5 = 1.1b*2^0, -0.75 = -1.1b*2^-1, 3.0 = 1.1b*2^1.
// f64 bias 1023 / 52 bits, f32 bias 127 / 23 bits, f16 bias 15 / 10 bits, bf16 bias 127 / 7 bits.
TEST(Safetensors, OnDiskEncodingIsLittleEndianIEEE) {
  const Mat<double> m = (Mat<double>(2, 3) << 1.0, -2.0, 0.5, 1.5, -0.75, 3.0).finished();
  const std::uint64_t f64[] = {0x3FF0000000000000, 0xC000000000000000, 0x3FE0000000000000,
                               0x3FF8000000000000, 0xBFE8000000000000, 0x4008000000000000};
  const std::uint64_t f32[] = {0x3F800000, 0xC0000000, 0x3F000000, 0x3FC00000, 0xBF400000, 0x40400000};
  const std::uint64_t f16[] = {0x3C00, 0xC000, 0x3800, 0x3E00, 0xBA00, 0x4200};
  const std::uint64_t bf16[] = {0x3F80, 0xC000, 0x3F00, 0x3FC0, 0xBF40, 0x4040};
  const std::pair<DType, const std::uint64_t*> cases[] = {
      {DType::F64, f64}, {DType::F32, f32}, {DType::F16, f16}, {DType::BF16, bf16}};
  for (auto [dt, want] : cases) {
    SCOPED_TRACE(st::dtype_string(dt));
    const st::Tensor t = st::from_matrix<double>(m, {2, 3}, dt);
    const std::size_t es = st::dtype_size(dt);
    ASSERT_EQ(t.data.size(), 6 * es);
    for (int i = 0; i < 6; ++i) {
      std::uint64_t got = 0;
      for (int j = static_cast<int>(es) - 1; j >= 0; --j) got = (got << 8) | t.data[i * es + j];
      EXPECT_EQ(got, want[i]) << "element " << i;
      EXPECT_EQ(st::element(t, i), m.data()[i]) << "element " << i;
    }
  }
}

TEST(Safetensors, ToMatrixShapes) {
  st::Tensor t = st::from_matrix<double>(Mat<double>::Constant(1, 1, 2.5), {}, DType::F32);  // scalar
  EXPECT_EQ(st::to_matrix<double>(t, "s").rows(), 1);
  EXPECT_EQ(st::to_matrix<double>(t, "s").cols(), 1);
  EXPECT_EQ(st::to_matrix<double>(t, "s")(0, 0), 2.5);
  Mat<double> m(2, 12);
  for (int i = 0; i < 24; ++i) m.data()[i] = i + 1;
  const Mat<double> r = st::to_matrix<double>(st::from_matrix<double>(m, {2, 3, 4}, DType::F64), "x");
  ASSERT_EQ(r.rows(), 2);
  ASSERT_EQ(r.cols(), 12);
  EXPECT_EQ(r(1, 5), 1 + 12 + 5);  // row-major: (1, 5) is flat index 12 + 5 = 17, holding 18
  expect_error([&] { st::from_matrix<double>(m, {5, 5}, DType::F64); }, "has 25 elements but the matrix is 2 x 12");
}

// ---------------------------------------------------------------- rounding

TEST(Safetensors, Bf16RoundsToNearestEven) {
  using B = Eigen::bfloat16;
  auto r = [](double x) { return static_cast<double>(static_cast<float>(st::round_to<B>(x))); };
  // 7 mantissa bits: the spacing at [1, 2) is 2^-7.
  EXPECT_EQ(r(1 + ldexp1(1, -8)), 1.0);                             // tie: 1 (even) vs 1+2^-7 (odd)
  EXPECT_EQ(r(1 + ldexp1(3, -8)), 1 + ldexp1(1, -6));               // tie: 1+2^-7 (odd) vs 1+2^-6 (even)
  EXPECT_EQ(r(-(1 + ldexp1(3, -8))), -(1 + ldexp1(1, -6)));         // symmetric for negatives
  EXPECT_EQ(r(1 + ldexp1(1, -8) + ldexp1(1, -40)), 1 + ldexp1(1, -7));  // just above the tie
  EXPECT_EQ(r(1 + ldexp1(1, -8) - ldexp1(1, -40)), 1.0);               // just below the tie
  // Double-rounding trap: float32 would first round 1+2^-8+2^-40 to the tie 1+2^-8, then to 1.
  EXPECT_NE(r(1 + ldexp1(1, -8) + ldexp1(1, -40)), r(static_cast<float>(1 + ldexp1(1, -8) + ldexp1(1, -40))));
  // Largest finite (2-2^-7)*2^127 has an odd mantissa, so the tie (2-2^-8)*2^127 goes to inf.
  EXPECT_EQ(r((2 - ldexp1(1, -7)) * ldexp1(1, 127)), (2 - ldexp1(1, -7)) * ldexp1(1, 127));
  EXPECT_EQ(r((2 - ldexp1(1, -8)) * ldexp1(1, 127)), std::numeric_limits<double>::infinity());
  EXPECT_EQ(r(-(2 - ldexp1(1, -8)) * ldexp1(1, 127)), -std::numeric_limits<double>::infinity());
  EXPECT_EQ(r((2 - ldexp1(1, -8) - ldexp1(1, -30)) * ldexp1(1, 127)), (2 - ldexp1(1, -7)) * ldexp1(1, 127));
  // Subnormals: quantum 2^-133.
  EXPECT_EQ(r(ldexp1(1, -133)), ldexp1(1, -133));
  EXPECT_EQ(bits(r(ldexp1(1, -134))), bits(0.0));               // tie: 0 (even) vs 2^-133 (odd)
  EXPECT_EQ(r(ldexp1(3, -134)), ldexp1(1, -132));               // tie: 2^-133 (odd) vs 2^-132 (even)
  EXPECT_EQ(r(ldexp1(1, -134) * (1 + ldexp1(1, -20))), ldexp1(1, -133));
  EXPECT_EQ(bits16(st::round_to<B>(-0.0)), 0x8000);
  EXPECT_TRUE(std::isnan(r(std::nan(""))));
}

TEST(Safetensors, F16RoundsToNearestEven) {
  using H = Eigen::half;
  auto r = [](double x) { return static_cast<double>(static_cast<float>(st::round_to<H>(x))); };
  // 10 mantissa bits: spacing 2^-10 at [1, 2).
  EXPECT_EQ(r(1 + ldexp1(1, -11)), 1.0);
  EXPECT_EQ(r(1 + ldexp1(3, -11)), 1 + ldexp1(1, -9));
  EXPECT_EQ(r(1 + ldexp1(1, -11) + ldexp1(1, -45)), 1 + ldexp1(1, -10));
  // Largest finite 65504 = (2-2^-10)*2^15 (odd mantissa): the tie 65520 overflows, 65519 does not.
  EXPECT_EQ(r(65504.0), 65504.0);
  EXPECT_EQ(r(65519.0), 65504.0);
  EXPECT_EQ(r(65520.0), std::numeric_limits<double>::infinity());
  EXPECT_EQ(r(-65520.0), -std::numeric_limits<double>::infinity());
  // Subnormals: quantum 2^-24.
  EXPECT_EQ(r(ldexp1(1, -24)), ldexp1(1, -24));
  EXPECT_EQ(r(ldexp1(1, -25)), 0.0);
  EXPECT_EQ(r(ldexp1(3, -25)), ldexp1(1, -23));
  EXPECT_EQ(r(ldexp1(5, -26)), ldexp1(1, -24));  // 1.25 quanta -> 1
  EXPECT_EQ(bits16(st::round_to<H>(-0.0)), 0x8000);
  EXPECT_TRUE(std::isnan(r(std::nan(""))));
}

TEST(Safetensors, F32RoundsToNearestEven) {
  EXPECT_EQ(st::round_to<float>(1 + ldexp1(1, -24)), 1.0f);
  EXPECT_EQ(st::round_to<float>(1 + ldexp1(3, -24)), static_cast<float>(1 + ldexp1(1, -22)));
  const st::Tensor t = st::from_matrix<double>(Mat<double>::Constant(1, 1, 1 + ldexp1(3, -24)), {1}, DType::F32);
  EXPECT_EQ(st::element(t, 0), 1 + ldexp1(1, -22));
}

// From float inputs, a single rounding to bf16/f16 is what Eigen's own conversions compute,
// so they serve as an independent check on many random values (wide exponent range).
TEST(Safetensors, NarrowingFromFloatMatchesEigen) {
  const std::uint64_t seed = 77;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::uint32_t> u;
  int checked = 0;
  for (int i = 0; i < 200000; ++i) {
    std::uint32_t b = u(rng);
    float x;
    std::memcpy(&x, &b, 4);
    if (!std::isfinite(x)) continue;
    ASSERT_EQ(bits16(st::round_to<Eigen::bfloat16>(x)), bits16(Eigen::bfloat16(x))) << "x = " << x;
    ASSERT_EQ(bits16(st::round_to<Eigen::half>(x)), bits16(Eigen::half(x))) << "x = " << x;
    ++checked;
  }
  EXPECT_GT(checked, 190000);
}

TEST(Safetensors, ToMatrixNarrowsWithTheSameRounding) {
  const double x = 1 + ldexp1(1, -8) + ldexp1(1, -40);
  const st::Tensor t = st::from_matrix<double>(Mat<double>::Constant(1, 2, x), {2}, DType::F64);
  const Mat<Eigen::bfloat16> m = st::to_matrix<Eigen::bfloat16>(t, "t");
  EXPECT_EQ(static_cast<float>(m(0, 0)), static_cast<float>(1 + ldexp1(1, -7)));
  const st::Tensor tb = st::from_matrix<double>(Mat<double>::Constant(1, 2, x), {2}, DType::BF16);
  EXPECT_EQ(st::element(tb, 1), 1 + ldexp1(1, -7));
}

// ---------------------------------------------------------------- malformed files

const std::string kGood = R"({"t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";

TEST(SafetensorsErrors, GoodBaselineParses) {
  const st::File f = st::parse(raw_file(kGood, filler(16)));
  EXPECT_EQ(f.tensors.at("t").shape, (std::vector<std::int64_t>{2, 2}));
}

TEST(SafetensorsErrors, MissingFile) {
  expect_error([] { st::read_file("/nonexistent-dir/case.safetensors"); }, "cannot open \"/nonexistent-dir/case.safetensors\"");
}

TEST(SafetensorsErrors, ShorterThanEightBytes) {
  expect_error([] { st::parse({}); }, "file has 0 bytes");
  expect_error([] { st::parse({1, 2, 3}); }, "needs at least 8");
}

TEST(SafetensorsErrors, HeaderLongerThanFile) {
  std::vector<std::uint8_t> b = raw_file(kGood, filler(16));
  b[0] = 0xFF;  // header length 255 + the rest: the file has 8 + 59 + 16 bytes
  b[1] = 0x00;
  expect_error([&] { st::parse(b); }, "exceeds the file");
}

TEST(SafetensorsErrors, AbsurdHeaderLength) {
  std::vector<std::uint8_t> b = raw_file(kGood, filler(16));
  b[5] = 0x01;  // 2^40 + ...
  expect_error([&] { st::parse(b); }, "is absurd");
  std::vector<std::uint8_t> c(8, 0xFF);  // 2^64 - 1
  expect_error([&] { st::parse(c); }, "is absurd");
}

TEST(SafetensorsErrors, InvalidJson) {
  expect_error([] { st::parse(raw_file("{\"t\": {", {})); }, "header is not valid JSON");
  expect_error([] { st::parse(raw_file("", {})); }, "header is not valid JSON");
  expect_error([] { st::parse(raw_file(std::string("{}\0\0", 4), {})); }, "header is not valid JSON");
}

TEST(SafetensorsErrors, DuplicateKeysAndByteOrderMarkRejected) {
  const std::vector<std::uint8_t> four(4, 0x3f);
  // Two "q" entries: a JSON parser keeps the last one silently; the reader must refuse.
  expect_error([&] {
    st::parse(raw_file(R"({"q": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                       R"( "q": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
                       four));
  }, "header repeats the key \"q\"");
  expect_error([&] {
    st::parse(raw_file(R"({"q": {"dtype": "F32", "dtype": "F16", "shape": [1], "data_offsets": [0, 4]}})", four));
  }, "header repeats the key \"dtype\"");
  expect_error([&] { st::parse(raw_file(R"({"__metadata__": {"window": "3", "window": "4"}})", {})); },
               "header repeats the key \"window\"");
  // The same key in different objects is fine.
  EXPECT_NO_THROW(st::parse(raw_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                                     R"( "b": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]}})",
                                     four)));
  expect_error([] { st::parse(raw_file("\xEF\xBB\xBF{}", {})); }, "byte-order mark");
}

TEST(SafetensorsErrors, HeaderNotAnObject) {
  expect_error([] { st::parse(raw_file("[1, 2]", {})); }, "header must be a JSON object (got array)");
  expect_error([] { st::parse(raw_file("42", {})); }, "header must be a JSON object (got number)");
}

TEST(SafetensorsErrors, EntryNotAnObject) {
  expect_error([] { st::parse(raw_file(R"({"q": 5})", {})); }, "tensor \"q\": entry must be an object");
}

TEST(SafetensorsErrors, EntryMissingFields) {
  expect_error([] { st::parse(raw_file(R"({"q":{"shape":[2],"data_offsets":[0,8]}})", filler(8))); },
               "tensor \"q\": missing \"dtype\"");
  expect_error([] { st::parse(raw_file(R"({"q":{"dtype":"F32","data_offsets":[0,8]}})", filler(8))); },
               "tensor \"q\": missing \"shape\"");
  expect_error([] { st::parse(raw_file(R"({"q":{"dtype":"F32","shape":[2]}})", filler(8))); },
               "tensor \"q\": missing \"data_offsets\"");
}

TEST(SafetensorsErrors, UnsupportedAndUnknownDtypes) {
  expect_error([] { st::parse(raw_file(R"({"k":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})", filler(8))); },
               "tensor \"k\": dtype I32 is not supported (supported: F64, F32, F16, BF16)");
  expect_error([] { st::parse(raw_file(R"({"k":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", filler(2))); },
               "dtype U8 is not supported");
  expect_error([] { st::parse(raw_file(R"({"k":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", filler(2))); },
               "dtype F8_E4M3 is not supported");
  expect_error([] { st::parse(raw_file(R"({"k":{"dtype":"float32","shape":[2],"data_offsets":[0,8]}})", filler(8))); },
               "unknown dtype \"float32\"");
  expect_error([] { st::parse(raw_file(R"({"k":{"dtype":32,"shape":[2],"data_offsets":[0,8]}})", filler(8))); },
               "\"dtype\" must be a string");
}

TEST(SafetensorsErrors, BadShapes) {
  expect_error([] { st::parse(raw_file(R"({"k":{"dtype":"F32","shape":[2,-2],"data_offsets":[0,16]}})", filler(16))); },
               "tensor \"k\": negative dimension -2");
  expect_error([] { st::parse(raw_file(R"({"k":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", filler(8))); },
               "\"shape\" must be an array of integers");
  expect_error([] { st::parse(raw_file(R"({"k":{"dtype":"F32","shape":"2x2","data_offsets":[0,8]}})", filler(8))); },
               "\"shape\" must be an array of integers");
  expect_error(
      [] {
        st::parse(raw_file(
            R"({"k":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904],"data_offsets":[0,8]}})",
            filler(8)));
      },
      "overflows");
  expect_error(
      [] { st::parse(raw_file(R"({"k":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", filler(8))); },
      "overflows");
}

TEST(SafetensorsErrors, OffsetsOutsideDataSection) {
  expect_error([] { st::parse(raw_file(kGood, filler(12))); },
               "tensor \"t\": data_offsets [0, 16] outside the data section (12 bytes)");
  expect_error([] { st::parse(raw_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", filler(8))); },
               "data_offsets begin 8 > end 0");
  for (const char* bad : {"[0]", "[0,8,16]", "[-1,7]", "[0.0,8]", "\"0,8\"", "[0,\"8\"]"}) {
    SCOPED_TRACE(bad);
    expect_error([&] {
      st::parse(raw_file(std::string(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":)") + bad + "}}", filler(8)));
    }, "\"data_offsets\" must be [begin, end], two integers >= 0");
  }
}

TEST(SafetensorsErrors, OffsetsSizeMismatch) {
  expect_error([] { st::parse(raw_file(R"({"t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", filler(16))); },
               "span 12 bytes but F32 [2, 2] needs 16");
  expect_error([] { st::parse(raw_file(R"({"t":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})", filler(8))); },
               "span 8 bytes but BF16 [3] needs 6");
}

// Choice (safetensors.hpp): overlapping non-empty tensors are rejected; gaps are accepted.
TEST(SafetensorsErrors, OverlapRejectedGapAccepted) {
  expect_error(
      [] {
        st::parse(raw_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                           R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                           filler(24)));
      },
      "overlap");
  const st::File f = st::parse(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]},)"
                                        R"("e":{"dtype":"F32","shape":[0,3],"data_offsets":[4,4]}})",
                                        filler(32)));
  EXPECT_EQ(f.tensors.size(), 3u);
}

TEST(SafetensorsErrors, BadMetadata) {
  expect_error([] { st::parse(raw_file(R"({"__metadata__":{"window":8}})", {})); },
               "__metadata__ value of \"window\" must be a string (got number 8)");
  expect_error([] { st::parse(raw_file(R"({"__metadata__":{"a":"x","b":null}})", {})); },
               "__metadata__ value of \"b\" must be a string");
  expect_error([] { st::parse(raw_file(R"({"__metadata__":["window","8"]})", {})); },
               "__metadata__ must be an object of strings (got array)");
}

TEST(SafetensorsErrors, WriterRejectsInconsistentTensors) {
  st::File f;
  f.tensors["t"] = st::Tensor{DType::F32, {2, 2}, filler(12)};
  expect_error([&] { st::serialize(f); }, "tensor \"t\": has 12 data bytes but F32 [2, 2] needs 16");
  f.tensors["t"] = st::Tensor{DType::F32, {-2, 2}, {}};
  expect_error([&] { st::serialize(f); }, "negative dimension -2");
  expect_error([&] { st::write_file("/nonexistent-dir/out.safetensors", st::File{}); }, "cannot write");
}

// Every strict prefix of a valid file is rejected with an orthros::Error (truncated downloads).
TEST(SafetensorsErrors, EveryTruncationIsRejected) {
  st::File f;
  f.tensors["a"] = st::from_matrix<double>(Mat<double>::Constant(3, 4, 1.25), {3, 4}, DType::BF16);
  f.tensors["b"] = st::from_matrix<double>(Mat<double>::Constant(2, 2, -3.5), {2, 2}, DType::F64);
  f.metadata["window"] = "4";
  const std::vector<std::uint8_t> full = st::serialize(f);
  for (std::size_t n = 0; n < full.size(); ++n) {
    const std::vector<std::uint8_t> cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW(st::parse(cut), Error) << "prefix of " << n << " of " << full.size() << " bytes";
  }
  EXPECT_NO_THROW(st::parse(full));
}

// Random byte corruption: parse either succeeds or throws orthros::Error, never anything else.
TEST(SafetensorsErrors, CorruptedBytesNeverCrash) {
  const std::uint64_t seed = 1234567;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  st::File f;
  f.tensors["q"] = st::from_matrix<double>(random_mat(rng, 2, 6), {2, 2, 3}, DType::F16);
  f.tensors["k"] = st::from_matrix<double>(random_mat(rng, 3, 6), {3, 2, 3}, DType::F32);
  f.metadata["window"] = "2";
  const std::vector<std::uint8_t> full = st::serialize(f);
  int rejected = 0;
  for (int it = 0; it < 5000; ++it) {
    std::vector<std::uint8_t> b = full;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int j = 0; j < flips; ++j) b[rng() % b.size()] = static_cast<std::uint8_t>(rng());
    try {
      st::parse(b);
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      FAIL() << "iteration " << it << ": non-orthros exception " << e.what();
    }
  }
  EXPECT_GT(rejected, 0);
}

}  // namespace
}  // namespace orthros::iotest

namespace orthros::iotest {
namespace {
// Paths that are not regular files are refused by name before they are opened: opening a FIFO
// without a writer blocks, and /dev/zero never ends (read_file would read forever).
TEST(Safetensors, ReadFileRejectsWhatIsNotARegularFile) {
  expect_error([] { st::read_file("/dev/zero"); }, "\"/dev/zero\" is a character device, not a .safetensors file");
  const std::string dir = temp_path("a-directory");
  std::filesystem::create_directories(dir);
  expect_error([&] { st::read_file(dir); }, "is a directory, not a .safetensors file");
  const std::string fifo = temp_path("a-fifo");
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error([&] { st::read_file(fifo); }, "is a FIFO (named pipe), not a .safetensors file");
  expect_error([&] { st::require_regular_file(fifo, "a text file"); }, "is a FIFO (named pipe), not a text file");
  expect_error([&] { st::read_file(temp_path("missing")); }, "no such file");
  std::filesystem::remove(fifo);
  std::filesystem::remove(dir);
}
}  // namespace
}  // namespace orthros::iotest
