// The tile configuration of every kernel: tile sizes, pipeline stages, warps and register splits
// are chosen here, each with its reason. Kernels and their host launches read these names; the
// shared-memory layouts that these sizes carve are the structs beside each kernel (its launch
// takes sizeof of the struct).
#pragma once

#include "orthros/cuda/attention.hpp"

namespace orthros::cuda::detail {

// ---- keys per KV tile --------------------------------------------------------------------------
/// Keys per KV tile of every tensor-core kernel (mma.sync and wgmma forward, both backward
/// kernels). 64 keys keep the window stream's tiles per row block low (a w = 128 window of a
/// 192-row block touches 3-4 tiles), are one 128-byte-swizzled TMA box of bf16/f16 at D = 64, and
/// are the same in every kernel so that the deterministic chunks (kDeterministicChunk keys) hold a
/// whole number of tiles and every kernel merges the same chunks: per row the result depends
/// only on its key range and these absolute tile boundaries.
constexpr int kKeyTile = 64;
static_assert(kDeterministicChunk % kKeyTile == 0, "a deterministic chunk is a whole number of tiles");

/// Keys per tile of the SIMT kernels (f32 and other head dims): one key per lane of a warp.
constexpr int kSimtKeyTile = 32;
static_assert(kKeyTile % kSimtKeyTile == 0, "the SIMT tile divides the tensor-core tile");

// ---- SIMT forward (forward/simt_kernel.cuh) -----------------------------------------------------
/// One warp per row, 4 rows per CTA; lane j accumulates output dims j, j + 32, ... (D <= 256).
constexpr int kSimtWarps = 4, kSimtBN = kSimtKeyTile, kSimtMaxDpl = 8;

// ---- mma.sync forward (forward/mma_kernel.cuh; variants chosen in forward/attention.cu) ----------
/// K/V ring depth of the mma.sync forward: 2 stages (one tile computes while the next loads).
/// Decode-like launches (<= 16 rows per sequence) use 1 warp (68 KB of shared memory at D = 128,
/// 3 CTAs per SM); a 3-deep ring leaves 2 CTAs per SM. Otherwise 4 warps with 2 m16 tiles per
/// warp in the fast mode (the B fragments of K/V serve two m tiles) and 1 in the deterministic
/// mode (its running chunk state needs the registers).
constexpr int kMmaStages = 2;
constexpr int kMmaDecodeWarps = 1, kMmaWarps = 4;
constexpr int kMmaTilesFast = 2, kMmaTilesDet = 1;

// ---- wgmma forward (forward/attention_hopper.cu) -------------------------------------------------
/// Query rows per consumer warpgroup (one wgmma m64 tile).
constexpr int kHopperWarpgroupRows = 64;
/// Consumer warpgroups per CTA: 3 (192 rows) in both modes.
constexpr int kHopperConsumers = 3;
/// Fast mode: a 4-stage K/V ring and Q double-buffered (the next item's Q loads while this one
/// runs: window items are only 3-4 tiles long); with NWG = 3 this fills the 227 KB of shared
/// memory at one CTA per SM. Deterministic mode: the fp32 running output of every row (96 KB at
/// D = 128) takes the room of the second Q buffer and two stages.
template <bool DET>
struct HopperStages {
  static constexpr int STAGES = DET ? 2 : 4;
  static constexpr int QBUF = DET ? 1 : 2;
};
/// Order of the persistent kernel's work items (forward/attention_hopper.cu, split_item, launch_variant):
/// bands of ceil(grid / kHopperBandsPerRound) block indices, band-major, then KV head, dealt to the
/// CTAs in snake rounds of 4 bands each. x fastest per KV head (one band per head) makes the item
/// costs a saw tooth of period gx (the output stream's blocks run longest first) that the snake
/// cannot even when gx is a few grids long: PT 8K (gx = 2.6 grids) measured 1.25 ms that way and
/// 1.12 ms in bands on an H100. Bands spread a round over 4-5 KV heads instead of 1-2; at PT 32K,
/// where one head's K/V is 16.8 MB, the two orders measured the same (16.84 / 16.81 ms, the mean of
/// 4 / 6 medians), so L2 locality did not lose. bench/results/2026-12-06-fwd-order.md.
constexpr int kHopperBandsPerRound = 4;
/// Register split of the warp-specialized kernel (setmaxnreg): the producer warpgroup (one warp of
/// it loads) keeps 24 registers per thread and gives the rest to the consumers' accumulators:
/// 24 + NWG * 160 per thread slot fits the 64K-register file at NWG = 3.
constexpr int kHopperProducerRegs = 24, kHopperConsumerRegs = 160;
static_assert(kHopperProducerRegs * 128 + kHopperConsumerRegs * 128 * kHopperConsumers <= 65536, "register file");

// ---- backward (backward/*.cuh) ----------------------------------------------------------------
/// Tensor-core dq: 4 warps x 16 rows, KV tiles of kKeyTile keys in a 2-deep cp.async ring (the
/// forward's decomposition).
constexpr int kBwdDqBM = 64, kBwdBN = kKeyTile, kBwdDqStages = 2;
/// Tensor-core dk/dv: 4 warps x 16 keys = one kKeyTile block of keys per CTA; rows per step BQ:
/// S^T and dP^T are 16 x BQ fp32 per warp, so BQ = 64 at D = 64 and 32 at D = 128 (registers).
template <int D>
struct BwdKvShape {
  static constexpr int BQ = D <= 64 ? 64 : 32;
};
/// Hopper dk/dv kernel (backward/attention_backward_hopper.cu): one CTA = 128 keys of one KV
/// head, two consumer warpgroups of 64 keys each (one wgmma m64 tile: keys are the M dimension of
/// S^T, dP^T, dV and dK) and one producer warpgroup. Rows per step 64 (the N dimension of S^T and
/// dP^T; one TMA box of whole tokens when the group divides 64). Two stages of Q/dO (32 KB per
/// row block at D = 128, while one step computes four 64 x 64 x D products per warpgroup); with K
/// and V this is 128 KB at D = 128.
constexpr int kHopperBwdKeys = 128, kHopperBwdRows = 64, kHopperBwdStages = 2;
/// The pipelined consumer loop (D = 128: a row block's S^T and dP^T issued while the previous
/// block's dK runs) releases a Q/dO stage one row block later, so it keeps one more stage: 3
/// (160 KB of tiles at D = 128). Its registers at the overlap: dK, dV (128), the packed dS^T of the
/// in-flight dK (16), the new S^T and dP^T (64), within the 240 below without spills; at D = 64
/// ptxas serializes its wgmma chain (C7515), so D = 64 keeps the plain loop.
constexpr int kHopperBwdPipeStages = 3;
/// Register split: producer 24, consumers 240 (dK and dV accumulators: 2 x 64 fp32 at D = 128,
/// S^T and dP^T 2 x 32, the packed P^T and dS^T 2 x 16): 24 * 128 + 240 * 256 = 64512 of the
/// 64K-register file.
constexpr int kHopperBwdProducerRegs = 24, kHopperBwdConsumerRegs = 240;
static_assert(kHopperBwdProducerRegs * 128 + kHopperBwdConsumerRegs * 256 <= 65536, "register file");
static_assert(kHopperBwdKeys % kKeyTile == 0 && kHopperBwdRows == kHopperWarpgroupRows, "tile sizes");
/// Hopper query-outer dq kernel (backward/attention_backward_hopper_dq.cu): the forward Hopper
/// kernel's CTA (kHopperConsumers warpgroups of kHopperWarpgroupRows rows) with Q and dO of the
/// block resident (2 x 48 KB at D = 128) and a 3-deep K/V ring (3 x 32 KB): 192 KB of tiles.
constexpr int kHopperDqStages = 3;
/// SIMT backward: one warp per row (dq) / per key (dk/dv), 4 per CTA, 32-key tiles, D <= 256.
constexpr int kSimtBwdWarps = 4, kSimtBwdBN = kSimtKeyTile, kSimtBwdMaxDpl = 8;

}  // namespace orthros::cuda::detail
