// Hopper (sm_90a) dk/dv kernel of the Orthros attention backward (SPEC §9): KV-block-outer,
// warp-specialized, every product on wgmma.
//
// One CTA = 128 keys [j0, j1] of one KV head and sequence (kHopperBwdKeys), two consumer
// warpgroups of 64 keys each and one producer warpgroup (one warp of it loads). The CTA visits
// the row blocks (64 rows = (token, query head of the group) pairs, aligned to the sequence start)
// that see its keys in one pass: base blocks of tokens [j0, j1 + w - 1] (the window band), then
// output blocks from token j0 on (the causal range).
//   producer warp: Q and dO of each row block by TMA (a box of whole tokens x the group's heads;
//     cp.async with zero-fill when the group does not divide 64), lse2 and Δ of its rows by
//     cp.async, into a ring of stages (full/empty mbarriers): 2, or 3 for the pipelined loop.
//   consumer warpgroup (keys are the M dimension, transposed products), four wgmma groups per
//   row block, each issued as soon as its operands exist:
//     G1 S^T = K Q^T, G2 dP^T = V dO^T   both operands in shared memory
//     P^T = exp2(S^T s log2e - lse2), masked to each row's keys (while G2 runs)
//     G3 dV += P^T dO                    P^T from registers, dO transposed
//     dS^T = P^T (dP^T - Δ) (while G3 runs), 0 for a row that sees one key
//     G4 dK += dS^T Q                    dS^T from registers, Q transposed
//   dK and dV stay in registers over all row blocks and are written once.
// Fused dq (DQ = true, the fast mode), FlashAttention-3's structure:
//     G4 is split: its first two k16 steps are issued before dS^T of both warpgroups goes into
//     shared memory (while they run), then
//     G5 dQ = dS K                       both operands transposed from shared memory; at D = 128
//                                        warpgroup wg computes the output columns [64 wg, 64 wg +
//                                        64) over all 128 keys, at D = 64 all columns over its keys
//     G4's last two steps, while the 64 x 64 float32 dQ tile goes into the warpgroup's staging
//     buffer (register order, 16-byte stores), from which the producer warpgroup's second warp
//     adds it to the float32 dq accumulator (DqAccumulator) with one TMA bulk reduction,
//     overlapped with the next row block. hopper_dq_convert_kernel then scales and rounds it.
// The elementwise arithmetic is the mma.sync dk/dv kernel's (backward/mma_dkdv_kernel.cuh). Every
// dk/dv element is accumulated in a fixed order that depends only on its sequence: bitwise
// reproducible and batch-invariant. The fused dq adds the CTAs' partial sums in the order they
// finish (not reproducible); without DQ, dq comes from the query-outer kernel
// (attention_backward_hopper_dq.cu), the deterministic mode's path.
#include "backward/attention_backward_hopper.hpp"
#include "common/hopper_launch.hpp"
#include "common/hopper_primitives.cuh"
#include "common/tile_loaders.cuh"
#include "forward/attention_hopper.hpp"

#include <type_traits>


