// Hopper (sm_90a) query-outer dq kernel of the Orthros attention backward (SPEC §9):
// warp-specialized, wgmma, the forward Hopper kernel's decomposition (forward/attention_hopper.cu).
//
// One CTA = one row block of 192 rows ((token, query head of the group) pairs; NWG = 3 consumer
// warpgroups of 64 rows) of one KV head and sequence, and the KV tiles of its rows' key ranges
// (make_work_at: base rows the window band, output rows the causal prefix), plus one producer
// warp:
//   producer warp: Q and dO of the block once (TMA boxes of whole tokens x the group's heads;
//     cp.async with zero-fill when the group does not divide 64), then its K/V tiles into a
//     STAGES-deep ring (TMA for tiles inside the sequence, cp.async with zero-fill for the last,
//     partial one: the cache slack may hold anything).
//   consumer warpgroup, per KV tile:
//     S = Q K^T, dP = dO V^T      wgmma, both operands in shared memory
//     P = exp2(S s log2e - lse2), masked to each row's keys (computed while dP runs);
//     dS = P (dP - Δ), 0 for a row that sees one key
//     dq += dS K                  wgmma, dS from registers, K transposed
//   dq = s * acc, rounded once. The arithmetic is the mma.sync dq kernel's (mma_dq_kernel.cuh).
// Every dq element is written once after a fixed sequence of operations that depends only on its
// row's key range and the absolute 64-key tile boundaries: no atomics, bitwise reproducible and
// batch-invariant. Used by both modes next to the KV-block-outer wgmma kernel (dk/dv).
#include "backward/attention_backward_hopper.hpp"
#include "common/hopper_launch.hpp"
#include "common/hopper_primitives.cuh"
#include "common/tile_loaders.cuh"
#include "forward/attention_hopper.hpp"
#include "forward/work.cuh"

#include <cuda.h>

