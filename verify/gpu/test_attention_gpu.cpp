// GPU suite (ctest label `gpu`): the CUDA Orthros attention kernels against the float64 oracle
// under SPEC §6, bitwise regime agreement in deterministic mode, ragged batches, the SPEC §8
// pitfalls, RoPE + KV-cache append, argument validation. Without a GPU each GPU test skips.
#include "gpu_testing.hpp"
#include "orthros/rope.hpp"
#include "orthros_testing.hpp"

#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <cmath>
#include <random>

using namespace orthros;
using namespace orthros::gputest;
using orthros::testing::random_mat;
using orthros::testing::Rng;

namespace {

// Property: random shapes of the supported set, one dtype, both SPEC §6 criteria on o, o_out, lse, lse_out.
template <typename S>
void oracle_property(bool small_d) {
  const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
  AttentionDims d;
  const int ratio = *rc::gen::element(1, 2, 3, 7);
  d.num_kv_heads = *rc::gen::inRange(1, 3);
  d.num_q_heads = ratio * d.num_kv_heads;
  d.head_dim = small_d ? *rc::gen::element(16, 32, 48) : *rc::gen::element(64, 128);
  const Eigen::Index T = *rc::gen::inRange(1, 150);
  const Eigen::Index P = *rc::gen::element<Eigen::Index>(0, 0, *rc::gen::inRange(1, 400));
  const Eigen::Index T_out = *rc::gen::element<Eigen::Index>(0, 1, T, *rc::gen::inRange<Eigen::Index>(0, T + 1));
  const int wk = *rc::gen::inRange(0, 4);
  const std::int64_t w = wk == 0 ? 1 : wk == 3 ? std::int64_t(1) << 40 : *rc::gen::inRange<std::int64_t>(1, P + T + 3);
  const bool det = *rc::gen::arbitrary<bool>();
  const int splits = *rc::gen::element(0, 0, 1, 3, 16);
  cuda::AttentionConfig cfg;
  cfg.window = w;
  cfg.deterministic = det;
  cfg.num_splits = splits;
  RC_TAG(dtype_name<S>());
  Rng rng(seed);
  const auto in = make_case<S>(rng, d, T, P, T_out);
  const auto got = run_gpu1<S>(in, d, cfg);
  AttentionOptions opt;
  opt.window = w;
  const auto oc = check_vs_oracle<S>(in, got, d, opt);
  if (!oc.pass) RC_FAIL(describe(d, T, P, T_out, w, det, splits, seed) + "\n" + oc.report);
}

}  // namespace

// ---- SPEC §6 against the float64 oracle, random shapes ----------------------------------------
TEST(GpuAttention, OracleBf16Property) {
  ORTHROS_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("bf16 kernel vs oracle (SPEC §6)", [] { oracle_property<Eigen::bfloat16>(false); }));
}
TEST(GpuAttention, OracleF16Property) {
  ORTHROS_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("f16 kernel vs oracle (SPEC §6)", [] { oracle_property<Eigen::half>(false); }));
}
TEST(GpuAttention, OracleF32Property) {
  ORTHROS_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("f32 kernel vs oracle (SPEC §6)", [] { oracle_property<float>(false); }));
}
TEST(GpuAttention, OracleSmallHeadDimProperty) {
  ORTHROS_REQUIRE_GPU();
  EXPECT_TRUE(rc::check("SIMT kernel (D in {16,32,48}) bf16 vs oracle", [] { oracle_property<Eigen::bfloat16>(true); }));
  EXPECT_TRUE(rc::check("SIMT kernel (D in {16,32,48}) f32 vs oracle", [] { oracle_property<float>(true); }));
}