namespace orthros::cuda::detail {

namespace {

constexpr int BN = kHopperBwdKeys, BQ = kHopperBwdRows;
/// Q/dO ring depth: kHopperBwdStages, or PIPE stages for the pipelined consumer loop (PIPE > 0).
template <int PIPE>
constexpr int bwd_stages() { return PIPE > 0 ? PIPE : kHopperBwdStages; }

/// Shared memory of hopper_bwd_kernel, every tile 1024-byte aligned (the 128-byte swizzle): K and
/// V of the CTA's keys ([BN][D] as D/64 column blocks of [BN][64]), the ring of Q and dO
/// ([BQ][D] likewise) and lse2 and Δ of their rows.
template <typename T, int D, int STAGES>
struct HopperBwdSmem {
  T k[BN * D];
  T v[BN * D];
  T q[STAGES][BQ * D];
  T d_o[STAGES][BQ * D];
  float lse2[STAGES][BQ];
  float delta[STAGES][BQ];
  uint64_t full[STAGES], empty[STAGES];
};

/// Shared memory of the fused dq (DQ = true), after HopperBwdSmem at a 1024-byte boundary: two
/// buffers of dS^T ([BN keys][BQ rows] bf16/f16 with the 128-byte swizzle: the MN-major A operand
/// of dQ = dS K; row block `it` uses buffer it % 2), one staging tile per warpgroup for the bulk
/// reduction (64 x 64 float32 in register order) with its destination and full/empty mbarriers.
template <typename T>
struct HopperDqSmem {
  T ds[2][BN * BQ];
  float stage[2][BQ * 64];
  float* dst[2];  // where the staged tile goes (its accumulator chunk), set with it
  uint64_t stage_full[2], stage_empty[2];
};
template <typename T, int D, bool DQ, int PIPE>
constexpr int hopper_bwd_smem_bytes() {
  constexpr int main = (static_cast<int>(sizeof(HopperBwdSmem<T, D, bwd_stages<PIPE>()>)) + 1023) / 1024 * 1024;
  return main + (DQ ? static_cast<int>(sizeof(HopperDqSmem<T>)) : 0) + 1024;  // +1024: alignment
}

/// The kernel's parameters: the backward's parameters, the TMA descriptors of the query-like
/// tensors and the fused dq's accumulator.
struct HopperBwdParams {
  BwdParams b;
  CUtensorMap tm_q, tm_qo, tm_do, tm_doo;  // [tokens][H_q][D], box 64 x group x (BQ / group)
  int tma_q;                               // 0: Q and dO by cp.async
  DqAccumulator dq;                        // DQ = true only
};

/// The accumulator chunk (64 rows x D floats) of row block `rb` of a stream of sequence
/// blockIdx.z, KV head kvh: the dk/dv kernel adds to it, the post-pass reads it.
__device__ __forceinline__ float* dq_acc_chunk(const DqAccumulator& dq, const KernelParams& f, const SeqDesc& sd,
                                               bool is_out, int rb, int kvh) {
  const int seq = dq.seq0 + static_cast<int>(blockIdx.z);
  const long long blk =
      is_out ? dq.out_block0 + dq_acc_block(sd.out_off, f.group, seq) + rb : dq_acc_block(sd.q_off, f.group, seq) + rb;
  return dq.acc + (size_t)(blk * f.Hkv + kvh) * BQ * f.D;
}

/// The row blocks that see keys [j0, j1] of sequence sd: nb_base base blocks from rb_base0 (the
/// tokens whose window covers a key) and nb_out output blocks from rb_out0 (tokens at or after
/// j0).
struct KvBlockRows {
  int nb_base = 0, rb_base0 = 0, nb_out = 0, rb_out0 = 0;
  __device__ KvBlockRows(const KernelParams& f, const SeqDesc& sd, int j0, int j1) {
    const long long fpb = sd.cache_len - sd.T, fpo = sd.cache_len - sd.T_out;
    const long long i_lo = max(0LL, (long long)j0 - fpb);
    const long long i_hi = min((long long)sd.T - 1, (long long)j1 + f.window - 1 - fpb);
    if (i_lo <= i_hi) {
      rb_base0 = (int)(i_lo * f.group / BQ);
      nb_base = (int)(((i_hi + 1) * f.group - 1) / BQ) - rb_base0 + 1;
    }
    const long long o_lo = max(0LL, (long long)j0 - fpo);
    if (o_lo < sd.T_out) {
      rb_out0 = (int)(o_lo * f.group / BQ);
      nb_out = (int)(((long long)sd.T_out * f.group - 1) / BQ) - rb_out0 + 1;
    }
  }
  __device__ int count() const { return nb_base + nb_out; }
};

/// Row block `it` of the CTA's list: its stream, index, row count, first query row of the stream
/// in the packed tensors and the cache position of its token 0. Base blocks first, then output
/// blocks ascending.
struct RowBlock {
  bool is_out;
  int rb, nrows, qoff, first_pos;
  __device__ RowBlock(const KernelParams& f, const SeqDesc& sd, const KvBlockRows& br, int it) {
    is_out = it >= br.nb_base;
    rb = is_out ? br.rb_out0 + (it - br.nb_base) : br.rb_base0 + it;
    const int ntok = is_out ? sd.T_out : sd.T;
    nrows = ntok * f.group;
    qoff = is_out ? sd.out_off : sd.q_off;
    first_pos = (int)(sd.cache_len - ntok);
  }
};

/// `own` when OWN, else `acc`: where the pipelined loop keeps a value the plain loop writes back
/// into an accumulator.
template <bool OWN, typename A>
__device__ __forceinline__ A& own_or(A& own, A& acc) {
  if constexpr (OWN)
    return own;
  else
    return acc;
}

template <typename T, int D, bool DQ, int PIPE>
__global__ void __launch_bounds__(3 * 128, 1) hopper_bwd_kernel(const __grid_constant__ HopperBwdParams hp) {
  static_assert(!(DQ && PIPE > 0), "the pipelined loop has no room for the fused dq's registers");
  constexpr int NQ = BQ / 8, DT = D / 8, STAGES = bwd_stages<PIPE>();
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base =
      smem_raw + ((1024 - (static_cast<unsigned>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u);
  using Smem = HopperBwdSmem<T, D, STAGES>;
  auto& sm = *reinterpret_cast<Smem*>(base);
  auto& sq = *reinterpret_cast<HopperDqSmem<T>*>(base + (sizeof(Smem) + 1023) / 1024 * 1024);
  const BwdParams& p = hp.b;
  const KernelParams& f = p.f;
  const SeqDesc& sd = f.seq[blockIdx.z];
  // KV head fastest: the key blocks that see the most rows (the first ones: every later output row
  // sees them) start first for every head.
  const int kvh = blockIdx.x % f.Hkv, group = f.group;
  const int j0 = blockIdx.x / f.Hkv * BN;
  if (j0 >= sd.cache_len) return;
  const int j1 = (int)min((long long)j0 + BN, sd.cache_len) - 1;
  const KvBlockRows br(f, sd, j0, j1);
  const int nb = br.count();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      // 32 cp.async arrivals of the producer warp (lse2, Δ; Q/dO when not by TMA) + lane 0's
      // arrival that announces the TMA bytes (a plain arrival without TMA).
      mbar_init(&sm.full[s], 33);
      mbar_init(&sm.empty[s], 256);
    }
    if constexpr (DQ) {
      for (int w = 0; w < 2; ++w) {
        mbar_init(&sq.stage_full[w], 128);  // the warpgroup's threads, after their stores
        mbar_init(&sq.stage_empty[w], 1);   // the dq writer, once the bulk reduction read the tile
      }
    }
  }
  __syncthreads();

  if (warp >= 8) {
    // ---------------- producer warpgroup: its first warp loads ----------------
    setmaxnreg_dec<kHopperBwdProducerRegs>();
    if (DQ && warp == 9) {
      // ---- the dq writer: adds each warpgroup's staged dQ tile to the accumulator ----
      // (With DQ the producer warpgroup's 24 registers make ptxas spill ~100 bytes of the two
      // producer warps' loop state to local memory: a few accesses per row block, off the
      // consumers' path; 40 producer registers would leave the consumers 232, where the wgmma
      // chain is serialized.)
      if (lane == 0) {
        for (int it = 0; it < nb; ++it) {
#pragma unroll
          for (int w = 0; w < 2; ++w) {
            mbar_wait(&sq.stage_full[w], it & 1);
            bulk_reduce_add_f32(sq.dst[w], sq.stage[w], BQ * 64 * sizeof(float));
            bulk_commit();
          }
#pragma unroll
          for (int w = 0; w < 2; ++w) {
            if (w == 0) bulk_wait_read<1>(); else bulk_wait_read<0>();
            mbar_arrive(&sq.stage_empty[w]);
          }
        }
        bulk_wait<0>();  // every reduction applied before the CTA exits
      }
      return;
    }
    if (warp != 8) return;
    for (int it = 0; it < nb; ++it) {
      const int s = it % STAGES;
      mbar_wait(&sm.empty[s], ((it / STAGES) & 1) ^ 1);
      const RowBlock rbk(f, sd, br, it);
      const int r0 = rbk.rb * BQ, r1 = min(rbk.nrows, r0 + BQ) - 1;
      if (lane == 0) {
        if (hp.tma_q) {
          mbar_arrive_expect_tx(&sm.full[s], 2 * BQ * D * sizeof(T));
          const int tok0 = rbk.qoff + p.group_div.div(r0);
#pragma unroll
          for (int cb = 0; cb < D / 64; ++cb) {
            tma_load_3d(sm.q[s] + cb * BQ * 64, rbk.is_out ? &hp.tm_qo : &hp.tm_q, cb * 64, kvh * group, tok0,
                        &sm.full[s]);
            tma_load_3d(sm.d_o[s] + cb * BQ * 64, rbk.is_out ? &hp.tm_doo : &hp.tm_do, cb * 64, kvh * group, tok0,
                        &sm.full[s]);
          }
        } else {
          mbar_arrive(&sm.full[s]);
        }
      }
      if (!hp.tma_q) {
        const T* qsrc = static_cast<const T*>(rbk.is_out ? f.q_out : f.q);
        const T* dosrc = static_cast<const T*>(rbk.is_out ? p.dO_out : p.dO);
        load_q_tile<BQ, D>(f, GroupFastDiv{p.group_div, group}, rbk.qoff, kvh, r0, r1, lane, 32, Sw128<BQ>{},
                           [&](int dst, bool ok, const auto& off_of) {
                             const size_t off = ok ? off_of() : 0;
                             cp_async16(sm.q[s] + dst, qsrc + off, ok);
                             cp_async16(sm.d_o[s] + dst, dosrc + off, ok);
                           });
      }
      for (int row = lane; row < BQ; row += 32) {
        const int r = r0 + row;
        const bool ok = r <= r1;
        const int tok = p.group_div.div(r);
        const long long ridx = ok ? bwd_row_index(p, sd, rbk.is_out, tok, kvh * group + (r - tok * group)) : 0;
        cp_async4(&sm.lse2[s][row], p.lse2 + ridx, ok);
        cp_async4(&sm.delta[s][row], p.delta + ridx, ok);
      }
      mbar_arrive_cp_async(&sm.full[s]);
    }
    cp_async_wait<0>();
    return;
  }

  // ---------------- consumer warpgroups ----------------
  setmaxnreg_inc<kHopperBwdConsumerRegs>();
  const int wg = warp >> 2, wl = warp & 3, g = lane >> 2, c = lane & 3;
  {
    // K and V of the CTA's keys, zero past j1 (the cache slack may hold anything, even NaN).
    const size_t kv_row = (size_t)f.Hkv * D;
    const T* kg = static_cast<const T*>(f.k) + sd.kv_base + (size_t)kvh * D;
    const T* vg = static_cast<const T*>(f.v) + sd.kv_base + (size_t)kvh * D;
    load_kv_tile<BN, D>(sm.k, sm.v, kg, vg, j0, [&](int n) { return n <= j1; }, kv_row, tid, 256, Sw128<BN>{});
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async();  // cp.async writes (generic proxy) before the tensor cores read them
    named_bar_sync(kBarBwdKvLoaded, 256);
  }
  const int kw0 = wg * 64 + wl * 16;         // this warp's first key, relative to j0
  const int key0 = j0 + kw0 + g;             // this thread's keys: key0, key0 + 8
  const int klo = j0 + kw0, khi = klo + 15;  // this warp's keys
  // A operands K and V (K-major: D contiguous) at this warpgroup's 64 keys; the k16 step kk is
  // column block kk / 4, 32 bytes into the row.
  const uint64_t desc_k = desc_sw128(sm.k + wg * 64 * 64, 16, 1024);
  const uint64_t desc_v = desc_sw128(sm.v + wg * 64 * 64, 16, 1024);
  float dk[DT][4], dv[DT][4];
#pragma unroll
  for (int j = 0; j < DT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.f;
  // S^T, dP^T of the current row block; the packed P^T and dS^T (A operands of dV and dK). With
  // PIPE the packed dS^T lives across iterations: dK of row block it - 1 is still in flight while
  // row block it's S^T and dP^T are issued.
  float sacc[NQ][4], pacc[NQ][4];
  uint32_t pa[BQ / 16][4], da[BQ / 16][4];
  // Waits for row block it's Q/dO stage, then issues G1 S^T = K Q^T and G2 dP^T = V dO^T (B
  // operands K-major: [rows][D]), one commit group each.
  const auto issue_s_dp = [&](int it) {
    const int s = it % STAGES;
    mbar_wait(&sm.full[s], (it / STAGES) & 1);
    if (!hp.tma_q) fence_proxy_async();  // Q/dO came through cp.async (generic proxy)
    const uint64_t dq_k = desc_sw128(sm.q[s], 16, 1024), ddo_k = desc_sw128(sm.d_o[s], 16, 1024);
    wgmma_fence();
    wgmma_ss_over_d<T, D, BN, BQ>(sacc, desc_k, dq_k);
    wgmma_commit();
    wgmma_ss_over_d<T, D, BN, BQ>(pacc, desc_v, ddo_k);
    wgmma_commit();
  };
  for (int it = 0; it < nb; ++it) {
    const int s = it % STAGES;
    const RowBlock rbk(f, sd, br, it);
    const int r0 = rbk.rb * BQ;
    issue_s_dp(it);  // PIPE: while the previous row block's dK runs
    const uint64_t ddo_mn = desc_sw128(sm.d_o[s], BQ * 128, 1024), dq_mn = desc_sw128(sm.q[s], BQ * 128, 1024);
    const float* lb = sm.lse2[s];
    const float* db = sm.delta[s];
    const int last = min(rbk.nrows, r0 + BQ) - 1;
    const int pos_first = rbk.first_pos + p.group_div.div(r0), pos_last = rbk.first_pos + p.group_div.div(last);
    // Every row of the block valid and seeing every key of this warp, none a single-key row: no
    // mask (same arithmetic).
    const bool full = r0 + BQ <= rbk.nrows && khi <= j1 && pos_first >= khi && pos_first > 0 &&
                      (rbk.is_out || (f.window > 1 && (long long)pos_last - klo < f.window));
    // ---- P^T (columns are the block's rows), masked to each row's keys ----
    uint32_t ds_zero = 0;  // bit j * 4 + e: element (j, e) has dS = 0 (masked, or a single-key row)
    // P^T and dS^T: in the pipelined loop arrays of their own (ptxas serializes a wgmma chain whose
    // accumulators other instructions write while a wgmma is in flight across the back edge:
    // C7515), otherwise written back into S^T's and dP^T's accumulators.
    float pt_own[NQ][4], dst_own[NQ][4];
    float(&pt)[NQ][4] = own_or<(PIPE > 0)>(pt_own, sacc);
    float(&dst)[NQ][4] = own_or<(PIPE > 0)>(dst_own, pacc);
    static_assert(NQ * 4 == 32, "one bit per accumulator element");
    wgmma_wait<1>();  // G1 done (PIPE: and the previous row block's dK)
    fence_regs(sacc);
    if (PIPE > 0 && it > 0) {
      fence_regs(da);
      fence_regs(dk);
      mbar_arrive(&sm.empty[(it - 1) % STAGES]);  // the previous row block's Q/dO are read
    }
    // One branch per row block (warp-uniform), not one per element: a test inside the unrolled
    // loop made ptxas put a convergence barrier (BSSY/BSYNC) around every element's mask, and
    // those took ~17 % of the fused kernel's stall samples at PT 32K.
    // P^T of element (j, e), unmasked; its column (row of the block) is j * 8 + 2c + (e & 1)
    const auto p_t = [&](int j, int e) {
      return fast_exp2(__fmaf_rn(sacc[j][e], f.scale_log2, -lb[j * 8 + 2 * c + (e & 1)]));
    };
    if (full) {
#pragma unroll
      for (int j = 0; j < NQ; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) pt[j][e] = p_t(j, e);
    } else {
#pragma unroll
      for (int j = 0; j < NQ; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = j * 8 + 2 * c + (e & 1);
          const float pe = p_t(j, e);
          const int r = r0 + col, kp = key0 + 8 * (e >> 1);
          const int pos = rbk.first_pos + p.group_div.div(r);
          const bool ok = r < rbk.nrows && kp <= pos && (rbk.is_out || (long long)(pos - kp) < f.window);
          const bool single = pos == 0 || (!rbk.is_out && f.window == 1);  // the row sees one key: dS = 0
          if (!ok || single) ds_zero |= 1u << (j * 4 + e);
          pt[j][e] = ok ? pe : 0.f;  // P^T
        }
    }
#pragma unroll
    for (int kk = 0; kk < BQ / 16; ++kk) pack_a<T>(pa[kk], pt[2 * kk], pt[2 * kk + 1]);
    // ---- G3 dV += P^T dO (B operand MN-major: [rows][D], D contiguous) ----
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BQ / 16; ++kk) wgmma_rs_tb<T, D>(dv, pa[kk], desc_advance(ddo_mn, kk * 16 * 64 * sizeof(T)), 1);
    wgmma_commit();
    // ---- dS^T = P^T (dP^T - Δ) ----
    wgmma_wait<1>();
    fence_regs(pacc);
#pragma unroll
    for (int j = 0; j < NQ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = j * 8 + 2 * c + (e & 1);
        dst[j][e] = (ds_zero >> (j * 4 + e)) & 1u ? 0.f : __fmul_rn(pt[j][e], __fsub_rn(pacc[j][e], db[col]));
      }
#pragma unroll
    for (int kk = 0; kk < BQ / 16; ++kk) pack_a<T>(da[kk], dst[2 * kk], dst[2 * kk + 1]);
    // ---- G4 dK += dS^T Q (DQ: its first two k16 steps here, the other two behind G5, so the dQ
    // tile's staging stores overlap them; the same products in the same order) ----
    constexpr int kG4Head = DQ ? BQ / 32 : BQ / 16;
    const auto issue_dk = [&](int kk0, int kk1) {
      wgmma_fence();
#pragma unroll
      for (int kk = kk0; kk < kk1; ++kk) wgmma_rs_tb<T, D>(dk, da[kk], desc_advance(dq_mn, kk * 16 * 64 * sizeof(T)), 1);
      wgmma_commit();
    };
    issue_dk(0, kG4Head);
    if constexpr (DQ) {
      // dS^T into shared memory while G4 runs, packed again from dst (da is G4's operand: reading
      // it before G4 completes is undefined): key row kr, the block's rows as columns, 16-byte
      // chunk ch of row kr at kr * 64 + (ch ^ kr % 8) * 8 (conflict-free: the 8 rows of a warp's
      // stores hit 8 different chunks).
      T* dsb = sq.ds[it & 1];
      const int kr = kw0 + g, sw = kr & 7;  // (kr + 8) % 8 == kr % 8
#pragma unroll
      for (int kk = 0; kk < BQ / 16; ++kk) {
        uint32_t w4[4];
        pack_a<T>(w4, dst[2 * kk], dst[2 * kk + 1]);
        *reinterpret_cast<uint32_t*>(dsb + kr * 64 + (((2 * kk) ^ sw) << 3) + 2 * c) = w4[0];
        *reinterpret_cast<uint32_t*>(dsb + (kr + 8) * 64 + (((2 * kk) ^ sw) << 3) + 2 * c) = w4[1];
        *reinterpret_cast<uint32_t*>(dsb + kr * 64 + (((2 * kk + 1) ^ sw) << 3) + 2 * c) = w4[2];
        *reinterpret_cast<uint32_t*>(dsb + (kr + 8) * 64 + (((2 * kk + 1) ^ sw) << 3) + 2 * c) = w4[3];
      }
      fence_proxy_async();  // the stores (generic proxy) before the tensor cores read them
      // ---- G5 dQ = dS K (A: dS^T [keys][rows], MN-major; B: K [keys][D], MN-major) ----
      constexpr int kSteps = D == 128 ? BN / 16 : 64 / 16;
      if constexpr (D == 128)
        named_bar_sync(kBarBwdDs, 256);
      else
        named_bar_sync(kBarBwdDs + 1 + wg, 128);
      const T* a0 = D == 128 ? sq.ds[it & 1] : sq.ds[it & 1] + wg * 64 * 64;
      const T* b0 = D == 128 ? sm.k + wg * BN * 64 : sm.k + wg * 64 * 64;
      const uint64_t desc_ds = desc_sw128(a0, BN * 128, 1024), desc_kt = desc_sw128(b0, BN * 128, 1024);
      float qacc[8][4];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kSteps; ++kk)
        wgmma_ss_tt_m64n64k16<T>(qacc, desc_advance(desc_ds, kk * 16 * 64 * sizeof(T)),
                                 desc_advance(desc_kt, kk * 16 * 64 * sizeof(T)), kk > 0);
      wgmma_commit();
      issue_dk(kG4Head, BQ / 16);
      wgmma_wait<1>();  // G5 done (G4's last steps may still run)
      fence_regs(qacc);
      // The tile into this warpgroup's staging buffer in register order: float4 (j, thread) at
      // (j * 128 + thread) * 4, once the dq writer's previous reduction has read it.
      mbar_wait(&sq.stage_empty[wg], (it & 1) ^ 1);
      float4* st = reinterpret_cast<float4*>(sq.stage[wg]) + (tid & 127);
#pragma unroll
      for (int j = 0; j < 8; ++j) st[j * 128] = make_float4(qacc[j][0], qacc[j][1], qacc[j][2], qacc[j][3]);
      if ((tid & 127) == 0) sq.dst[wg] = dq_acc_chunk(hp.dq, f, sd, rbk.is_out, rbk.rb, kvh) + (D == 128 ? wg * BQ * 64 : 0);
      fence_proxy_async();  // the stores before the bulk reduction (async proxy) reads them
      mbar_arrive(&sq.stage_full[wg]);
      wgmma_wait<0>();
      fence_regs(pa);
      fence_regs(da);
      fence_regs(dk);
      fence_regs(dv);
      mbar_arrive(&sm.empty[s]);
    } else if constexpr (PIPE > 0) {
      // dV done; dK keeps running into the next row block, whose S^T and dP^T are issued behind it
      // (their accumulators are free: P^T and dS^T are packed into pa and da).
      wgmma_wait<1>();
      fence_regs(pa);
      fence_regs(dv);
    } else {
      wgmma_wait<0>();
      fence_regs(pa);
      fence_regs(da);
      fence_regs(dk);
      fence_regs(dv);
      mbar_arrive(&sm.empty[s]);
    }
  }
  if constexpr (PIPE > 0) {
    wgmma_wait<0>();
    fence_regs(da);
  }
  fence_regs(dk);
  fence_regs(dv);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int n = key0 + 8 * h;
    if (n > j1) continue;
    const size_t off = ((size_t)(sd.q_off + n) * f.Hkv + kvh) * D;  // P = 0: packed row q_off + n
    T* dkp = static_cast<T*>(p.dk) + off;
    T* dvp = static_cast<T*>(p.dv) + off;
#pragma unroll
    for (int j = 0; j < DT; ++j) {
      *reinterpret_cast<uint32_t*>(dkp + j * 8 + 2 * c) =
          Mma<T>::pack(__fmul_rn(dk[j][2 * h], p.scale), __fmul_rn(dk[j][2 * h + 1], p.scale));
      *reinterpret_cast<uint32_t*>(dvp + j * 8 + 2 * c) = Mma<T>::pack(dv[j][2 * h], dv[j][2 * h + 1]);
    }
  }
}

}  // namespace

