// Hopper forward kernel of the Orthros attention operator (sm_90a): warp-specialized, wgmma.
//
// One CTA = NWG consumer warpgroups (64 query rows each) + one producer warp, persistent over the
// work items of the launch (the same items, rows and tile ranges as the mma.sync kernel:
// make_work_at, BM = 64 * NWG, BN = 64 keys). Per item:
//   producer warp: loads the item's Q rows (two buffers, guarded by q_full/q_empty) and its K/V
//     tiles into a STAGES-deep ring (full/empty mbarriers), running ahead into the next item while
//     the consumers finish the current one. TMA (one instruction per 64x64 box, 128-byte swizzle)
//     for every K/V tile that lies inside the sequence's cache_len and for Q when the GQA group
//     divides 64 (a box of whole tokens x the group's heads); cp.async with zero-fill otherwise:
//     the last, partial tile must read zeros past cache_len (the cache slack may hold anything,
//     even NaN, and P = 0 times NaN would poison O), and Q blocks of other groups do not start
//     on a token.
//   consumer warpgroup: S = Q K^T by wgmma (both operands in shared memory), the online softmax
//     in registers (online_softmax_tile: the mma.sync kernel's per-row arithmetic, same source),
//     O += P V by wgmma with P from registers and V transposed from shared memory. The fast mode
//     issues a tile's S together with the previous tile's P V and runs the softmax while that
//     P V is on the tensor cores (same arithmetic, same bits).
// Per row the result depends only on its own key range and the absolute 64-key tile boundaries
// (tiles outside a row's range are exact no-ops), so the deterministic mode's contract holds.
//
// Tile sizes: BN = 64 keys keeps the window stream's tiles per row block low (a w = 128 window of
// a 192-row block touches 3-4 tiles) and equals the mma.sync kernel's tiles (the deterministic
// chunk is 16 tiles in both). NWG = 3 (192 rows) in both modes; decode launches (<= 16 rows per
// sequence) stay on the mma.sync kernel under automatic (attention.cu). STAGES = 4 with Q
// double-buffered fills the 227 KB of shared memory at one CTA per SM; the deterministic mode
// has 2 stages and one Q buffer, its fp32 running output (96 KB at D = 128) taking the rest.
// Deterministic mode: a row block whose key range lies in one 1024-key chunk (most window-stream
// blocks) merges its one chunk into the empty running state in registers (merge_first_chunk);
// one spanning several chunks keeps the running output in shared memory between merges. Same
// merge arithmetic as the mma.sync kernel, so the same bits.
#include "common/hopper_launch.hpp"
#include "common/hopper_primitives.cuh"
#include "common/tile_loaders.cuh"
#include "forward/attention_hopper.hpp"
#include "forward/chunk_merge.cuh"
#include "forward/epilogue.cuh"
#include "forward/work.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <climits>
#include <cstring>

namespace orthros::cuda::detail {

template <typename T, int D, int NWG, bool DET>
struct HopperTiles {
  // Sizes and their reasons: common/tile_config.cuh.
  static constexpr int BM = hopper_block_rows(NWG), BN = kKeyTile, CH = D / 8;
  static constexpr int STAGES = HopperStages<DET>::STAGES;
  static constexpr int QBUF = HopperStages<DET>::QBUF;
  // One producer warpgroup (one warp of it loads) + NWG consumer warpgroups.
  static constexpr int kThreads = (NWG + 1) * 128;
  static constexpr int kProducerRegs = kHopperProducerRegs, kConsumerRegs = kHopperConsumerRegs;
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * NWG <= 65536, "register file");
  static_assert(kHopperWarpgroupRows == kKeyTile, "a [64][D] tile serves Q rows of a warpgroup and K/V keys");
  static constexpr int kTile = kKeyTile * D;  // elements of one [64][D] tile
  static constexpr int kBarriers = 2 * STAGES + 2 * QBUF;
  static constexpr int kDetBytes = DET ? NWG * 128 * D / 2 * 4 : 0;  // deterministic running output, fp32
  static constexpr int kSmemBytes =
      (QBUF * NWG + 2 * STAGES) * kTile * static_cast<int>(sizeof(T)) + kDetBytes + kBarriers * 8 + 1024;  // +1024: alignment
};

