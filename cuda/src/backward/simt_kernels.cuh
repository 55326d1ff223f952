// The SIMT backward kernels (f32, and head dimensions other than 64/128): dq and dk/dv.
#pragma once

#include "backward/delta_kernel.cuh"
#include "common/tile_config.cuh"
#include "forward/work.cuh"

#include <cstdint>
#include <type_traits>

namespace orthros::cuda::detail {

// ---- SIMT dq (f32, other D) -----------------------------------------------------------------
// One warp per row (4 rows per CTA), KV tiles of 32 keys: lane j scores key j of the tile
// (s, P, dP, dS), then dq[d] (lane d, d+32, ...) accumulates dS_j k_j[d] over j ascending.

template <typename T>
__global__ void __launch_bounds__(kSimtBwdWarps * 32) simt_bwd_dq_kernel(const __grid_constant__ BwdParams p) {
  constexpr int BM = kSimtBwdWarps, BN = kSimtBwdBN;
  __shared__ float sq[kSimtBwdWarps][256], sdo[kSimtBwdWarps][256];
  const KernelParams& f = p.f;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const SeqDesc& sd = f.seq[blockIdx.z];
  const int kvh = blockIdx.x % f.Hkv;  // KV head fastest: every head's longest blocks start first
  const Work w = make_work_at<BM, BN>(f, sd, blockIdx.x / f.Hkv);
  if (!w.valid) return;
  const int D = f.D, Hq = f.Hq;
  const int r = w.rb * BM + warp;
  if (r >= w.nrows) return;
  const int i = r / f.group, head = kvh * f.group + r % f.group;
  const int qoff = w.is_out ? sd.out_off : sd.q_off;
  const size_t roff = ((size_t)(qoff + i) * Hq + head) * D;
  const T* qrow = static_cast<const T*>(w.is_out ? f.q_out : f.q) + roff;
  const T* dorow = static_cast<const T*>(w.is_out ? p.dO_out : p.dO) + roff;
  for (int d = lane; d < D; d += 32) {
    sq[warp][d] = Elem<T>::to_f(qrow[d]);
    sdo[warp][d] = Elem<T>::to_f(dorow[d]);
  }
  __syncwarp();
  const long long ridx = bwd_row_index(p, sd, w.is_out, i, head);
  const float lse2 = p.lse2[ridx], dl = p.delta[ridx];
  const T* kg = static_cast<const T*>(f.k) + sd.kv_base + (size_t)kvh * D;
  const T* vg = static_cast<const T*>(f.v) + sd.kv_base + (size_t)kvh * D;
  const size_t kv_row = (size_t)f.Hkv * D;
  const int lo = row_lo(f, w, r), hi = row_hi(f, w, r);
  float acc[kSimtBwdMaxDpl];
#pragma unroll
  for (int k = 0; k < kSimtBwdMaxDpl; ++k) acc[k] = 0.f;
  for (int tt = lo / BN; tt <= hi / BN; ++tt) {
    const int n = tt * BN + lane;
    float ds = 0.f;
    if (n >= lo && n <= hi) {
      const T* kr = kg + (size_t)n * kv_row;
      const T* vr = vg + (size_t)n * kv_row;
      float dot = 0.f, dp = 0.f;
      for (int d = 0; d < D; ++d) {
        dot = __fadd_rn(dot, __fmul_rn(sq[warp][d], Elem<T>::to_f(kr[d])));
        dp = __fadd_rn(dp, __fmul_rn(sdo[warp][d], Elem<T>::to_f(vr[d])));
      }
      const float pj = bwd_prob<T>(dot, f, p.scale, lse2);
      ds = lo == hi ? 0.f : __fmul_rn(pj, __fsub_rn(dp, dl));  // one key: dS = 0 exactly
    }
    const int jb = max(lo - tt * BN, 0), je = min(hi - tt * BN, BN - 1);
    for (int j = jb; j <= je; ++j) {
      const float dsj = __shfl_sync(0xffffffffu, ds, j);
      const T* kr = kg + (size_t)(tt * BN + j) * kv_row;
#pragma unroll
      for (int k = 0; k < kSimtBwdMaxDpl; ++k) {
        const int d = lane + 32 * k;
        if (d < D) acc[k] = __fadd_rn(acc[k], __fmul_rn(dsj, Elem<T>::to_f(kr[d])));
      }
    }
  }
  T* dst = static_cast<T*>(w.is_out ? p.dq_out : p.dq) + roff;
#pragma unroll
  for (int k = 0; k < kSimtBwdMaxDpl; ++k) {
    const int d = lane + 32 * k;
    if (d < D) dst[d] = Elem<T>::from_f(__fmul_rn(acc[k], p.scale));
  }
}

// ---- SIMT dk/dv (f32, other D) --------------------------------------------------------------
// One warp per (key row j, KV head), 4 keys per CTA. For each query head of the group
// (ascending), base rows then output rows that see j, 32 at a time: lane = query row computes
// P and dS; then every lane accumulates dk[d] += dS_i q_i[d], dv[d] += P_i dO_i[d] over i ascending.
template <typename T>
__global__ void __launch_bounds__(kSimtBwdWarps * 32) simt_bwd_dkdv_kernel(const __grid_constant__ BwdParams p) {
  const KernelParams& f = p.f;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const SeqDesc& sd = f.seq[blockIdx.z];
  const int kvh = blockIdx.x % f.Hkv;  // KV head fastest (longest keys first, all heads)
  const int j = blockIdx.x / f.Hkv * kSimtBwdWarps + warp;
  if (j >= sd.cache_len) return;
  const int D = f.D, Hq = f.Hq, group = f.group;
  const T* kr = static_cast<const T*>(f.k) + sd.kv_base + ((size_t)j * f.Hkv + kvh) * D;
  const T* vr = static_cast<const T*>(f.v) + sd.kv_base + ((size_t)j * f.Hkv + kvh) * D;
  __shared__ float sk[kSimtBwdWarps][256], sv[kSimtBwdWarps][256];
  for (int d = lane; d < D; d += 32) {
    sk[warp][d] = Elem<T>::to_f(kr[d]);
    sv[warp][d] = Elem<T>::to_f(vr[d]);
  }
  __syncwarp();
  // One accumulator per (head, stream), added per head: the oracle's order (shorter chains).
  float dk[kSimtBwdMaxDpl], dv[kSimtBwdMaxDpl], hk[2][kSimtBwdMaxDpl], hv[2][kSimtBwdMaxDpl];
#pragma unroll
  for (int k = 0; k < kSimtBwdMaxDpl; ++k) dk[k] = dv[k] = 0.f;
  const long long fpb = sd.cache_len - sd.T, fpo = sd.cache_len - sd.T_out;  // first positions
  for (int g = 0; g < group; ++g) {
    const int head = kvh * group + g;
#pragma unroll
    for (int k = 0; k < kSimtBwdMaxDpl; ++k) hk[0][k] = hk[1][k] = hv[0][k] = hv[1][k] = 0.f;
#pragma unroll
    for (int st = 0; st < 2; ++st) {
      const bool is_out = st == 1;
      int i_lo, i_hi;
      if (!is_out) {
        i_lo = (int)max(0LL, (long long)j - fpb);
        i_hi = (int)min((long long)sd.T - 1, (long long)j + f.window - 1 - fpb);
      } else {
        i_lo = (int)max(0LL, (long long)j - fpo);
        i_hi = sd.T_out - 1;
      }
      const T* qs = static_cast<const T*>(is_out ? f.q_out : f.q);
      const T* dos = static_cast<const T*>(is_out ? p.dO_out : p.dO);
      const int qoff = is_out ? sd.out_off : sd.q_off;
      for (int i0 = i_lo; i0 <= i_hi; i0 += 32) {
        const int i = i0 + lane;
        float pi = 0.f, ds = 0.f;
        if (i <= i_hi) {
          const size_t roff = ((size_t)(qoff + i) * Hq + head) * D;
          float dot = 0.f, dp = 0.f;
          for (int d = 0; d < D; ++d) {
            dot = __fadd_rn(dot, __fmul_rn(Elem<T>::to_f(qs[roff + d]), sk[warp][d]));
            dp = __fadd_rn(dp, __fmul_rn(Elem<T>::to_f(dos[roff + d]), sv[warp][d]));
          }
          const long long ridx = bwd_row_index(p, sd, is_out, i, head);
          pi = bwd_prob<T>(dot, f, p.scale, p.lse2[ridx]);
          const long long pos = (is_out ? fpo : fpb) + i;  // one key seen (pos 0, or w = 1): dS = 0 exactly
          const bool single = pos == 0 || (!is_out && f.window == 1);
          ds = single ? 0.f : __fmul_rn(pi, __fsub_rn(dp, p.delta[ridx]));
        }
        const int n = min(32, i_hi - i0 + 1);
        for (int u = 0; u < n; ++u) {
          const float pu = __shfl_sync(0xffffffffu, pi, u), du = __shfl_sync(0xffffffffu, ds, u);
          const size_t roff = ((size_t)(qoff + i0 + u) * Hq + head) * D;
#pragma unroll
          for (int k = 0; k < kSimtBwdMaxDpl; ++k) {
            const int d = lane + 32 * k;
            if (d < D) {
              hk[st][k] = __fadd_rn(hk[st][k], __fmul_rn(du, Elem<T>::to_f(qs[roff + d])));
              hv[st][k] = __fadd_rn(hv[st][k], __fmul_rn(pu, Elem<T>::to_f(dos[roff + d])));
            }
          }
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kSimtBwdMaxDpl; ++k) {
      dk[k] = __fadd_rn(dk[k], __fadd_rn(hk[0][k], hk[1][k]));
      dv[k] = __fadd_rn(dv[k], __fadd_rn(hv[0][k], hv[1][k]));
    }
  }
  const size_t ooff = ((size_t)(sd.q_off + j) * f.Hkv + kvh) * D;  // P = 0: packed row q_off + j
  T* dkp = static_cast<T*>(p.dk) + ooff;
  T* dvp = static_cast<T*>(p.dv) + ooff;
#pragma unroll
  for (int k = 0; k < kSimtBwdMaxDpl; ++k) {
    const int d = lane + 32 * k;
    if (d < D) {
      dkp[d] = Elem<T>::from_f(__fmul_rn(dk[k], p.scale));
      dvp[d] = Elem<T>::from_f(dv[k]);
    }
  }
}


}  // namespace orthros::cuda::detail