bool encode_bwd_query_maps(DType dtype, const BwdParams& bp, const HopperGeometry& geo, int block_rows,
                           CUtensorMap* q, CUtensorMap* d_o, CUtensorMap* q_out, CUtensorMap* d_o_out) {
  const KernelParams& f = bp.f;
  if (!tma_query_maps_fit(f.group, geo)) return false;
  if (geo.total_q > 0) {
    encode_gqa_rows_map(q, dtype, f.q, geo.total_q, f.Hq, f.D, f.group, block_rows, "q");
    encode_gqa_rows_map(d_o, dtype, bp.dO, geo.total_q, f.Hq, f.D, f.group, block_rows, "d_o");
  }
  if (geo.total_out > 0) {
    encode_gqa_rows_map(q_out, dtype, f.q_out, geo.total_out, f.Hq, f.D, f.group, block_rows, "q_out");
    encode_gqa_rows_map(d_o_out, dtype, bp.dO_out, geo.total_out, f.Hq, f.D, f.group, block_rows, "d_o_out");
  }
  return true;
}

void launch_hopper_backward(DType dtype, const BwdParams& bp, const HopperGeometry& geo, dim3 grid,
                            const DqAccumulator& dq, bool pipelined, cudaStream_t stream) {
  dispatch_hopper_types(dtype, bp.f.D, "Hopper backward kernel", [&](auto t, auto d) {
    using T = typename decltype(t)::type;
    constexpr int D = decltype(d)::value;
    if (grid.x == 0) return;
    require(!pipelined || (D == 128 && !dq.acc), "internal: the pipelined dk/dv loop is built for D = 128 without "
            "the fused dq (D = ", D, ")");
    HopperBwdParams hp{};
    hp.b = bp;
    hp.tma_q = encode_bwd_query_maps(dtype, bp, geo, BQ, &hp.tm_q, &hp.tm_do, &hp.tm_qo, &hp.tm_doo);
    hp.dq = dq;
    const auto launch = [&](auto dq_c, auto pipe_c) {
      constexpr bool kDq = decltype(dq_c)::value;
      constexpr int kPipe = decltype(pipe_c)::value;
      constexpr int smem = hopper_bwd_smem_bytes<T, D, kDq, kPipe>();
      opt_in_shared_memory<hopper_bwd_kernel<T, D, kDq, kPipe>>(smem);
      hopper_bwd_kernel<T, D, kDq, kPipe><<<grid, 3 * 128, smem, stream>>>(hp);
    };
    if (dq.acc)
      launch(std::true_type{}, std::integral_constant<int, 0>{});
    else if (pipelined)  // D == 128 (checked above); D = 64 would get the C7515-serialized build
      launch(std::false_type{}, std::integral_constant<int, D == 128 ? kHopperBwdPipeStages : 0>{});
    else
      launch(std::false_type{}, std::integral_constant<int, 0>{});
    ORTHROS_CUDA_LAUNCH_CHECK("hopper_bwd_kernel");
  });
}