/// Deterministic running output of one consumer thread in shared memory: element (j, e) of
/// thread t at [(j * 4 + e) * stride + t] (consecutive threads, consecutive banks). Only read
/// after a row block's first chunk merge wrote it.
struct SmemAcc {
  float* p;
  int stride;
  __device__ float get(int j, int e) const { return p[(j * 4 + e) * stride]; }
  __device__ void set(int j, int e, float v) const { p[(j * 4 + e) * stride] = v; }
};

/// Kernel parameters: the generic kernels' parameters plus the TMA descriptors.
struct HopperParams {
  KernelParams p;
  CUtensorMap tm_k, tm_v;     // [kv rows][H_kv * D], box 64 x 64
  CUtensorMap tm_q, tm_qo;    // [tokens][H_q][D], box 64 x group x (BM / group)
  int tma_kv, tma_q;          // 0: cp.async for every K/V tile / every Q block
  int band, nbands;            // item order (split_item): bands of `band` block indices, nbands per sequence
  FastDiv band_div, hkv_div, nbands_div;  // item -> (x, KV head, sequence) when the launch has < 2^31 items
};

/// (x, KV head, sequence) of a work item. A sequence's items run over bands of `band` consecutive
/// block indices x (the last band padded with items past gx, which have no work): band-major,
/// then KV head, then x within the band. `band` = gx is x fastest per KV head, 1 KV head fastest.
__device__ __forceinline__ void split_item(const HopperParams& hp, long long item, long long nitems, int& x, int& kvh,
                                           int& z) {
  const int band = hp.band;
  if (nitems < (1LL << 31)) {
    const int it = static_cast<int>(item), q1 = hp.band_div.div(it), q2 = hp.hkv_div.div(q1);
    z = hp.nbands_div.div(q2);
    x = (q2 - z * hp.nbands) * band + (it - q1 * band);
    kvh = q1 - q2 * hp.p.Hkv;
  } else {
    const long long q1 = item / band, q2 = q1 / hp.p.Hkv;
    x = static_cast<int>((q2 % hp.nbands) * band + item % band);
    kvh = static_cast<int>(q1 % hp.p.Hkv);
    z = static_cast<int>(q2 / hp.nbands);
  }
}

/// The persistent scheduler of hopper_attn_kernel: round `round` of a CTA is work item
/// round * gridDim.x + pos, in snake order (pos = blockIdx.x on even rounds, gridDim.x - 1 -
/// blockIdx.x on odd ones), so CTAs that drew long causal blocks in one round draw short ones in
/// the next. The producer and every consumer warpgroup walk the same rounds through it, so they
/// agree on the items (and the counts of the rings' barrier phases) without communicating.
/// A round of gridDim.x items spans a few bands (split_item; kHopperBandsPerRound): neighbouring
/// block indices of a few KV heads, of similar cost (the output stream's blocks run longest
/// first), so the snake evens the CTAs' loads, where one band per KV head (x fastest) makes the
/// item costs a saw tooth of period gx that the snake cannot even.
template <int BM, int BN>
struct ItemScheduler {
  const HopperParams& hp;
  const int& gx;  // the kernel's parameters
  const long long& nitems;
  /// The item of round `round`; the CTA is done when it is >= nitems.
  __device__ __forceinline__ long long item_at(long long round) const {
    const long long pos = (round & 1) ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    return round * gridDim.x + pos;
  }
  /// (x, KV head, sequence) of `item`: its work is make_work_at(x) of sequence z. False when the
  /// item has no work (x >= gx: the last band's padding).
  __device__ __forceinline__ bool split(long long item, int& x, int& kvh, int& z) const {
    split_item(hp, item, nitems, x, kvh, z);
    return x < gx;
  }
};