// ---- SPEC §8: split-KV decode over 4096 keys, GQA 2:1, D = 128, splits {1, 3, 16, 32} ----------
template <typename S>
void split_counts_case() {
  const std::uint64_t seed = 4096 + sizeof(S);
  SCOPED_TRACE("seed=" + std::to_string(seed) + " dtype=" + dtype_name<S>());
  Rng rng(seed);
  AttentionDims d{4, 2, 128};
  const auto in = make_case<S>(rng, d, 1, 4095, 1);
  AttentionOptions opt;
  opt.window = 128;
  for (int splits : {1, 3, 16, 32}) {
    cuda::AttentionConfig cfg;
    cfg.window = 128;
    cfg.num_splits = splits;
    const auto got = run_gpu1<S>(in, d, cfg);
    const auto oc = check_vs_oracle<S>(in, got, d, opt);
    EXPECT_TRUE(oc.pass) << "splits=" << splits << "\n" << oc.report;
  }
}
TEST(GpuAttention, DecodeSplitCounts4096) {
  ORTHROS_REQUIRE_GPU();
  split_counts_case<Eigen::bfloat16>();
  split_counts_case<Eigen::half>();
  split_counts_case<float>();
}

// ---- GQA ratios 1, 2, 3, 7 (28 query / 4 KV heads), prefill with P > 0 -------------------------
TEST(GpuAttention, GqaRatios) {
  ORTHROS_REQUIRE_GPU();
  for (auto [hq, hkv] : {std::pair{4, 4}, {8, 4}, {12, 4}, {28, 4}}) {
    const std::uint64_t seed = 700 + hq;
    SCOPED_TRACE("seed=" + std::to_string(seed) + " H_q=" + std::to_string(hq));
    Rng rng(seed);
    AttentionDims d{hq, hkv, 128};
    const auto in = make_case<Eigen::bfloat16>(rng, d, 77, 130, 5);
    cuda::AttentionConfig cfg;
    cfg.window = 50;
    AttentionOptions opt;
    opt.window = 50;
    const auto oc = check_vs_oracle(in, run_gpu1(in, d, cfg), d, opt);
    EXPECT_TRUE(oc.pass) << oc.report;
  }
}

// ---- large-magnitude logits (scores ~ +-1e4) stay finite and correct ---------------------------
TEST(GpuAttention, LargeLogits) {
  ORTHROS_REQUIRE_GPU();
  const std::uint64_t seed = 1e4;
  SCOPED_TRACE("seed=" + std::to_string(seed));
  Rng rng(seed);
  AttentionDims d{2, 1, 64};
  // |q.k| * s up to ~ 64 * 40 * 40 / 8 = 1.3e4
  const auto in = make_case<Eigen::half>(rng, d, 90, 40, 90, 40.0);
  cuda::AttentionConfig cfg;
  cfg.window = 16;
  AttentionOptions opt;
  opt.window = 16;
  const auto got = run_gpu1(in, d, cfg);
  const auto oc = check_vs_oracle(in, got, d, opt);
  EXPECT_TRUE(oc.pass) << oc.report;
}

// ---- w = 1: o_t = v_t exactly (no oracle needed) -----------------------------------------------
template <typename S>
void window_one_case() {
  const std::uint64_t seed = 11;
  SCOPED_TRACE(std::string("seed=11 dtype=") + dtype_name<S>());
  Rng rng(seed);
  AttentionDims d{6, 2, 64};
  const auto in = make_case<S>(rng, d, 70, 9, 3);
  cuda::AttentionConfig cfg;
  cfg.window = 1;
  const auto got = run_gpu1(in, d, cfg);
  Mat<S> expect(in.q.rows(), d.num_q_heads * d.head_dim);
  for (Eigen::Index t = 0; t < in.q.rows(); ++t)
    for (int h = 0; h < d.num_q_heads; ++h)
      expect.row(t).segment(h * 64, 64) = in.v.row(9 + t).segment((h / 3) * 64, 64);
  EXPECT_EQ(bitwise(got.o, expect, "o vs v_t"), "");
}
TEST(GpuAttention, WindowOneReturnsValue) {
  ORTHROS_REQUIRE_GPU();
  window_one_case<Eigen::bfloat16>();
  window_one_case<Eigen::half>();
  window_one_case<float>();
}

// ---- w >= T: with q_out = q the two streams are the same function (bitwise, same launch) -------
TEST(GpuAttention, WideWindowEqualsOutputStream) {
  ORTHROS_REQUIRE_GPU();
  Rng rng(21);
  SCOPED_TRACE("seed=21");
  AttentionDims d{4, 2, 128};
  auto in = make_case<Eigen::bfloat16>(rng, d, 200, 0, 200);
  in.q_out = in.q;
  for (std::int64_t w : {200, 1000}) {
    cuda::AttentionConfig cfg;
    cfg.window = w;
    const auto got = run_gpu1(in, d, cfg);
    EXPECT_EQ(bitwise(got.o, got.o_out, "o vs o_out, w=" + std::to_string(w)), "");
    EXPECT_EQ(bitwise(got.lse, got.lse_out, "lse vs lse_out"), "");
  }
}

