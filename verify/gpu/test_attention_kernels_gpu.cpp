// GPU suite (ctest label `gpu`): the kernel families against each other. The Hopper wgmma kernel
// bitwise against the generic mma.sync kernel (both also against the float64 oracle), and the
// float32 output stream (AttentionBuffers::o_out_float32, context parallelism's partials) against
// the dtype output of the same call on every family: Hopper, mma.sync, SIMT, and the split-KV
// merge. Without a GPU each GPU test skips.
#include "gpu_testing.hpp"
#include "orthros_testing.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <string>


using namespace orthros;
using namespace orthros::gputest;
using orthros::testing::Rng;

namespace {

// ---- the Hopper wgmma kernel against the generic mma.sync kernel --------------------------------
// Both are checked against the oracle by test_attention_gpu (ctest runs it per family); here the
// two families run the same calls side by side and must agree bitwise. They share the
// per-row arithmetic source (online_softmax_scores, flush_chunk_tile, store_tile_rows) and the
// 64-key tile order, and the tensor cores round wgmma and mma.sync sums alike on sm_90 (measured
// on the H200). The deterministic mode relies on it: under KernelPath::automatic decode launches
// run the generic 1-warp kernel and the others the Hopper kernel. Fast mode with a fixed split
// count (the automatic count depends on the kernel's row-block size).
// `scale`: a custom softmax scale (AttentionConfig::scale), else the default 1/sqrt(D).
template <typename S>
void hopper_vs_generic(const AttentionDims& d, Eigen::Index T, Eigen::Index P, Eigen::Index T_out, std::int64_t w,
                       bool det, std::uint64_t seed, std::optional<double> scale = std::nullopt) {
  SCOPED_TRACE(describe(d, T, P, T_out, w, det, 1, seed) + (scale ? " scale=" + std::to_string(*scale) : ""));
  Rng rng(seed);
  const auto in = make_case<S>(rng, d, T, P, T_out);
  cuda::AttentionConfig cfg;
  cfg.window = w;
  cfg.deterministic = det;
  cfg.num_splits = 1;
  cfg.scale = scale;
  cfg.kernel = cuda::KernelPath::hopper;
  const auto h = run_gpu1(in, d, cfg);
  cfg.kernel = cuda::KernelPath::generic;
  const auto g = run_gpu1(in, d, cfg);
  AttentionOptions opt;
  opt.window = w;
  opt.scale = scale;
  for (const auto* r : {&h, &g}) {
    const auto oc = check_vs_oracle<S>(in, *r, d, opt);
    EXPECT_TRUE(oc.pass) << (r == &h ? "hopper" : "generic") << "\n" << oc.report;
  }
  EXPECT_EQ(bitwise<S>(h.o, g.o, "o"), "");
  EXPECT_EQ(bitwise<S>(h.o_out, g.o_out, "o_out"), "");
  EXPECT_EQ(bitwise<float>(h.lse, g.lse, "lse"), "");
  EXPECT_EQ(bitwise<float>(h.lse_out, g.lse_out, "lse_out"), "");
}

// ---- the float32 output stream -----------------------------------------------------------------
// With o_out_float32 every kernel stores the normalized output stream before its one rounding to
// the dtype, so rounding it to the dtype (round to nearest even, as the kernels' epilogues) must
// give the dtype call's o_out bit for bit. A float32 element that was not written stays NaN (the
// buffer is poisoned), fails the finiteness check and rounds to a NaN unequal to any output. The
// dtype output itself is held to SPEC §6 by test_attention_gpu.
template <typename S>
void float32_output_stream(const AttentionDims& d, Eigen::Index T, Eigen::Index P, Eigen::Index T_out, std::int64_t w,
                           bool det, int splits, cuda::KernelPath path, std::uint64_t seed) {
  SCOPED_TRACE(describe(d, T, P, T_out, w, det, splits, seed) + (path == cuda::KernelPath::generic ? " generic" : ""));
  Rng rng(seed);
  const auto in = make_case<S>(rng, d, T, P, T_out);
  gpu_harness::AttentionCase c = upload_case<S>({in}, d, w, 37);
  cuda::AttentionConfig base;
  base.window = w;
  base.deterministic = det;
  base.num_splits = splits;
  base.kernel = path;
  const cuda::AttentionConfig cfg = c.config(base);
  c.forward(cfg);
  const Eigen::Index cols = Eigen::Index(d.num_q_heads) * d.head_dim;
  Mat<S> o_out(T_out, cols);
  gpu_harness::AttentionCase::download_rows(c.o_out, o_out, c.out_row(0));
  DeviceBuffer f32("o_out float32", std::size_t(T_out) * cols * sizeof(float));
  f32.poison();
  cuda::AttentionBuffers buf = c.forward_buffers();
  buf.o_out = f32.data();
  buf.o_out_float32 = true;
  cuda::attention_forward(cfg, c.layout(), buf);
  check_cuda(cudaDeviceSynchronize(), "attention_forward (o_out_float32)");
  gpu_harness::check_canaries({&f32, &c.o, &c.lse, &c.lse_out});
  Mat<float> got(T_out, cols);
  f32.download_into(got);
  EXPECT_TRUE(got.allFinite()) << "o_out float32 has a non-finite element";
  Mat<S> rounded = got.template cast<S>();  // Eigen's bfloat16/half casts round to nearest even
  EXPECT_EQ(bitwise<S>(rounded, o_out, "o_out rounded from float32"), "");
}

}  // namespace