template <typename T, int D, int NWG, bool DET>
__global__ void __launch_bounds__((NWG + 1) * 128, 1)
    hopper_attn_kernel(const __grid_constant__ HopperParams hp, int gx, long long nitems) {
  using C = HopperTiles<T, D, NWG, DET>;
  const KernelParams& p = hp.p;
  constexpr int BM = C::BM, BN = C::BN, STAGES = C::STAGES, QBUF = C::QBUF, NT = BN / 8, DT = D / 8;
  constexpr int kChunkTiles = kDeterministicChunk / BN;  // = p.chunk_tiles (make_plan, bn = 64)
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base =
      smem_raw + ((1024 - (static_cast<unsigned>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u);
  T* sQ = reinterpret_cast<T*>(base);  // [QBUF][D/64][BM][64] (column blocks of the whole row block)
  T* sK = sQ + QBUF * NWG * C::kTile;  // [STAGES][64][D]
  T* sV = sK + STAGES * C::kTile;      // [STAGES][64][D]
  float* sRun = reinterpret_cast<float*>(sV + STAGES * C::kTile);  // [D/2][NWG*128] (DET)
  uint64_t* full = reinterpret_cast<uint64_t*>(sRun + C::kDetBytes / 4);
  uint64_t* empty = full + STAGES;
  uint64_t* q_full = empty + STAGES;
  uint64_t* q_empty = q_full + QBUF;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      // One arrival per lane of the producer warp: an mbar_arrive (lane 0's announcing the TMA
      // bytes) when the stage is a TMA load, an mbar_arrive_cp_async when it is a cp.async load.
      mbar_init(&full[s], 32);
      mbar_init(&empty[s], NWG * 128);
    }
    for (int b = 0; b < QBUF; ++b) {
      mbar_init(&q_full[b], 32);
      mbar_init(&q_empty[b], NWG * 128);
    }
  }
  __syncthreads();

  const ItemScheduler<BM, BN> sched{hp, gx, nitems};
  const size_t kv_row = (size_t)p.Hkv * D;
  if (warp >= NWG * 4) {
    // ---------------- producer warpgroup: its first warp loads ----------------
    setmaxnreg_dec<C::kProducerRegs>();
    if (warp != NWG * 4) return;
    uint32_t ring = 0, qn = 0;
    for (long long round = 0;; ++round) {
      const long long item = sched.item_at(round);
      if (item >= nitems) break;
      int x, kvh, z;
      if (!sched.split(item, x, kvh, z)) continue;
      const SeqDesc& sd = p.seq[z];
      const Work w = make_work_at<BM, BN>(p, sd, x);
      if (!w.valid) continue;
      const T* qsrc = static_cast<const T*>(w.is_out ? p.q_out : p.q);
      const int qoff = w.is_out ? sd.out_off : sd.q_off;
      const int r0 = w.rb * BM, r1 = min(w.nrows, r0 + BM) - 1;
      const int qb = qn % QBUF;
      T* dq = sQ + qb * NWG * C::kTile;

      mbar_wait(&q_empty[qb], ((qn / QBUF) & 1) ^ 1);
      if (hp.tma_q) {
        if (lane == 0) {
          mbar_arrive_expect_tx(&q_full[qb], BM * D * sizeof(T));
          const void* map = w.is_out ? &hp.tm_qo : &hp.tm_q;
#pragma unroll
          for (int cb = 0; cb < D / 64; ++cb)
            tma_load_3d(dq + cb * BM * 64, map, cb * 64, kvh * p.group, qoff + p.group_div.div(r0), &q_full[qb]);
        } else {
          mbar_arrive(&q_full[qb]);
        }
      } else {
        load_q_tile<BM, D>(p, GroupDiv{p.group}, qoff, kvh, r0, r1, lane, 32, Sw128<BM>{},
                           [&](int dst, bool ok, const auto& off) { cp_async16(dq + dst, ok ? qsrc + off() : qsrc, ok); });
        mbar_arrive_cp_async(&q_full[qb]);
      }
      ++qn;
      const T* kg = static_cast<const T*>(p.k) + sd.kv_base + (size_t)kvh * D;
      const T* vg = static_cast<const T*>(p.v) + sd.kv_base + (size_t)kvh * D;
      const int kv_row0 = static_cast<int>(sd.kv_base / (long long)kv_row);  // the sequence's first cache row
      for (int tt = w.tb; tt <= w.te; ++tt, ++ring) {
        const int s = ring % STAGES;
        mbar_wait(&empty[s], ((ring / STAGES) & 1) ^ 1);
        T* dk = sK + s * C::kTile;
        T* dv = sV + s * C::kTile;
        if (hp.tma_kv && (long long)tt * BN + BN <= sd.cache_len) {
          if (lane == 0) {
            mbar_arrive_expect_tx(&full[s], 2 * BN * D * sizeof(T));
            const int row = kv_row0 + tt * BN;
#pragma unroll
            for (int cb = 0; cb < D / 64; ++cb) {
              tma_load_2d(dk + cb * BN * 64, &hp.tm_k, kvh * D + cb * 64, row, &full[s]);
              tma_load_2d(dv + cb * BN * 64, &hp.tm_v, kvh * D + cb * 64, row, &full[s]);
            }
          } else {
            mbar_arrive(&full[s]);
          }
        } else {
          load_kv_tile<BN, D>(dk, dv, kg, vg, (long long)tt * BN, [&](long long n) { return n < sd.cache_len; }, kv_row,
                              lane, 32, Sw128<BN>{});
          mbar_arrive_cp_async(&full[s]);
        }
      }
    }
    cp_async_wait<0>();
    return;
  }

  // ---------------- consumer warpgroups ----------------
  setmaxnreg_inc<C::kConsumerRegs>();
  const int wg = warp >> 2, wl = warp & 3, g = lane >> 2, c = lane & 3;
  // Deterministic mode: a turn ring (FlashAttention-3's warpgroup ping-pong, over NWG warpgroups):
  // per tile, warpgroup wg issues its S = Q K^T after warpgroup wg-1 issued its own (named barrier
  // kTurnBar + wg, the two warpgroups' 256 threads), so the tensor cores run the S products in
  // warpgroup order and one warpgroup's softmax overlaps the next one's product. Every warpgroup
  // passes the turn once per tile of every item (computing or not), so the counts match; the last
  // warpgroup hands the first its first turn and the first takes the last one back after the loop.
  // The fast mode does without it: with 4 stages and Q double-buffered the warpgroups keep the
  // slack to run ahead into the next item, and each overlaps its own softmax with its previous
  // tile's P V instead (the pipelined loop below).
  constexpr int kTurnBar = kBarTurnRing;
  const int turn_next = kTurnBar + (wg + 1) % NWG;
  if (DET && wg == NWG - 1) named_bar_arrive(kTurnBar, 256);
  uint32_t ring = 0, qn = 0;
  for (long long round = 0;; ++round) {
    const long long item = sched.item_at(round);
    if (item >= nitems) break;
    int x, kvh, z;
    if (!sched.split(item, x, kvh, z)) continue;
    const SeqDesc& sd = p.seq[z];
    const Work w = make_work_at<BM, BN>(p, sd, x);
    if (!w.valid) continue;
    const int r0 = w.rb * BM, r1 = min(w.nrows, r0 + BM) - 1;
    const int gr0 = r0 + wg * kHopperWarpgroupRows, gr1 = min(r1, gr0 + kHopperWarpgroupRows - 1);  // this warpgroup's rows
    const bool gactive = gr0 <= r1;
    const int gtb = gactive ? row_lo(p, w, gr0) / BN : 1, gte = gactive ? row_hi(p, w, gr1) / BN : 0;
    const int wr0 = gr0 + wl * 16;  // this warp's rows
    int lo[2], hi[2];
    bool rv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wr0 + g + 8 * h;
      rv[h] = r <= r1;
      lo[h] = rv[h] ? row_lo(p, w, r) : 1;
      hi[h] = rv[h] ? row_hi(p, w, r) : 0;
    }
    float oacc[DT][4], m[2], l[2], rm[2], rl[2];
    // Deterministic mode: the running output of the chunks already merged (a row block whose keys
    // span several 1024-key chunks) in shared memory; a block's first merge starts from the empty
    // state (+0), the last one merges into oacc itself.
    const SmemAcc racc{sRun + tid, NWG * 128};
    bool merged = false;  // racc holds a merged chunk
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m[h] = kNegInf;
      l[h] = 0.f;
      rm[h] = kNegInf;
      rl[h] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < DT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) oacc[j][e] = 0.f;
    int cur_chunk = -1;

    const int qb = qn % QBUF;
    const T* sQg = sQ + qb * NWG * C::kTile + wg * 64 * 64;  // this warpgroup's rows in each column block
    const uint64_t dq = desc_sw128(sQg, 16, 1024);
    mbar_wait(&q_full[qb], (qn / QBUF) & 1);
    if (!hp.tma_q) fence_proxy_async();  // Q came through cp.async (generic proxy)
    // S = Q K^T of stage s into sacc, and O += P V of stage s with P from pa (one warpgroup).
    // issue_s starts with wgmma_fence, which also covers an issue_pv right after it.
    auto issue_s = [&](int s, float (&sacc)[NT][4]) {
      const uint64_t dk = desc_sw128(sK + s * C::kTile, 16, 1024);
      wgmma_fence();
      wgmma_ss_over_d<T, D, BM, BN>(sacc, dq, dk);
    };
    auto issue_pv = [&](int s, const uint32_t (&pa)[BN / 16][4]) {
      const uint64_t dv = desc_sw128(sV + s * C::kTile, 64 * 128, 1024);
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) wgmma_rs_tb<T, D>(oacc, pa[kk], desc_advance(dv, kk * 16 * 64 * sizeof(T)), 1);
    };
    // The ring stage of the item's next tile, once the producer has filled it.
    auto next_stage = [&]() {
      const int s = ring % STAGES;
      mbar_wait(&full[s], (ring / STAGES) & 1);
      ++ring;
      return s;
    };
    // A tile loaded by cp.async (generic proxy) needs a proxy fence before wgmma reads it.
    auto fence_cp_async_tile = [&](int tt) {
      if (!hp.tma_kv || (long long)tt * BN + BN > sd.cache_len) fence_proxy_async();
    };
    auto full_tile = [&](int tt) {
      const int k0 = tt * BN, k1 = tt * BN + BN - 1;
      return __all_sync(0xffffffffu, (lo[0] <= k0) & (hi[0] >= k1) & (lo[1] <= k0) & (hi[1] >= k1));
    };
    if constexpr (DET) {
      for (int tt = w.tb; tt <= w.te; ++tt) {
        const int s = next_stage();
        named_bar_sync(kTurnBar + wg, 256);
        if (!(gactive && tt >= gtb && tt <= gte)) named_bar_arrive(turn_next, 256);
        if (gactive && tt >= gtb && tt <= gte) {
          fence_cp_async_tile(tt);
          if (!w.split) {
            const int chunk = tt / kChunkTiles;
            if (chunk != cur_chunk) {
              if (cur_chunk >= 0) {
                flush_chunk_tile(m, l, oacc, rm, rl, EmptyUntil<SmemAcc>{racc, merged}, racc);
                merged = true;
              }
              cur_chunk = chunk;
            }
          }
          float sacc[NT][4];
          issue_s(s, sacc);
          wgmma_commit();
          named_bar_arrive(turn_next, 256);
          wgmma_wait<0>();
          fence_regs(sacc);
          online_softmax_tile(sacc, m, l, oacc, lo, hi, tt * BN + 2 * c, full_tile(tt), p.scale_log2);
          uint32_t pa[BN / 16][4];
#pragma unroll
          for (int kk = 0; kk < BN / 16; ++kk) pack_a<T>(pa[kk], sacc[2 * kk], sacc[2 * kk + 1]);
          wgmma_fence();
          issue_pv(s, pa);
          wgmma_commit();
          wgmma_wait<0>();
          fence_regs(oacc);
        }
        mbar_arrive(&empty[s]);
      }
    } else {
      // Fast mode, software-pipelined (FlashAttention-3's intra-warpgroup overlap): the tile's
      // S = Q K^T is issued together with the previous tile's O += P V, and the softmax of this
      // tile runs while that P V is on the tensor cores; the output is rescaled by this tile's
      // alpha once the P V is done. Each element gets the same operations in the same order as
      // in the serial loop (O = (O alpha_t + P_t V_t) alpha_t+1 + ...), so the same bits.
      // A pending stage is held only while the next tile is awaited, never while the warpgroup
      // waits for a tile STAGES later (which would wait on its own release).
      // Tiles [a, b] are this warpgroup's (its rows' key range); the others of the item are only
      // passed through the ring. Prologue (tile a's S and softmax), steady state, epilogue (tile
      // b's P V): no branch around a wgmma, which ptxas would serialize.
      const int a = gactive ? max(w.tb, gtb) : w.te + 1, b = gactive ? min(w.te, gte) : w.te;
      auto softmax = [&](float (&sacc)[NT][4], int tt, float (&alpha)[2]) {
        online_softmax_scores(sacc, m, l, lo, hi, tt * BN + 2 * c, full_tile(tt), p.scale_log2, alpha);
      };
      auto pass = [&]() { mbar_arrive(&empty[next_stage()]); };
      auto wait_tile = [&](int tt) {
        const int s = next_stage();
        fence_cp_async_tile(tt);
        return s;
      };
      for (int tt = w.tb; tt < a; ++tt) pass();
      if (a <= b) {
        float sacc[NT][4], alpha[2];
        uint32_t pa[BN / 16][4];
        int pend = wait_tile(a);  // the stage whose P V (P in pa) is still to run
        issue_s(pend, sacc);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(sacc);
        softmax(sacc, a, alpha);
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) pack_a<T>(pa[kk], sacc[2 * kk], sacc[2 * kk + 1]);
        for (int tt = a + 1; tt <= b; ++tt) {
          const int s = wait_tile(tt);
          issue_s(s, sacc);
          wgmma_commit();
          issue_pv(pend, pa);
          wgmma_commit();
          wgmma_wait<1>();  // S done; the P V may still run
          fence_regs(sacc);
          softmax(sacc, tt, alpha);
          wgmma_wait<0>();
          fence_regs(oacc);
          fence_regs(pa);
          mbar_arrive(&empty[pend]);
          rescale_rows(oacc, alpha);
#pragma unroll
          for (int kk = 0; kk < BN / 16; ++kk) pack_a<T>(pa[kk], sacc[2 * kk], sacc[2 * kk + 1]);
          pend = s;
        }
        wgmma_fence();
        issue_pv(pend, pa);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(oacc);
        mbar_arrive(&empty[pend]);
      }
      for (int tt = max(a, b + 1); tt <= w.te; ++tt) pass();
    }
    mbar_arrive(&q_empty[qb]);
    ++qn;
    if (!gactive) continue;
    if constexpr (DET) {
      if (!w.split) {
        if (merged)
          merge_chunk_state(m, l, oacc, rm, rl, racc, RegAcc<DT>{oacc});
        else
          merge_first_chunk(m, l, oacc, rm, rl);
        store_tile_rows<T, DT>(p, sd, w, kvh, wr0, rv, rm, rl, oacc, true);
        continue;
      }
    }
    store_tile_rows<T, DT>(p, sd, w, kvh, wr0, rv, m, l, oacc, false);
  }
  if (DET && wg == 0) named_bar_sync(kTurnBar, 256);  // the last warpgroup's final hand-over
}