namespace orthros::cuda::detail {

namespace {

constexpr int NWG = kHopperConsumers, BM = kHopperWarpgroupRows * NWG, BN = kKeyTile, STAGES = kHopperDqStages;

/// Shared memory of hopper_dq_kernel (tiles 1024-byte aligned, 128-byte swizzle): the row block's
/// Q and dO ([BM][D] as D/64 column blocks of [BM][64]) and the K/V ring ([64][D] likewise).
template <typename T, int D>
struct HopperDqSmem {
  T q[BM * D];
  T d_o[BM * D];
  T k[STAGES][BN * D];
  T v[STAGES][BN * D];
  uint64_t q_full, full[STAGES], empty[STAGES];
};

struct HopperDqParams {
  BwdParams b;                           // b.f.max_out_blocks counts blocks of BM rows
  CUtensorMap tm_k, tm_v;                // [kv rows][H_kv * D], box 64 x 64
  CUtensorMap tm_q, tm_qo, tm_do, tm_doo;  // [tokens][H_q][D], box 64 x group x (BM / group)
  int tma_kv, tma_q;                     // 0: cp.async
};

template <typename T, int D>
__global__ void __launch_bounds__((NWG + 1) * 128, 1) hopper_dq_kernel(const __grid_constant__ HopperDqParams hp) {
  constexpr int NT = BN / 8, DT = D / 8;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base =
      smem_raw + ((1024 - (static_cast<unsigned>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u);
  auto& sm = *reinterpret_cast<HopperDqSmem<T, D>*>(base);
  const BwdParams& p = hp.b;
  const KernelParams& f = p.f;
  const SeqDesc& sd = f.seq[blockIdx.z];
  const int kvh = blockIdx.x % f.Hkv;  // KV head fastest: every head's longest blocks start first
  const Work w = make_work_at<BM, BN>(f, sd, blockIdx.x / f.Hkv);
  if (!w.valid) return;
  const int r0 = w.rb * BM, r1 = min(w.nrows, r0 + BM) - 1;
  const int qoff = w.is_out ? sd.out_off : sd.q_off;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (tid == 0) {
    // One arrival per lane of the producer warp: a plain one (lane 0's announcing the TMA bytes)
    // for a TMA load, the cp.async arrival for a cp.async load.
    mbar_init(&sm.q_full, 32);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&sm.full[s], 32);
      mbar_init(&sm.empty[s], NWG * 128);
    }
  }
  __syncthreads();

  if (warp >= NWG * 4) {
    // ---------------- producer warpgroup: its first warp loads ----------------
    setmaxnreg_dec<kHopperProducerRegs>();
    if (warp != NWG * 4) return;
    if (hp.tma_q) {
      if (lane == 0) {
        mbar_arrive_expect_tx(&sm.q_full, 2 * BM * D * sizeof(T));
        const int tok0 = qoff + p.group_div.div(r0);
#pragma unroll
        for (int cb = 0; cb < D / 64; ++cb) {
          tma_load_3d(sm.q + cb * BM * 64, w.is_out ? &hp.tm_qo : &hp.tm_q, cb * 64, kvh * f.group, tok0, &sm.q_full);
          tma_load_3d(sm.d_o + cb * BM * 64, w.is_out ? &hp.tm_doo : &hp.tm_do, cb * 64, kvh * f.group, tok0,
                      &sm.q_full);
        }
      } else {
        mbar_arrive(&sm.q_full);
      }
    } else {
      const T* qsrc = static_cast<const T*>(w.is_out ? f.q_out : f.q);
      const T* dosrc = static_cast<const T*>(w.is_out ? p.dO_out : p.dO);
      load_q_tile<BM, D>(f, GroupFastDiv{p.group_div, f.group}, qoff, kvh, r0, r1, lane, 32, Sw128<BM>{},
                         [&](int dst, bool ok, const auto& off_of) {
                           const size_t off = ok ? off_of() : 0;
                           cp_async16(sm.q + dst, qsrc + off, ok);
                           cp_async16(sm.d_o + dst, dosrc + off, ok);
                         });
      mbar_arrive_cp_async(&sm.q_full);
    }
    const size_t kv_row = (size_t)f.Hkv * D;
    const T* kg = static_cast<const T*>(f.k) + sd.kv_base + (size_t)kvh * D;
    const T* vg = static_cast<const T*>(f.v) + sd.kv_base + (size_t)kvh * D;
    const int kv_row0 = static_cast<int>(sd.kv_base / (long long)kv_row);  // the sequence's first cache row
    for (int tt = w.tb, ring = 0; tt <= w.te; ++tt, ++ring) {
      const int s = ring % STAGES;
      mbar_wait(&sm.empty[s], ((ring / STAGES) & 1) ^ 1);
      if (hp.tma_kv && (long long)tt * BN + BN <= sd.cache_len) {
        if (lane == 0) {
          mbar_arrive_expect_tx(&sm.full[s], 2 * BN * D * sizeof(T));
#pragma unroll
          for (int cb = 0; cb < D / 64; ++cb) {
            tma_load_2d(sm.k[s] + cb * BN * 64, &hp.tm_k, kvh * D + cb * 64, kv_row0 + tt * BN, &sm.full[s]);
            tma_load_2d(sm.v[s] + cb * BN * 64, &hp.tm_v, kvh * D + cb * 64, kv_row0 + tt * BN, &sm.full[s]);
          }
        } else {
          mbar_arrive(&sm.full[s]);
        }
      } else {
        load_kv_tile<BN, D>(sm.k[s], sm.v[s], kg, vg, (long long)tt * BN,
                            [&](long long n) { return n < sd.cache_len; }, kv_row, lane, 32, Sw128<BN>{});
        mbar_arrive_cp_async(&sm.full[s]);
      }
    }
    cp_async_wait<0>();
    return;
  }

  // ---------------- consumer warpgroups ----------------
  setmaxnreg_inc<kHopperConsumerRegs>();
  const int wg = warp >> 2, wl = warp & 3, g = lane >> 2, c = lane & 3;
  const int gr0 = r0 + wg * kHopperWarpgroupRows, gr1 = min(r1, gr0 + kHopperWarpgroupRows - 1);
  const bool gactive = gr0 <= r1;
  const int gtb = gactive ? row_lo(f, w, gr0) / BN : 1, gte = gactive ? row_hi(f, w, gr1) / BN : 0;
  const int wr0 = gr0 + wl * 16;  // this warp's rows
  int lo[2], hi[2];
  float lse2[2], dl[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const DqRow row = dq_row(p, sd, w, kvh, wr0 + g + 8 * h, r1);
    lo[h] = row.lo;
    hi[h] = row.hi;
    lse2[h] = row.lse2;
    dl[h] = row.delta;
  }
  float acc[DT][4];
#pragma unroll
  for (int j = 0; j < DT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
  // This warpgroup's 64 rows of Q and dO in each column block (A operands, K-major).
  const uint64_t desc_q = desc_sw128(sm.q + wg * 64 * 64, 16, 1024);
  const uint64_t desc_do = desc_sw128(sm.d_o + wg * 64 * 64, 16, 1024);
  mbar_wait(&sm.q_full, 0);
  if (!hp.tma_q) fence_proxy_async();  // Q/dO came through cp.async (generic proxy)
  for (int tt = w.tb, ring = 0; tt <= w.te; ++tt, ++ring) {
    const int s = ring % STAGES;
    mbar_wait(&sm.full[s], (ring / STAGES) & 1);
    if (gactive && tt >= gtb && tt <= gte) {
      if (!hp.tma_kv || (long long)tt * BN + BN > sd.cache_len) fence_proxy_async();  // a cp.async tile
      const uint64_t dk = desc_sw128(sm.k[s], 16, 1024), dv = desc_sw128(sm.v[s], 16, 1024);
      float sacc[NT][4], pacc[NT][4];
      // G1 S = Q K^T, G2 dP = dO V^T (B operands K-major: [keys][D])
      wgmma_fence();
      wgmma_ss_over_d<T, D, BM, BN>(sacc, desc_q, dk);
      wgmma_commit();
      wgmma_ss_over_d<T, D, BM, BN>(pacc, desc_do, dv);
      wgmma_commit();
      // P, masked to each row's keys, while G2 runs
      wgmma_wait<1>();
      fence_regs(sacc);
      const int kbase = tt * BN + 2 * c;
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e >> 1, n = kbase + j * 8 + (e & 1);
          float pe = fast_exp2(__fmaf_rn(sacc[j][e], f.scale_log2, -lse2[h]));
          if (n < lo[h] || n > hi[h]) pe = 0.f;
          sacc[j][e] = pe;
        }
      wgmma_wait<0>();
      fence_regs(pacc);
      // dS; a row that sees one key has dS = 0 exactly (SPEC §9: w = 1 adds nothing to dq)
      uint32_t a[BN / 16][4];
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e >> 1;
          pacc[j][e] = lo[h] == hi[h] ? 0.f : __fmul_rn(sacc[j][e], __fsub_rn(pacc[j][e], dl[h]));
        }
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) pack_a<T>(a[kk], pacc[2 * kk], pacc[2 * kk + 1]);
      // G3 dq += dS K (K transposed: MN-major [keys][D])
      const uint64_t dk_mn = desc_sw128(sm.k[s], BN * 128, 1024);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) wgmma_rs_tb<T, D>(acc, a[kk], desc_advance(dk_mn, kk * 16 * 64 * sizeof(T)), 1);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(a);
      fence_regs(acc);
    }
    mbar_arrive(&sm.empty[s]);
  }
  if (!gactive) return;
  T* dst0 = static_cast<T*>(w.is_out ? p.dq_out : p.dq);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = wr0 + g + 8 * h;
    if (r > r1) continue;
    const int tok = p.group_div.div(r);
    T* dst = dst0 + ((size_t)(qoff + tok) * f.Hq + kvh * f.group + (r - tok * f.group)) * D;
