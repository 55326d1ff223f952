// The SIMT forward kernel: f32, and head dimensions other than 64/128.
#pragma once

#include "common/tile_config.cuh"
#include "forward/work.cuh"

#include <cstdint>
#include <type_traits>

namespace orthros::cuda::detail {

// ---- SIMT kernel (f32, and D other than 64/128) ---------------------------------------------
// One warp per row, kSimtWarps rows per CTA; KV tiles of kSimtBN keys (lane j scores key j of the
// tile); lane j accumulates output dims j, j+32, ... (D <= 256). Sizes: common/tile_config.cuh.

template <typename T, bool DET>
__global__ void __launch_bounds__(kSimtWarps * 32) simt_attn_kernel(const __grid_constant__ KernelParams p) {
  constexpr int BM = kSimtWarps, BN = kSimtBN;
  __shared__ float sq[kSimtWarps][256];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const SeqDesc& sd = p.seq[blockIdx.z];
  const int kvh = blockIdx.y;
  const Work w = make_work<BM, BN>(p, sd);
  if (!w.valid) return;
  const int D = p.D, Hq = p.Hq;
  const int r = w.rb * BM + warp;
  if (r >= w.nrows) return;
  const int i = r / p.group, head = kvh * p.group + r % p.group;
  const T* qsrc = static_cast<const T*>(w.is_out ? p.q_out : p.q);
  const int qoff = w.is_out ? sd.out_off : sd.q_off;
  const T* qrow = qsrc + ((size_t)(qoff + i) * Hq + head) * D;
  for (int d = lane; d < D; d += 32) sq[warp][d] = Elem<T>::to_f(qrow[d]);
  __syncwarp();
  const T* kg = static_cast<const T*>(p.k) + sd.kv_base + (size_t)kvh * D;
  const T* vg = static_cast<const T*>(p.v) + sd.kv_base + (size_t)kvh * D;
  const size_t kv_row = (size_t)p.Hkv * D;
  const int lo = row_lo(p, w, r), hi = row_hi(p, w, r);
  const int tb = max(w.tb, lo / BN), te = min(w.te, hi / BN);

  float acc[kSimtMaxDpl], racc[DET ? kSimtMaxDpl : 1];
#pragma unroll
  for (int k = 0; k < kSimtMaxDpl; ++k) acc[k] = 0.f;
  if constexpr (DET) {
#pragma unroll
    for (int k = 0; k < kSimtMaxDpl; ++k) racc[k] = 0.f;
  }
  float m = kNegInf, l = 0.f, rm = kNegInf, rl = 0.f;
  int cur_chunk = -1;
  auto warp_sum = [&](float x) {
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
  };
  auto flush = [&]() {
    if constexpr (DET) {
      const float lf = warp_sum(l);
      const MergeCoeffs cf = merge_coeffs(rm, m);
      rl = merge_val(rl, lf, cf);
#pragma unroll
      for (int k = 0; k < kSimtMaxDpl; ++k) {
        racc[k] = merge_val(racc[k], acc[k], cf);
        acc[k] = 0.f;
      }
      rm = cf.m;
      m = kNegInf;
      l = 0.f;
    }
  };
  for (int tt = tb; tt <= te; ++tt) {
    if constexpr (DET) {
      if (!w.split) {
        const int chunk = tt / p.chunk_tiles;
        if (chunk != cur_chunk) {
          if (cur_chunk >= 0) flush();
          cur_chunk = chunk;
        }
      }
    }
    const int n = tt * BN + lane;
    float s2 = kNegInf;
    if (n >= lo && n <= hi) {
      const T* kr = kg + (size_t)n * kv_row;
      float dot = 0.f;
      for (int d = 0; d < D; ++d) dot = __fadd_rn(dot, __fmul_rn(sq[warp][d], Elem<T>::to_f(kr[d])));
      s2 = __fmul_rn(dot, p.scale_log2);
    }
    float mx = s2;
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const float mn = fmaxf(m, mx), muse = mn == kNegInf ? 0.f : mn;
    const float alpha = fast_exp2(__fsub_rn(m, muse));
    m = mn;
    const float pj = fast_exp2(__fsub_rn(s2, muse));
    l = __fadd_rn(__fmul_rn(l, alpha), pj);
#pragma unroll
    for (int k = 0; k < kSimtMaxDpl; ++k) acc[k] = __fmul_rn(acc[k], alpha);
    const int jb = max(lo - tt * BN, 0), je = min(hi - tt * BN, BN - 1);
    for (int j = jb; j <= je; ++j) {
      const float pjj = __shfl_sync(0xffffffffu, pj, j);
      const T* vr = vg + (size_t)(tt * BN + j) * kv_row;
#pragma unroll
      for (int k = 0; k < kSimtMaxDpl; ++k) {
        const int d = lane + 32 * k;
        if (d < D) acc[k] = __fadd_rn(acc[k], __fmul_rn(pjj, Elem<T>::to_f(vr[d])));
      }
    }
  }
  if (w.split) {
    const float lf = warp_sum(l);
    float* dst = partial_ptr(p, sd, i, head, w.sp);
    if (lane == 0) {
      dst[0] = m;
      dst[1] = lf;
    }
#pragma unroll
    for (int k = 0; k < kSimtMaxDpl; ++k) {
      const int d = lane + 32 * k;
      if (d < D) dst[2 + d] = acc[k];
    }
    return;
  }
  float fm, fl;
  if constexpr (DET) {
    flush();
    fm = rm;
    fl = rl;
#pragma unroll
    for (int k = 0; k < kSimtMaxDpl; ++k) acc[k] = racc[k];
  } else {
    fm = m;
    fl = warp_sum(l);
  }
  float* lptr = w.is_out ? p.lse_out : p.lse;
  const float inv = __frcp_rn(fl);
  const size_t off = ((size_t)(qoff + i) * Hq + head) * D;
  const auto store_row = [&](auto* dst) {
    using E = std::remove_pointer_t<decltype(dst)>;
#pragma unroll
    for (int k = 0; k < kSimtMaxDpl; ++k) {
      const int d = lane + 32 * k;
      if (d < D) dst[d] = Elem<E>::from_f(__fmul_rn(acc[k], inv));
    }
  };
  if (w.is_out && p.o_out_f32)  // float32 output stream (AttentionBuffers::o_out_float32)
    store_row(static_cast<float*>(p.o_out) + off);
  else
    store_row(static_cast<T*>(w.is_out ? p.o_out : p.o) + off);
  if (lane == 0 && lptr) lptr[(size_t)(qoff + i) * Hq + head] = state_lse(fm, fl);
}

}  // namespace orthros::cuda::detail