bool hopper_kernel_available() {
  static PerDeviceSetting sm90a;
  return sm90a.get([] {
    int dev = 0, major = 0, minor = 0;
    ORTHROS_CUDA_CHECK(cudaGetDevice(&dev));
    ORTHROS_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    ORTHROS_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return int(major == 9 && minor == 0);
  }) != 0;
}

namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    ORTHROS_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
    require(f != nullptr && q == cudaDriverEntryPointSuccess, "the CUDA driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// Encoded maps are cached per thread (the last 16 distinct ones): a decode loop calls with the
// same buffers every step, and the encode would otherwise add host time to every call.
}  // namespace

void encode_tensor_map(CUtensorMap* map, DType dt, const void* ptr, int rank, const cuuint64_t* dims, const cuuint64_t* strides,
            const cuuint32_t* box, const char* what) {
  struct Key {
    const void* ptr;
    int dt, rank;
    cuuint64_t dims[3], strides[2];
    cuuint32_t box[3];
    bool operator==(const Key& o) const { return std::memcmp(this, &o, sizeof(Key)) == 0; }
  };
  struct Entry {
    Key key;
    CUtensorMap map;
  };
  thread_local Entry cache[16];
  thread_local int used = 0, next = 0;
  Key key;
  std::memset(&key, 0, sizeof key);  // padding bytes take part in the comparison
  key.ptr = ptr;
  key.dt = static_cast<int>(dt);
  key.rank = rank;
  for (int i = 0; i < rank; ++i) {
    key.dims[i] = dims[i];
    key.box[i] = box[i];
    if (i + 1 < rank) key.strides[i] = strides[i];
  }
  for (int i = 0; i < used; ++i)
    if (cache[i].key == key) {
      *map = cache[i].map;
      return;
    }
  const cuuint32_t elem[3] = {1, 1, 1};
  const CUresult r = encode_fn()(map, dt == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                                 rank, const_cast<void*>(ptr), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) throw CudaError(::orthros::detail::cat("cuTensorMapEncodeTiled(", what, ") failed: CUresult ", int(r)));
  cache[next] = Entry{key, *map};
  next = (next + 1) % 16;
  used = used < 16 ? used + 1 : 16;
}