#pragma unroll
    for (int j = 0; j < DT; ++j)
      *reinterpret_cast<uint32_t*>(dst + j * 8 + 2 * c) =
          Mma<T>::pack(__fmul_rn(acc[j][2 * h], p.scale), __fmul_rn(acc[j][2 * h + 1], p.scale));
  }
}

}  // namespace

void launch_hopper_backward_dq(DType dtype, const BwdParams& bp, const HopperGeometry& geo, dim3 grid,
                               cudaStream_t stream) {
  dispatch_hopper_types(dtype, bp.f.D, "Hopper dq kernel", [&](auto t, auto d) {
    using T = typename decltype(t)::type;
    constexpr int D = decltype(d)::value;
    if (grid.x == 0) return;
    HopperDqParams hp{};
    hp.b = bp;
    hp.tma_kv = encode_kv_cache_maps(&hp.tm_k, &hp.tm_v, dtype, bp.f, geo.kv_rows, BN);
    hp.tma_q = encode_bwd_query_maps(dtype, bp, geo, BM, &hp.tm_q, &hp.tm_do, &hp.tm_qo, &hp.tm_doo);
    constexpr int smem = static_cast<int>(sizeof(HopperDqSmem<T, D>)) + 1024;  // +1024: alignment
    opt_in_shared_memory<hopper_dq_kernel<T, D>>(smem);
    hopper_dq_kernel<T, D><<<grid, (NWG + 1) * 128, smem, stream>>>(hp);
    ORTHROS_CUDA_LAUNCH_CHECK("hopper_dq_kernel");
  });
}

}  // namespace orthros::cuda::detail