TEST(GpuAttention, Float32OutputStreamMatchesTheRoundedOutput) {
  ORTHROS_REQUIRE_GPU();
  using K = cuda::KernelPath;
  std::uint64_t seed = 90;
  for (const K path : {K::automatic, K::generic}) {
    for (const bool det : {false, true}) {
      float32_output_stream<Eigen::bfloat16>(AttentionDims{8, 2, 128}, 300, 0, 300, 128, det, 1, path, seed++);  // PT
      float32_output_stream<Eigen::half>(AttentionDims{6, 2, 64}, 120, 40, 30, 64, det, 1, path, seed++);       // SFT
      float32_output_stream<Eigen::bfloat16>(AttentionDims{4, 1, 128}, 1, 3000, 1, 128, det, 0, path, seed++);  // decode, split
      float32_output_stream<Eigen::bfloat16>(AttentionDims{6, 3, 64}, 700, 0, 1, 128, det, 3, path, seed++);    // prefill, 3 splits
    }
  }
  // SIMT kernel: bf16/f16 at a head dim outside {64, 128}.
  float32_output_stream<Eigen::bfloat16>(AttentionDims{4, 2, 48}, 200, 10, 200, 64, false, 1, K::automatic, seed++);
  float32_output_stream<Eigen::half>(AttentionDims{4, 2, 96}, 1, 900, 1, 64, true, 0, K::automatic, seed++);
}

// Runs everywhere, GPU or not (CI has none): without a usable device hopper_kernels_available()
// answers false instead of throwing (cudaErrorNoDevice, cudaErrorInsufficientDriver); with one,
// it answers whether the device is compute capability 9.0, and never throws.
TEST(GpuAttention, HopperAvailabilityNeverThrows) {
  const bool usable = gputest::no_gpu_reason().empty();
  bool available = true;
  EXPECT_NO_THROW(available = cuda::hopper_kernels_available()) << gputest::no_gpu_reason();
  if (!usable) {
    EXPECT_FALSE(available) << "no usable GPU (" << gputest::no_gpu_reason() << ") but the Hopper kernel is available";
    return;
  }
  cudaDeviceProp prop{};
  int dev = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaGetDeviceProperties(&prop, dev), cudaSuccess);
  EXPECT_EQ(available, prop.major == 9 && prop.minor == 0) << prop.name << " sm_" << prop.major << prop.minor;
}