namespace {

/// The fused backward's post-pass: one CTA of 128 threads per (64-row block, KV head, sequence).
/// Per 64-column half: thread t reads the floats of register-order position t (DqAccumulator),
/// rows 16 (t / 32) + (t % 32) / 4 and + 8, columns 8 j + 2 (t % 4) and + 1, scales and rounds
/// them into a row-major tile in shared memory; then each row's 64 values go out as eight 16-byte
/// stores of consecutive threads (whole 32-byte sectors, where the register order's 4-byte
/// stores wrote half sectors).
template <typename T, int D>
__global__ void __launch_bounds__(128) hopper_dq_convert_kernel(const BwdParams p, const DqAccumulator dq,
                                                                 int max_base_blocks) {
  constexpr int kPitch = 64 + 8;  // elements per tile row: 144 bytes, so neither phase has bank conflicts
  __shared__ alignas(16) T tile[BQ * kPitch];
  const KernelParams& f = p.f;
  const SeqDesc& sd = f.seq[blockIdx.z];
  const bool is_out = static_cast<int>(blockIdx.x) >= max_base_blocks;
  const int rb = is_out ? blockIdx.x - max_base_blocks : blockIdx.x, kvh = blockIdx.y, group = f.group;
  const int nrows = (is_out ? sd.T_out : sd.T) * group;
  if (rb * BQ >= nrows) return;
  const float4* chunk = reinterpret_cast<const float4*>(dq_acc_chunk(dq, f, sd, is_out, rb, kvh));
  T* dst = static_cast<T*>(is_out ? p.dq_out : p.dq);
  const int qoff = is_out ? sd.out_off : sd.q_off;
  const int t = threadIdx.x, lane = t & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int h = 0; h < D / 64; ++h) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float4 v = chunk[(h * 8 + j) * 128 + t];
      const int rl = (t >> 5) * 16 + g, col = 8 * j + 2 * c;
      *reinterpret_cast<uint32_t*>(tile + rl * kPitch + col) = Mma<T>::pack(__fmul_rn(v.x, p.scale), __fmul_rn(v.y, p.scale));
      *reinterpret_cast<uint32_t*>(tile + (rl + 8) * kPitch + col) =
          Mma<T>::pack(__fmul_rn(v.z, p.scale), __fmul_rn(v.w, p.scale));
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < BQ / 16; ++i) {
      const int rl = t / 8 + 16 * i, r = rb * BQ + rl;
      if (r >= nrows) continue;
      const int tok = p.group_div.div(r);
      const size_t row = ((size_t)(qoff + tok) * f.Hq + kvh * group + (r - tok * group)) * D;
      *reinterpret_cast<uint4*>(dst + row + h * 64 + (t % 8) * 8) =
          *reinterpret_cast<const uint4*>(tile + rl * kPitch + (t % 8) * 8);
    }
    __syncthreads();
  }
}

}  // namespace

void launch_hopper_dq_convert(DType dtype, const BwdParams& bp, const DqAccumulator& dq, int max_base_blocks,
                              dim3 grid, cudaStream_t stream) {
  dispatch_hopper_types(dtype, bp.f.D, "Hopper dq post-pass", [&](auto t, auto d) {
    using T = typename decltype(t)::type;
    constexpr int D = decltype(d)::value;
    if (grid.x == 0) return;
    hopper_dq_convert_kernel<T, D><<<grid, 128, 0, stream>>>(bp, dq, max_base_blocks);
    ORTHROS_CUDA_LAUNCH_CHECK("hopper_dq_convert_kernel");
  });
}

}  // namespace orthros::cuda::detail