// ---- window off by one (SPEC §8): T = 8, w = 4 -------------------------------------------------
TEST(GpuAttention, WindowBoundary) {
  ORTHROS_REQUIRE_GPU();
  Rng rng(8);
  SCOPED_TRACE("seed=8");
  AttentionDims d{1, 1, 64};
  const auto in = make_case<float>(rng, d, 8, 0, 0);
  cuda::AttentionConfig cfg;
  cfg.window = 4;
  const auto base = run_gpu1(in, d, cfg);
  const Eigen::Index t = 6;  // 0-based row; window keys are rows 3..6
  auto outside = in;
  outside.k.row(t - 4).array() += 0.5f;  // k_{t-w}: must not matter
  outside.v.row(t - 4).array() += 0.5f;
  auto inside = in;
  inside.k.row(t - 3).array() += 0.5f;  // k_{t-w+1}: must matter
  const auto a = run_gpu1(outside, d, cfg), b = run_gpu1(inside, d, cfg);
  EXPECT_EQ(bitwise<float>(a.o.row(t), base.o.row(t), "o_t after changing k_{t-w}"), "");
  EXPECT_NE(bitwise<float>(b.o.row(t), base.o.row(t), "o_t after changing k_{t-w+1}"), "");
}

// ---- deterministic mode: every regime gives the same bits at every position --------------------
template <typename S>
void regimes_bitwise(const AttentionDims& d, Eigen::Index N, std::int64_t w, std::uint64_t seed) {
  SCOPED_TRACE("seed=" + std::to_string(seed) + " dtype=" + dtype_name<S>() + " N=" + std::to_string(N) +
               " D=" + std::to_string(d.head_dim));
  Rng rng(seed);
  const auto full = make_case<S>(rng, d, N, 0, N);
  cuda::AttentionConfig cfg;
  cfg.window = w;
  cfg.deterministic = true;
  const auto pt = run_gpu1(full, d, cfg);
  // Slice helper: tokens [a, b) as a call with P = a, T_out = number of output rows at the end.
  auto slice = [&](Eigen::Index a, Eigen::Index b, Eigen::Index t_out) {
    SeqIn<S> s;
    s.q = full.q.middleRows(a, b - a);
    s.k = full.k.topRows(b);
    s.v = full.v.topRows(b);
    s.q_out = full.q_out.middleRows(b - t_out, t_out);
    return s;
  };
  auto expect_rows = [&](const SeqOut<S>& r, Eigen::Index a, Eigen::Index b, Eigen::Index t_out,
                         const std::string& what) {
    EXPECT_EQ(bitwise<S>(r.o, pt.o.middleRows(a, b - a), what + " o"), "");
    EXPECT_EQ(bitwise<float>(r.lse, pt.lse.middleRows(a, b - a), what + " lse"), "");
    EXPECT_EQ(bitwise<S>(r.o_out, pt.o_out.middleRows(b - t_out, t_out), what + " o_out"), "");
    EXPECT_EQ(bitwise<float>(r.lse_out, pt.lse_out.middleRows(b - t_out, t_out), what + " lse_out"), "");
  };
  // SFT: response = last third.
  expect_rows(run_gpu1(slice(0, N, N / 3), d, cfg), 0, N, N / 3, "SFT");
  // Prefill of 1..N.
  expect_rows(run_gpu1(slice(0, N, 1), d, cfg), 0, N, 1, "prefill");
  // Chunked prefill: uneven chunks; every chunk but the last has T_out = 0 except one with 2.
  {
    const Eigen::Index cuts[] = {0, 131, 1100, N - 7, N};
    for (int c = 0; c + 1 < 5; ++c) {
      const Eigen::Index a = cuts[c], b = cuts[c + 1];
      if (b <= a) continue;
      const Eigen::Index t_out = (c == 3) ? 1 : (c == 1 ? 2 : 0);
      expect_rows(run_gpu1(slice(a, b, t_out), d, cfg), a, b, t_out, "chunk " + std::to_string(c));
    }
  }
  // Decode steps at the last positions, one at a time and as a ragged batch of decodes.
  std::vector<SeqIn<S>> batch;
  for (Eigen::Index t : {N - 3, N - 2, N - 1}) {
    const auto s = slice(t, t + 1, 1);
    expect_rows(run_gpu1(s, d, cfg), t, t + 1, 1, "decode t=" + std::to_string(t));
    batch.push_back(s);
  }
  const auto rb = run_gpu<S>(batch, d, cfg);
  for (size_t i = 0; i < rb.size(); ++i)
    expect_rows(rb[i], N - 3 + i, N - 2 + i, 1, "ragged decode " + std::to_string(i));
}
TEST(GpuAttention, DeterministicRegimesBitwise) {
  ORTHROS_REQUIRE_GPU();
  regimes_bitwise<Eigen::bfloat16>(AttentionDims{8, 2, 128}, 2600, 128, 31);
  regimes_bitwise<Eigen::half>(AttentionDims{3, 1, 64}, 2300, 300, 32);
  regimes_bitwise<float>(AttentionDims{4, 2, 64}, 2100, 128, 33);
  regimes_bitwise<Eigen::bfloat16>(AttentionDims{4, 2, 16}, 1500, 8, 34);
}