TEST(GpuAttention, HopperMatchesGeneric) {
  ORTHROS_REQUIRE_GPU();
  if (!cuda::hopper_kernels_available()) GTEST_SKIP() << "no sm_90 GPU: the Hopper kernel does not apply";
  hopper_vs_generic<Eigen::bfloat16>(AttentionDims{8, 2, 128}, 700, 0, 700, 128, false, 41);  // PT
  hopper_vs_generic<Eigen::bfloat16>(AttentionDims{8, 2, 128}, 700, 0, 700, 128, true, 42);
  hopper_vs_generic<Eigen::half>(AttentionDims{7, 1, 64}, 333, 50, 1, 40, false, 43);  // prefill, GQA 7
  hopper_vs_generic<Eigen::bfloat16>(AttentionDims{4, 1, 128}, 1, 3000, 1, 128, true, 44);  // decode
  hopper_vs_generic<Eigen::half>(AttentionDims{6, 2, 64}, 200, 0, 50, 1LL << 40, true, 45);  // SFT, full window
  hopper_vs_generic<Eigen::bfloat16>(AttentionDims{12, 4, 128}, 517, 300, 517, 200, false, 46);  // chunk + PT, GQA 3
  hopper_vs_generic<Eigen::bfloat16>(AttentionDims{4, 4, 64}, 1, 2000, 1, 64, false, 47);         // decode, MHA
  // Deterministic row blocks whose keys span several 1024-key chunks, merged inside the Hopper
  // kernel (its running output in shared memory between chunk merges). Base rows are never split:
  // with w >= T a base row of position t sees [0, t], up to 3 chunks at T = 2200 (first merge into
  // the empty state, a read-modify-write of the running output, the last merge in registers); PT
  // with w = 128 (base rows cross one boundary; the output rows of so small a launch go to the
  // split-KV chunks and merge_kernel); chunked prefill + SFT, GQA 3, D = 64.
  hopper_vs_generic<Eigen::bfloat16>(AttentionDims{8, 2, 128}, 2200, 0, 1, 1LL << 40, true, 50);
  hopper_vs_generic<Eigen::bfloat16>(AttentionDims{8, 2, 128}, 2200, 0, 2200, 128, true, 48);
  hopper_vs_generic<Eigen::half>(AttentionDims{6, 2, 64}, 900, 1500, 900, 300, true, 49);
}

// The Hopper kernel against the generic kernel, bitwise, around the 64-key tile: windows 1, 64,
// 65, 127-130, 200; GQA groups whose 192-row blocks hold 192, 48, 27.4 and 24 tokens; cache
// prefixes that shift the blocks against the tiles; prefill, PT and SFT. Launches with more block
// indices than a quarter-grid (PT T = 900 here: 38 indices in bands of 19; prefill 8K: bands of 33,
// the last one padded) deal their items in several bands (launch_hopper_forward); the ctest run
// with the suffix .band7 forces bands of 7 on every launch.
TEST(GpuAttention, HopperWindowsAndGroupsMatchGeneric) {
  ORTHROS_REQUIRE_GPU();
  if (!cuda::hopper_kernels_available()) GTEST_SKIP() << "no sm_90 GPU: the Hopper kernel does not apply";
  std::uint64_t seed = 60;
  for (const std::int64_t w : {1, 64, 65, 127, 128, 129, 130, 200}) {
    hopper_vs_generic<Eigen::bfloat16>(AttentionDims{4, 4, 64}, 1100, 0, 1, w, false, seed++);      // group 1
    hopper_vs_generic<Eigen::half>(AttentionDims{8, 2, 128}, 900, 77, 900, w, false, seed++);       // group 4, PT
    hopper_vs_generic<Eigen::bfloat16>(AttentionDims{14, 2, 64}, 700, 300, 1, w, false, seed++);    // group 7
    hopper_vs_generic<Eigen::bfloat16>(AttentionDims{16, 2, 128}, 640, 13, 160, w, false, seed++);  // group 8, SFT
  }
  hopper_vs_generic<Eigen::bfloat16>(AttentionDims{32, 8, 128}, 8192, 0, 1, 128, false, seed++);  // prefill 8K
}


// A custom softmax scale: positive, negative and zero. The exponent's form depends on its sign
// (online_softmax_scores: one FMA on the keys of rows that a thread holds in full when the scale is
// positive; scale, round, then subtract otherwise), so each form is checked against the oracle
// and bitwise between the families, in both modes and in the regimes that take the masked path
// (prefill windows, decode) and the full-tile one (PT).
TEST(GpuAttention, CustomScalesMatchGenericAndOracle) {
  ORTHROS_REQUIRE_GPU();
  if (!cuda::hopper_kernels_available()) GTEST_SKIP() << "no sm_90 GPU: the Hopper kernel does not apply";
  std::uint64_t seed = 70;
  for (const double scale : {0.3, -0.09, 0.0}) {
    for (const bool det : {false, true}) {
      hopper_vs_generic<Eigen::bfloat16>(AttentionDims{8, 2, 128}, 700, 0, 700, 128, det, seed++, scale);  // PT
      hopper_vs_generic<Eigen::half>(AttentionDims{7, 1, 64}, 333, 50, 1, 40, det, seed++, scale);  // prefill, GQA 7
    }
    hopper_vs_generic<Eigen::bfloat16>(AttentionDims{4, 1, 128}, 1, 3000, 1, 128, true, seed++, scale);  // decode
  }
}