void encode_gqa_rows_map(CUtensorMap* map, DType dt, const void* ptr, long long tokens, int Hq, int D, int group,
                         int block_rows, const char* what) {
  const cuuint64_t dims[3] = {cuuint64_t(D), cuuint64_t(Hq), cuuint64_t(tokens)};
  const cuuint64_t strides[2] = {cuuint64_t(D) * 2, cuuint64_t(Hq) * D * 2};
  const cuuint32_t box[3] = {64, cuuint32_t(group), cuuint32_t(block_rows / group)};
  encode_tensor_map(map, dt, ptr, 3, dims, strides, box, what);
}

bool encode_kv_cache_maps(CUtensorMap* k_map, CUtensorMap* v_map, DType dt, const KernelParams& kp, long long kv_rows,
                          int box_rows) {
  if (kv_rows <= 0 || kv_rows >= (1LL << 31)) return false;
  const cuuint64_t dims[2] = {cuuint64_t(kp.Hkv) * kp.D, cuuint64_t(kv_rows)};
  const cuuint64_t strides[1] = {cuuint64_t(kp.Hkv) * kp.D * 2};
  const cuuint32_t box[2] = {64, cuuint32_t(box_rows)};
  encode_tensor_map(k_map, dt, kp.k, 2, dims, strides, box, "k_cache");
  encode_tensor_map(v_map, dt, kp.v, 2, dims, strides, box, "v_cache");
  return true;
}

