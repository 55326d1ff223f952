// The tensor-core backward dq kernel (bf16/f16, D = 64/128).
#pragma once

#include "backward/delta_kernel.cuh"
#include "common/mma_tiles.cuh"
#include "common/tile_config.cuh"
#include "common/tile_loaders.cuh"
#include "forward/online_softmax.cuh"
#include "forward/work.cuh"

#include <cstdint>
#include <type_traits>

namespace orthros::cuda::detail {

// ---- tensor-core dq (bf16/f16, D = 64/128) --------------------------------------------------
// 4 warps x 16 rows (BM = 64), KV tiles of 64 keys in a 2-deep cp.async ring (the forward's
// decomposition, make_work<64, 64>). Per tile and warp: S = Q K^T and dP = dO V^T (mma), then
// P = exp2(S s log2e - lse2) masked to the row's range, dS = P (dP - Δ), dq += dS K (mma with dS
// packed to the dtype as the A operand). dq = s * acc, rounded once.

/// Shared memory of mma_bwd_dq_kernel: the row block's Q and dO, and a kBwdDqStages-deep ring of
/// K and V tiles, each [rows][D] swizzled (swz). The launch reserves sizeof of it.
template <typename T, int D>
struct BwdDqSmem {
  T q[kBwdDqBM * D];
  T d_o[kBwdDqBM * D];
  T k[kBwdDqStages][kBwdBN * D];
  T v[kBwdDqStages][kBwdBN * D];
};

template <typename T, int D>
__global__ void __launch_bounds__(128) mma_bwd_dq_kernel(const __grid_constant__ BwdParams p) {
  constexpr int NW = 4, BM = kBwdDqBM, BN = kBwdBN, NT = BN / 8, DT = D / 8, ST = kBwdDqStages;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  auto& smem = *reinterpret_cast<BwdDqSmem<T, D>*>(smem_raw);
  T* sQ = smem.q;
  T* sdO = smem.d_o;
  T* sK = smem.k[0];
  T* sV = smem.v[0];
  const KernelParams& f = p.f;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const SeqDesc& sd = f.seq[blockIdx.z];
  const int kvh = blockIdx.x % f.Hkv;  // KV head fastest: every head's longest blocks start first
  const Work w = make_work_at<BM, BN>(f, sd, blockIdx.x / f.Hkv);
  if (!w.valid) return;
  const T* qsrc = static_cast<const T*>(w.is_out ? f.q_out : f.q);
  const T* dosrc = static_cast<const T*>(w.is_out ? p.dO_out : p.dO);
  const int qoff = w.is_out ? sd.out_off : sd.q_off;
  const T* kg = static_cast<const T*>(f.k) + sd.kv_base + (size_t)kvh * D;
  const T* vg = static_cast<const T*>(f.v) + sd.kv_base + (size_t)kvh * D;
  const size_t kv_row = (size_t)f.Hkv * D;
  const int r0 = w.rb * BM, r1 = min(w.nrows, r0 + BM) - 1;
  const int ntiles = w.te >= w.tb ? w.te - w.tb + 1 : 0;

  load_q_tile<BM, D>(f, GroupDiv{f.group}, qoff, kvh, r0, r1, tid, NW * 32, Swizzle<D>{},
                     [&](int dst, bool ok, const auto& off_of) {
                       const size_t off = ok ? off_of() : 0;
                       cp_async16(sQ + dst, qsrc + off, ok);
                       cp_async16(sdO + dst, dosrc + off, ok);
                     });
  cp_async_commit();
  auto load_kv = [&](int tile, int buf) {
    load_kv_tile<BN, D>(sK + buf * BN * D, sV + buf * BN * D, kg, vg, (long long)tile * BN,
                        [&](long long n) { return n < sd.cache_len; }, kv_row, tid, NW * 32, Swizzle<D>{});
  };
  if (ntiles > 0) load_kv(w.tb, 0);
  cp_async_commit();

  const int wr0 = r0 + warp * 16, wr1 = min(r1, wr0 + 15);
  const bool wactive = wr0 <= r1;
  const int g = lane >> 2, c = lane & 3;
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
  const int wtb = wactive ? row_lo(f, w, wr0) / BN : 1, wte = wactive ? row_hi(f, w, wr1) / BN : 0;
  float acc[DT][4];
#pragma unroll
  for (int j = 0; j < DT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;

  for (int it = 0; it < ntiles; ++it) {
    const int tt = w.tb + it;
    cp_async_wait<0>();  // Q, dO and tile `it` have landed (2-deep ring: the next load starts now)
    __syncthreads();     // ... for every thread; everyone is done with tile it-1's buffer
    if (it + 1 < ntiles) load_kv(tt + 1, (it + 1) % ST);
    cp_async_commit();
    if (!(wactive && tt >= wtb && tt <= wte)) continue;
    const T* kb = sK + (it % ST) * BN * D;
    const T* vb = sV + (it % ST) * BN * D;
    float s[NT][4], dp[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qa[4], da[4];
      ldsm_x4(qa, sQ + frag_a<D>(warp * 16, kk, lane));
      ldsm_x4(da, sdO + frag_a<D>(warp * 16, kk, lane));
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        uint32_t b[4];
        ldsm_x4(b, kb + frag_b_nk<D>(np * 16, kk, lane));
        Mma<T>::run(s[2 * np], qa, b[0], b[1]);
        Mma<T>::run(s[2 * np + 1], qa, b[2], b[3]);
        ldsm_x4(b, vb + frag_b_nk<D>(np * 16, kk, lane));
        Mma<T>::run(dp[2 * np], da, b[0], b[1]);
        Mma<T>::run(dp[2 * np + 1], da, b[2], b[3]);
      }
    }
    const int kbase = tt * BN + 2 * c;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1, n = kbase + j * 8 + (e & 1);
        float pe = fast_exp2(__fmaf_rn(s[j][e], f.scale_log2, -lse2[h]));
        if (n < lo[h] || n > hi[h]) pe = 0.f;
        // dS; a row that sees one key has dS = 0 exactly (SPEC §9: w = 1 adds nothing to dq)
        s[j][e] = lo[h] == hi[h] ? 0.f : __fmul_rn(pe, __fsub_rn(dp[j][e], dl[h]));
      }
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[4];
      pack_a<T>(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int dq = 0; dq < D / 16; ++dq) {
        uint32_t b[4];
        ldsm_x4_t(b, kb + frag_b_kn<D>(kk * 16, dq, lane));
        Mma<T>::run(acc[2 * dq], a, b[0], b[1]);
        Mma<T>::run(acc[2 * dq + 1], a, b[2], b[3]);
      }
    }
  }
  cp_async_wait<0>();
  if (!wactive) return;
  T* dst0 = static_cast<T*>(w.is_out ? p.dq_out : p.dq);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = wr0 + g + 8 * h;
    if (r > r1) continue;
    T* dst = dst0 + ((size_t)(qoff + r / f.group) * f.Hq + kvh * f.group + r % f.group) * D;
#pragma unroll
    for (int j = 0; j < DT; ++j) {
      const uint32_t v = Mma<T>::pack(__fmul_rn(acc[j][2 * h], p.scale), __fmul_rn(acc[j][2 * h + 1], p.scale));
      *reinterpret_cast<uint32_t*>(dst + j * 8 + 2 * c) = v;
    }
  }
}


}  // namespace orthros::cuda::detail