// ---- ragged batches vs one sequence at a time ---------------------------------------------------
template <typename S>
void ragged_case(bool det, std::uint64_t seed) {
  SCOPED_TRACE("seed=" + std::to_string(seed) + " det=" + std::to_string(det) + " dtype=" + dtype_name<S>());
  Rng rng(seed);
  AttentionDims d{6, 2, 128};
  std::vector<SeqIn<S>> seqs;
  // (T, P, T_out): prefill, decode, chunk, PT, SFT, idle-ish short, long decode
  const std::tuple<int, int, int> shapes[] = {{300, 0, 1}, {1, 900, 1}, {65, 200, 0}, {100, 0, 100},
                                              {50, 0, 20}, {1, 0, 1},   {1, 3000, 1}};
  for (auto [T, P, To] : shapes) seqs.push_back(make_case<S>(rng, d, T, P, To));
  cuda::AttentionConfig cfg;
  cfg.window = 64;
  cfg.deterministic = det;
  if (!det) cfg.num_splits = 1;  // fixed split => per-row arithmetic independent of the batch
  const auto all = run_gpu<S>(seqs, d, cfg);
  AttentionOptions opt;
  opt.window = 64;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto one = run_gpu1(seqs[i], d, cfg);
    EXPECT_EQ(bitwise<S>(all[i].o, one.o, "seq " + std::to_string(i) + " o"), "");
    EXPECT_EQ(bitwise<S>(all[i].o_out, one.o_out, "seq " + std::to_string(i) + " o_out"), "");
    const auto oc = check_vs_oracle(seqs[i], all[i], d, opt);
    EXPECT_TRUE(oc.pass) << "seq " << i << "\n" << oc.report;
  }
  // Automatic splitting (fast mode) on the batch: within tolerance of the oracle.
  if (!det) {
    cfg.num_splits = 0;
    const auto auto_split = run_gpu<S>(seqs, d, cfg);
    for (size_t i = 0; i < seqs.size(); ++i) {
      const auto oc = check_vs_oracle(seqs[i], auto_split[i], d, opt);
      EXPECT_TRUE(oc.pass) << "auto split, seq " << i << "\n" << oc.report;
    }
  }
}
TEST(GpuAttention, RaggedBatchMatchesSingleSequences) {
  ORTHROS_REQUIRE_GPU();
  ragged_case<Eigen::bfloat16>(false, 51);
  ragged_case<Eigen::bfloat16>(true, 52);
  ragged_case<float>(false, 53);
}