namespace {

HopperParams make_params(DType dt, int D, int nwg, const KernelParams& kp, const HopperGeometry& geo) {
  HopperParams hp{};
  hp.p = kp;
  hp.hkv_div = FastDiv::of(kp.Hkv);
  const int BM = hopper_block_rows(nwg);
  // K/V: every cache row of the batch, [rows][H_kv * D]; int32 TMA coordinates.
  hp.tma_kv = encode_kv_cache_maps(&hp.tm_k, &hp.tm_v, dt, kp, geo.kv_rows, kKeyTile);
  // Q: [tokens][H_q][D] in boxes of whole tokens (BM / group of them) x the group's heads.
  hp.tma_q = tma_query_maps_fit(kp.group, geo);
  if (hp.tma_q) {
    if (geo.total_q > 0) encode_gqa_rows_map(&hp.tm_q, dt, kp.q, geo.total_q, kp.Hq, D, kp.group, BM, "q");
    if (geo.total_out > 0) encode_gqa_rows_map(&hp.tm_qo, dt, kp.q_out, geo.total_out, kp.Hq, D, kp.group, BM, "q_out");
  }
  return hp;
}

template <typename T, int D, int NWG, bool DET>
void launch_variant(HopperParams& hp, long long gx, int band, cudaStream_t stream) {
  using C = HopperTiles<T, D, NWG, DET>;
  auto kernel = hopper_attn_kernel<T, D, NWG, DET>;
  static PerDeviceSetting setup;  // per instantiation: the shared-memory opt-in and occupancy of each device
  const int blocks_per_sm = setup.get([&] {
    ORTHROS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
    int n = 0;
    ORTHROS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, C::kThreads, C::kSmemBytes));
    require(n >= 1, "internal: the Hopper kernel does not fit on this GPU (", C::kSmemBytes, " bytes of shared memory)");
    return n;
  });
  const long long blocks = gx * hp.p.Hkv * hp.p.nseq;  // work items before the last band's padding
  if (blocks == 0) return;
  const long long grid = std::min<long long>(blocks, (long long)device_sm_count() * blocks_per_sm);
  // The item order (split_item): bands of `band` block indices, by default kHopperBandsPerRound
  // bands per round of the snake (tile_config.cuh).
  long long b = band > 0 ? std::min<long long>(band, gx)
                         : std::min<long long>(gx, (grid + kHopperBandsPerRound - 1) / kHopperBandsPerRound);
  if (gx + b > INT_MAX) b = gx;  // split_item's padded x (< gx + b) must fit an int: one band
  hp.band = static_cast<int>(b);
  hp.nbands = static_cast<int>((gx + b - 1) / b);
  hp.band_div = FastDiv::of(hp.band);
  hp.nbands_div = FastDiv::of(hp.nbands);
  const long long nitems = static_cast<long long>(hp.nbands) * b * hp.p.Hkv * hp.p.nseq;
  kernel<<<static_cast<unsigned>(grid), C::kThreads, C::kSmemBytes, stream>>>(hp, static_cast<int>(gx), nitems);
  ORTHROS_CUDA_LAUNCH_CHECK("hopper_attn_kernel");
}

