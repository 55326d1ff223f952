// Host logic of the GPU harness (verify/gpu/harness), runs without a GPU (label `unit`):
// - CaseShape's closed-form pair, FLOP and byte counts against a brute-force enumeration of the
//   SPEC §2 masks on seeded random small batches;
// - the canary guard pattern (NaN in every dtype, distinct per side) and its byte-for-byte check
//   on host memory.
#include "canary.hpp"
#include "case_shape.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <vector>

using namespace orthros::gpu_harness;

namespace {

/// Brute force over every (row, key) pair of one sequence, from the masks of SPEC §2: a base row
/// at position t sees key j when t - w < j <= t; an output row at position t sees every j <= t.
struct Brute {
  double base_pairs = 0, output_pairs = 0;
  std::set<std::int64_t> keys_read;  // cache rows some row of the call attends
};

Brute brute(const SequenceShape& s, std::int64_t w) {
  Brute r;
  for (std::int64_t t = s.P; t < s.P + s.T; ++t)
    for (std::int64_t j = 0; j <= t; ++j)
      if (t - w < j) {
        r.base_pairs += 1;
        r.keys_read.insert(j);
      }
  for (std::int64_t t = s.P + s.T - s.T_out; t < s.P + s.T; ++t)
    for (std::int64_t j = 0; j <= t; ++j) {
      r.output_pairs += 1;
      r.keys_read.insert(j);
    }
  return r;
}

CaseShape random_shape(std::mt19937_64& rng) {
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  CaseShape c;
  c.num_kv_heads = static_cast<int>(pick(1, 3));
  c.num_q_heads = c.num_kv_heads * static_cast<int>(pick(1, 4));
  c.head_dim = static_cast<int>(16 * pick(1, 8));
  const std::int64_t windows[] = {1, 2, 5, 16, 64, std::numeric_limits<std::int64_t>::max() / 4};
  c.window = windows[pick(0, 5)];
  c.element_bytes = pick(0, 1) ? 2 : 4;
  const int B = static_cast<int>(pick(1, 4));
  for (int b = 0; b < B; ++b) {
    SequenceShape s;
    s.T = pick(0, 40);
    s.P = pick(0, 1) ? 0 : pick(0, 70);
    s.T_out = pick(0, 2) == 0 ? s.T : pick(0, s.T);
    c.seqs.push_back(s);
  }
  return c;
}

}  // namespace

TEST(GpuHarnessCaseShape, PairsFlopsAndBytesMatchBruteForce) {
  for (std::uint64_t seed = 1; seed <= 300; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const CaseShape c = random_shape(rng);
    ASSERT_NO_THROW(c.validate());
    double base = 0, out = 0, kv_rows = 0, tq = 0, to = 0;
    for (const auto& s : c.seqs) {
      const Brute b = brute(s, c.window);
      base += b.base_pairs;
      out += b.output_pairs;
      kv_rows += static_cast<double>(b.keys_read.size());
      tq += static_cast<double>(s.T);
      to += static_cast<double>(s.T_out);
    }
    EXPECT_EQ(c.base_pairs(), base);
    EXPECT_EQ(c.output_pairs(), out);
    EXPECT_EQ(c.kv_rows_read(), kv_rows);
    // FLOPs: 2 FLOPs per multiply-add, one multiply-add per (pair, head, d) and GEMM; the forward
    // has 2 GEMMs (QK^T, PV), the backward 5 (QK^T again, dO V^T, P^T dO, dS K, dS^T Q).
    const double per_gemm = 2.0 * c.head_dim * c.num_q_heads * (base + out);
    EXPECT_EQ(c.forward_flops(), 2 * per_gemm);
    EXPECT_DOUBLE_EQ(c.backward_flops(), 5 * per_gemm);
    // Bytes: each tensor's rows once. Forward: q, o (tq rows), q_out, o_out (to rows), k, v
    // (the rows some query attends). Backward: q, o, d_o, dq and their output-stream twins, k and
    // v read, dk and dv written (tq rows each).
    const double qr = double(c.element_bytes) * c.num_q_heads * c.head_dim;
    const double kvr = double(c.element_bytes) * c.num_kv_heads * c.head_dim;
    EXPECT_EQ(c.forward_bytes(), qr * (tq + tq + to + to) + kvr * (kv_rows + kv_rows));
    EXPECT_EQ(c.backward_bytes(), qr * 4 * (tq + to) + kvr * (kv_rows + kv_rows) + kvr * (tq + tq));
  }
}

TEST(GpuHarnessCaseShape, SumMinMatchesLoopAtLargeLengths) {
  // Against the plain loop up to 2^20 terms: the closed form has no rounding below 2^53.
  const std::int64_t cases[][3] = {{1, 1 << 20, 128}, {5, 300, 1}, {129, 1000, 128}, {1, 1 << 20, 1 << 21}, {7, 6, 3}};
  for (const auto& c : cases) {
    double loop = 0;
    for (std::int64_t u = c[0]; u <= c[1]; ++u) loop += static_cast<double>(std::min(u, c[2]));
    EXPECT_EQ(sum_min(c[0], c[1], c[2]), loop) << "lo=" << c[0] << " hi=" << c[1] << " w=" << c[2];
  }
}