// ---- RoPE + KV-cache append ---------------------------------------------------------------------
template <typename S>
void rope_append_case() {
  const std::uint64_t seed = 61;
  SCOPED_TRACE(std::string("seed=61 dtype=") + dtype_name<S>());
  Rng rng(seed);
  const int Hq = 4, Hkv = 2, D = 64, T = 5, P = 7, To = 2, cap = 20;
  const double theta = 1e4;
  const auto q = random_mat<S>(T, Hq * D, rng), kn = random_mat<S>(T, Hkv * D, rng),
             vn = random_mat<S>(T, Hkv * D, rng), qo = random_mat<S>(To, Hq * D, rng);
  const size_t es = sizeof(S);
  DeviceBuffer dq("dq", q.size() * es), dk("dk", kn.size() * es), dv("dv", vn.size() * es), dqo("dqo", qo.size() * es);
  DeviceBuffer kc("kc", cap * Hkv * D * es), vc("vc", cap * Hkv * D * es);
  dq.upload(q.data(), q.size() * es);
  dk.upload(kn.data(), kn.size() * es);
  dv.upload(vn.data(), vn.size() * es);
  dqo.upload(qo.data(), qo.size() * es);
  cuda::rope_append_kv(dtype_of<S>(), cuda::BatchLayout::single(T, P, To), Hq, Hkv, D, dk.data(), dv.data(), kc.data(),
                       vc.data(), cap, theta, 0, dq.data(), dqo.data());
  check_cuda(cudaDeviceSynchronize(), "sync");
  gpu_harness::check_canaries({&dq, &dk, &dv, &dqo, &kc, &vc});
  Mat<S> kc_h(cap, Hkv * D), vc_h(cap, Hkv * D), q_h(T, Hq * D), qo_h(To, Hq * D);
  kc.download(kc_h.data(), kc_h.size() * es);
  vc.download(vc_h.data(), vc_h.size() * es);
  dq.download(q_h.data(), q_h.size() * es);
  dqo.download(qo_h.data(), qo_h.size() * es);
  // float64 rotate-half reference, then one rounding to S; the kernel rotates in float32,
  // so allow 2 ulp of S (relative 2^-7 for bf16, 2^-10 f16, 2^-23 f32 per ulp) plus 1e-6.
  const double ulp = std::is_same_v<S, float> ? std::ldexp(1.0, -23)
                     : std::is_same_v<S, Eigen::half> ? std::ldexp(1.0, -10)
                                                       : std::ldexp(1.0, -7);
  auto check_rot = [&](const Mat<S>& src, const Mat<S>& got, Eigen::Index src_row, Eigen::Index got_row, int H,
                       double pos, const char* what) {
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < D / 2; ++i) {
        const double a = pos * std::pow(theta, -2.0 * i / D);
        const double x1 = double(src(src_row, h * D + i)), x2 = double(src(src_row, h * D + i + D / 2));
        const double e1 = x1 * std::cos(a) - x2 * std::sin(a), e2 = x2 * std::cos(a) + x1 * std::sin(a);
        const double g1 = double(got(got_row, h * D + i)), g2 = double(got(got_row, h * D + i + D / 2));
        EXPECT_NEAR(g1, e1, 2 * ulp * (std::abs(e1) + 2) + 1e-6) << what << " pos=" << pos << " h=" << h << " i=" << i;
        EXPECT_NEAR(g2, e2, 2 * ulp * (std::abs(e2) + 2) + 1e-6) << what << " pos=" << pos << " h=" << h << " i=" << i;
      }
  };
  for (int i = 0; i < T; ++i) {
    check_rot(kn, kc_h, i, P + i, Hkv, P + i, "k");
    check_rot(q, q_h, i, i, Hq, P + i, "q");
    EXPECT_EQ(bitwise<S>(vc_h.row(P + i), vn.row(i), "v copied"), "");
  }
  for (int j = 0; j < To; ++j) check_rot(qo, qo_h, j, j, Hq, P + T - To + j, "q_out");
  // Rows outside [P, P+T) untouched (still the NaN poison).
  for (int r : {0, P - 1, P + T}) EXPECT_TRUE(std::isnan(double(vc_h(r, 0)))) << "row " << r;
}
TEST(GpuRope, RopeAppendMatchesFloat64) {
  ORTHROS_REQUIRE_GPU();
  rope_append_case<Eigen::bfloat16>();
  rope_append_case<Eigen::half>();
  rope_append_case<float>();
}