template <typename T, int D>
void launch_d(int nwg, bool det, HopperParams& hp, long long gx, int band, cudaStream_t stream) {
  // Instantiated: 3 consumer warpgroups (192 rows) in both modes.
  if (det) {
    require(nwg == 3, "internal: the deterministic Hopper kernel has 3 warpgroups (got ", nwg, ")");
    return launch_variant<T, D, 3, true>(hp, gx, band, stream);
  }
  require(nwg == 3, "internal: the fast Hopper kernel has 3 warpgroups (got ", nwg, ")");
  return launch_variant<T, D, 3, false>(hp, gx, band, stream);
}

}  // namespace

void launch_hopper_forward(DType dtype, int D, int nwg, bool deterministic, const KernelParams& kp,
                           const HopperGeometry& geo, long long gx, int band, cudaStream_t stream) {
  require(gx < (1LL << 31), "internal: grid too large (", gx, " blocks)");
  require(band >= 0, "internal: band ", band, " (>= 0)");
  dispatch_hopper_types(dtype, D, "Hopper kernel", [&](auto t, auto d) {
    constexpr int Dc = decltype(d)::value;
    HopperParams hp = make_params(dtype, Dc, nwg, kp, geo);
    launch_d<typename decltype(t)::type, Dc>(nwg, deterministic, hp, gx, band, stream);
  });
}

}  // namespace orthros::cuda::detail