TEST(GpuHarnessCaseShape, RejectsInvalidShapesNamingTheField) {
  CaseShape c = CaseShape::uniform(4, 2, 64, 128, 2, 1, 10, 0, 3);
  c.seqs[0].T_out = 11;
  try {
    c.validate();
    FAIL() << "T_out > T accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("T_out=11"), std::string::npos) << e.what();
  }
  EXPECT_THROW(CaseShape::uniform(4, 2, 64, 0, 2, 1, 10, 0, 3), std::invalid_argument);
  EXPECT_THROW(CaseShape::uniform(4, 2, 64, 128, 3, 1, 10, 0, 3), std::invalid_argument);
}

namespace {
bool is_nan_f32(const std::uint8_t* p) {
  float f;
  std::memcpy(&f, p, 4);
  return std::isnan(f);
}
// f16 and bf16 NaN from the IEEE layouts (little-endian): exponent all ones, mantissa nonzero.
bool is_nan_f16(const std::uint8_t* p) {
  const unsigned v = p[0] | (unsigned(p[1]) << 8);
  return ((v >> 10) & 0x1F) == 0x1F && (v & 0x3FF) != 0;
}
bool is_nan_bf16(const std::uint8_t* p) {
  const unsigned v = p[0] | (unsigned(p[1]) << 8);
  return ((v >> 7) & 0xFF) == 0xFF && (v & 0x7F) != 0;
}
}  // namespace

TEST(GpuHarnessCanary, PatternReadsAsNanAndSidesDiffer) {
  std::uint8_t front[kGuardBytes], back[kGuardBytes];
  fill_canary(front, GuardSide::front);
  fill_canary(back, GuardSide::back);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < kGuardBytes; ++i) {
    EXPECT_NE(front[i], 0x00);
    EXPECT_NE(back[i], 0x00);
    differ += front[i] != back[i];
  }
  EXPECT_EQ(differ, kGuardBytes);
  for (const std::uint8_t* g : {front, back}) {
    bool two_byte_poison_visible = true;  // every 2-byte window differs from the 0xFF poison
    for (std::size_t i = 0; i + 1 < kGuardBytes; ++i) two_byte_poison_visible &= !(g[i] == 0xFF && g[i + 1] == 0xFF);
    EXPECT_TRUE(two_byte_poison_visible);
    for (std::size_t i = 0; i + 2 <= kGuardBytes; i += 2) {
      EXPECT_TRUE(is_nan_f16(g + i)) << "f16 at " << i;
      EXPECT_TRUE(is_nan_bf16(g + i)) << "bf16 at " << i;
    }
    for (std::size_t i = 0; i + 4 <= kGuardBytes; i += 4) EXPECT_TRUE(is_nan_f32(g + i)) << "f32 at " << i;
  }
  EXPECT_EQ(first_overwritten(front, GuardSide::front), -1);
  EXPECT_EQ(first_overwritten(back, GuardSide::back), -1);
  EXPECT_EQ(first_overwritten(back, GuardSide::front), 0);  // one guard copied over the other
  EXPECT_EQ(kGuardBytes % 256, 0u);                         // payload keeps cudaMalloc's alignment
}

TEST(GpuHarnessCanary, EveryOverwrittenByteIsFound) {
  std::mt19937_64 rng(20261202);
  for (GuardSide side : {GuardSide::front, GuardSide::back}) {
    for (std::size_t i = 0; i < kGuardBytes; ++i) {
      std::uint8_t g[kGuardBytes];
      fill_canary(g, side);
      // Any other byte value, including the poison byte and zero.
      const std::uint8_t v = static_cast<std::uint8_t>(g[i] + 1 + rng() % 255);
      ASSERT_NE(v, g[i]);
      g[i] = v;
      EXPECT_EQ(first_overwritten(g, side), static_cast<long>(i));
      EXPECT_EQ(overwritten_count(g, side), 1u);
    }
    std::uint8_t g[kGuardBytes];
    fill_canary(g, side);
    for (std::size_t i = 10; i < 20; ++i) g[i] = 0xFF;  // a NaN-poison memset over ten bytes
    EXPECT_EQ(first_overwritten(g, side), 10);
    std::uint8_t intact[kGuardBytes];
    fill_canary(intact, side);
    std::size_t changed = 0;
    for (std::size_t i = 10; i < 20; ++i) changed += intact[i] != 0xFF;
    EXPECT_EQ(overwritten_count(g, side), changed);
    EXPECT_GE(changed, 5u);  // at least the five even bytes, never 0xFF
  }
}