// ---- apply_rope vs the CPU reference (orthros::apply_rope), large positions --------------------
template <typename S>
void apply_rope_case() {
  const std::uint64_t seed = 71;
  SCOPED_TRACE(std::string("seed=71 dtype=") + dtype_name<S>());
  Rng rng(seed);
  const int N = 40, H = 3, D = 64;
  const double theta = 1e6;
  const auto x = random_mat<S>(N, H * D, rng);
  std::vector<std::int64_t> pos(N);
  std::uniform_int_distribution<std::int64_t> pd(0, 200000);
  for (auto& p : pos) p = pd(rng);
  const size_t es = sizeof(S);
  DeviceBuffer dx("dx", x.size() * es), dp("dp", N * sizeof(std::int64_t));
  dx.upload(x.data(), x.size() * es);
  dp.upload(pos.data(), N * sizeof(std::int64_t));
  cuda::apply_rope(dtype_of<S>(), dx.data(), static_cast<const std::int64_t*>(dp.data()), N, H, D, theta);
  check_cuda(cudaDeviceSynchronize(), "sync");
  gpu_harness::check_canaries({&dx, &dp});
  Mat<S> got(N, H * D);
  dx.download(got.data(), got.size() * es);
  Mat<S> ref = x;
  for (int n = 0; n < N; ++n)
    for (int h = 0; h < H; ++h) orthros::apply_rope<S>(ref.data() + n * H * D + h * D, D, pos[n], theta);
  // Same formula and rounding steps as the reference; the device libm (pow/cos/sin in float64)
  // may differ in the last float64 bit, which can move a result by at most one ulp of S.
  const double eps = std::is_same_v<S, float> ? std::ldexp(1.0, -23)
                     : std::is_same_v<S, Eigen::half> ? std::ldexp(1.0, -10)
                                                       : std::ldexp(1.0, -7);
  int same = 0;
  for (Eigen::Index i = 0; i < got.size(); ++i) {
    const double g = double(got.data()[i]), r = double(ref.data()[i]);
    same += std::memcmp(&got.data()[i], &ref.data()[i], sizeof(S)) == 0;
    EXPECT_LE(std::abs(g - r), eps * std::abs(r) + 1e-30) << "element " << i << " pos " << pos[i / (H * D)];
  }
  std::printf("apply_rope %s: %d of %lld elements bitwise equal to the CPU reference\n", dtype_name<S>(), same,
              static_cast<long long>(got.size()));
}
TEST(GpuRope, ApplyRopeMatchesReference) {
  ORTHROS_REQUIRE_GPU();
  apply_rope_case<Eigen::bfloat16>();
  apply_rope_case<Eigen::half>();
  apply_rope_case<float>();
}

// ---- a ragged batch larger than one launch's sequence table (48) -------------------------------
TEST(GpuAttention, RaggedBatchOver48Sequences) {
  ORTHROS_REQUIRE_GPU();
  const std::uint64_t seed = 81;
  SCOPED_TRACE("seed=81");
  Rng rng(seed);
  AttentionDims d{8, 2, 64};
  std::vector<SeqIn<Eigen::bfloat16>> seqs;
  std::uniform_int_distribution<int> pdist(0, 1500), tdist(1, 40);
  for (int i = 0; i < 53; ++i) {
    const bool decode = i % 3 != 0;
    const int T = decode ? 1 : tdist(rng), P = pdist(rng), To = decode ? 1 : (i % 2);
    seqs.push_back(make_case<Eigen::bfloat16>(rng, d, T, P, To));
  }
  AttentionOptions opt;
  opt.window = 100;
  for (int mode = 0; mode < 2; ++mode) {
    cuda::AttentionConfig cfg;
    cfg.window = 100;
    cfg.deterministic = mode == 1;
    if (mode == 0) cfg.num_splits = 1;
    const auto all = run_gpu<Eigen::bfloat16>(seqs, d, cfg);
    for (size_t i = 0; i < seqs.size(); ++i) {
      const auto one = run_gpu1(seqs[i], d, cfg);
      EXPECT_EQ(bitwise(all[i].o, one.o, "mode " + std::to_string(mode) + " seq " + std::to_string(i) + " o"), "");
      EXPECT_EQ(bitwise(all[i].o_out, one.o_out, "mode " + std::to_string(mode) + " seq " + std::to_string(i) + " o_out"),
                "");
      if (i % 5 == 0) {
        const auto oc = check_vs_oracle(seqs[i], all[i], d, opt);
        EXPECT_TRUE(oc.pass) << "seq " << i << "\n" << oc.report;
      }
    }
  }
  // KV append over the same 53 sequences (theta = 0: plain copy) lands in the right rows.
  const int Hkv = 2, D = 64, cap = 1600;
  cuda::BatchLayout lay;
  Eigen::Index tot = 0;
  for (auto& s : seqs) {
    lay.q_lens.push_back(static_cast<int>(s.q.rows()));
    lay.out_lens.push_back(static_cast<int>(s.q_out.rows()));
    lay.cache_lens.push_back(s.k.rows());
    tot += s.q.rows();
  }
  Mat<Eigen::bfloat16> knew(tot, Hkv * D);
  Eigen::Index r = 0;
  for (auto& s : seqs)
    for (Eigen::Index i = 0; i < s.q.rows(); ++i) knew.row(r++) = s.k.row(s.k.rows() - s.q.rows() + i);
  DeviceBuffer dk("dk", knew.size() * 2), kc("kc", seqs.size() * cap * Hkv * D * 2),
      vc("vc", seqs.size() * cap * Hkv * D * 2);
  dk.upload(knew.data(), knew.size() * 2);
  cuda::rope_append_kv(cuda::DType::bf16, lay, 8, Hkv, D, dk.data(), dk.data(), kc.data(), vc.data(), cap, 0.0, 0,
                       nullptr, nullptr);
  check_cuda(cudaDeviceSynchronize(), "sync");
  gpu_harness::check_canaries({&dk, &kc, &vc});
  for (size_t b = 0; b < seqs.size(); ++b) {
    const auto& s = seqs[b];
    Mat<Eigen::bfloat16> rows(s.q.rows(), Hkv * D);
    kc.download(rows.data(), rows.size() * 2, (b * cap + (s.k.rows() - s.q.rows())) * Hkv * D * 2);
    EXPECT_EQ(bitwise<Eigen::bfloat16>(rows, s.k.bottomRows(s.q.rows()), "appended rows of seq " + std::to_string(b)),
              "");
  }
}

// ---- argument validation (host only: runs with or without a GPU) -------------------------------
TEST(GpuAttentionArgs, BadArgumentsThrowBeforeLaunch) {
  cuda::AttentionConfig c;
  c.num_q_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 128;
  cuda::AttentionBuffers b;
  auto lay = cuda::BatchLayout::single(4, 0, 1);
  auto expect_err = [&](const cuda::AttentionConfig& cc, const cuda::BatchLayout& l, const cuda::AttentionBuffers& bb,
                        const std::string& needle) {
    try {
      cuda::attention_forward(cc, l, bb);
      ADD_FAILURE() << "no exception; expected one mentioning '" << needle << "'";
    } catch (const orthros::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto c2 = c;
  c2.window = 0;
  expect_err(c2, lay, b, "window");
  c2 = c;
  c2.num_kv_heads = 3;
  expect_err(c2, lay, b, "H_q % H_kv");
  c2 = c;
  c2.head_dim = 100;
  expect_err(c2, lay, b, "head_dim");
  c2 = c;
  c2.scale = std::nan("");
  expect_err(c2, lay, b, "scale");
  c2 = c;
  c2.kernel = cuda::KernelPath::hopper;
  c2.dtype = cuda::DType::f32;
  expect_err(c2, lay, b, "kernel = hopper needs dtype bf16/f16");
  expect_err(c, cuda::BatchLayout::single(4, 0, 5), b, "T_out");
  expect_err(c, cuda::BatchLayout{{4}, {1}, {3}}, b, "cache_lens");
  b.capacity = 2;
  expect_err(c, lay, b, "capacity");
  b.capacity = 10;
  expect_err(c, lay, b, "q must not be null");
  EXPECT_THROW(cuda::apply_rope(cuda::DType::bf16, nullptr, nullptr, 3, 1, 7, 1e4), orthros::Error);
}
