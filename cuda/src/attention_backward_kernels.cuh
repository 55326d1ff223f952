// Backward kernels of the Orthros attention operator (SPEC §9; host side attention_backward.cu).
// FlashAttention-2 structure without atomics:
//   delta_kernel          Δ = rowsum(dO ⊙ O) and lse·log2(e), float32, one warp per (row, head)
//   *_bwd_dq_kernel       query-block-outer: dq / dq_out. Same work decomposition as the forward
//                         (make_work: rows = (token, query head of the group) pairs, KV tiles of
//                         the row block's band only); P recomputed from the saved LSE.
//   *_bwd_dkdv_kernel     KV-block-outer: dk / dv of one block of keys and one KV head; visits the
//                         base row blocks whose window covers the block, then the output row
//                         blocks at or after it; every query head of the group is a row, so the
//                         group's sum is part of one fixed accumulation order.
// Every output element is produced by one thread through a fixed sequence of operations that
// depends only on its own sequence (row blocks and key tiles are aligned to the sequence start),
// so results are bitwise reproducible and independent of the batch composition.
#pragma once

#include "attention_kernels.cuh"

#include <type_traits>

namespace orthros::cuda::detail {

struct BwdParams {
  KernelParams f;  // q, q_out, k, v (cache layout), o, o_out, lse, lse_out (inputs), seq table, dims
  const void* dO;
  const void* dO_out;
  void* dq;
  void* dq_out;
  void* dk;  // [sum T_b, H_kv, D] packed
  void* dv;
  float* delta;  // [total_q + total_out, H_q]: base rows first, then output rows
  float* lse2;   // same layout: lse * log2(e) (bf16/f16), lse itself (f32; see bwd_prob)
  long long total_q;
  float scale;  // softmax scale s
  FastDiv group_div;  // division by f.group
};

// ---- pre-pass -------------------------------------------------------------------------------
// One warp per (row, head) of both streams; lane sums d = lane, lane+32, ... then a fixed
// butterfly, so Δ is the same bits whichever launch computes it.
template <typename T>
__global__ void __launch_bounds__(256) delta_kernel(const T* __restrict__ o, const T* __restrict__ o_out,
                                                    const T* __restrict__ dO, const T* __restrict__ dO_out,
                                                    const float* __restrict__ lse, const float* __restrict__ lse_out,
                                                    float* __restrict__ delta, float* __restrict__ lse2,
                                                    long long total_q, long long total_rows, int Hq, int D) {
  const long long idx = blockIdx.x * 8LL + (threadIdx.x >> 5);  // (row, head) flat
  const int lane = threadIdx.x & 31;
  if (idx >= total_rows * Hq) return;
  const long long row = idx / Hq;
  const bool out = row >= total_q;
  const long long local = out ? idx - total_q * Hq : idx;  // (row, head) in its stream
  const T* a = (out ? o_out : o) + local * D;
  const T* b = (out ? dO_out : dO) + local * D;
  float s = 0.f;
  for (int d = lane; d < D; d += 32) s = __fadd_rn(s, __fmul_rn(Elem<T>::to_f(a[d]), Elem<T>::to_f(b[d])));
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, off));
  if (lane == 0) {
    delta[idx] = s;
    const float l = (out ? lse_out : lse)[local];
    lse2[idx] = std::is_same_v<T, float> ? l : __fmul_rn(l, kLog2e);  // see bwd_prob
  }
}

/// P = exp(s·dot − lse) of the SIMT kernels from the value the pre-pass stored. bf16/f16: the
/// forward's log2 domain (ex2.approx, like the tensor-core kernels). f32: the forward's own score
/// fl(dot · s·log2e) (the SIMT forward computes dot in the same order, so it is the same float)
/// minus lse·log2e formed in float64, then the accurate exp2f. Two f32 shortcuts measured worse:
/// lse·log2e rounded to float costs |lse2|·2^-24 in the exponent (several ulps of P), and the
/// natural-log form fma(dot, s, −lse) mixes the forward's s·log2e with s, a relative mismatch of
/// ~1e-7 that at |scores| ~ 200 is a 2e-5 relative error of P (dq_out rel_fro 1.05e-5 > 1e-5 in
/// LargeLogits).
template <typename T>
__device__ __forceinline__ float bwd_prob(float dot, const KernelParams& f, float scale, float l) {
  if constexpr (std::is_same_v<T, float>) {
    (void)scale;
    const double x = __dsub_rn(static_cast<double>(__fmul_rn(dot, f.scale_log2)),
                               __dmul_rn(static_cast<double>(l), 1.4426950408889634074));
    return exp2f(static_cast<float>(x));
  } else {
    return fast_exp2(__fmaf_rn(dot, f.scale_log2, -l));
  }
}

__device__ __forceinline__ long long bwd_row_index(const BwdParams& p, const SeqDesc& sd, bool is_out, int i,
                                                   int head) {
  const long long row = is_out ? p.total_q + sd.out_off + i : (long long)sd.q_off + i;
  return row * p.f.Hq + head;
}

// ---- SIMT dq (f32, other D) -----------------------------------------------------------------
// One warp per row (4 rows per CTA), KV tiles of 32 keys: lane j scores key j of the tile
// (s, P, dP, dS), then dq[d] (lane d, d+32, ...) accumulates dS_j k_j[d] over j ascending.
constexpr int kSimtBwdWarps = 4, kSimtBwdBN = 32, kSimtBwdMaxDpl = 8;

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

// ---- tensor-core dq (bf16/f16, D = 64/128) --------------------------------------------------
// 4 warps x 16 rows (BM = 64), KV tiles of 64 keys in a 2-deep cp.async ring (the forward's
// decomposition, make_work<64, 64>). Per tile and warp: S = Q K^T and dP = dO V^T (mma), then
// P = exp2(S s log2e - lse2) masked to the row's range, dS = P (dP - Δ), dq += dS K (mma with dS
// packed to the dtype as the A operand). dq = s * acc, rounded once.
constexpr int kBwdDqBM = 64, kBwdBN = 64;

template <typename T, int D>
__global__ void __launch_bounds__(128) mma_bwd_dq_kernel(const __grid_constant__ BwdParams p) {
  constexpr int NW = 4, BM = kBwdDqBM, BN = kBwdBN, CH = D / 8, NT = BN / 8, DT = D / 8, ST = 2;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sdO = sQ + BM * D;
  T* sK = sdO + BM * D;
  T* sV = sK + ST * BN * D;
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

  for (int idx = tid; idx < BM * CH; idx += NW * 32) {
    const int row = idx / CH, ch = idx % CH, r = r0 + row;
    const bool ok = r <= r1;
    const size_t off = ok ? ((size_t)(qoff + r / f.group) * f.Hq + kvh * f.group + r % f.group) * D + ch * 8 : 0;
    cp_async16(sQ + swz<D>(row, ch), qsrc + off, ok);
    cp_async16(sdO + swz<D>(row, ch), dosrc + off, ok);
  }
  cp_async_commit();
  auto load_kv = [&](int tile, int buf) {
    T* dk = sK + buf * BN * D;
    T* dv = sV + buf * BN * D;
    for (int idx = tid; idx < BN * CH; idx += NW * 32) {
      const int row = idx / CH, ch = idx % CH;
      const long long n = (long long)tile * BN + row;
      const bool ok = n < sd.cache_len;
      const size_t off = ok ? (size_t)n * kv_row + ch * 8 : 0;
      cp_async16(dk + swz<D>(row, ch), kg + off, ok);
      cp_async16(dv + swz<D>(row, ch), vg + off, ok);
    }
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
    const int r = wr0 + g + 8 * h;
    const bool ok = r <= r1;
    lo[h] = ok ? row_lo(f, w, r) : 1;
    hi[h] = ok ? row_hi(f, w, r) : 0;
    lse2[h] = 0.f;
    dl[h] = 0.f;
    if (ok) {
      const long long ridx = bwd_row_index(p, sd, w.is_out, r / f.group, kvh * f.group + r % f.group);
      lse2[h] = p.lse2[ridx];
      dl[h] = p.delta[ridx];
    }
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

// ---- tensor-core dk/dv (bf16/f16, D = 64/128) -----------------------------------------------
// One CTA = 64 keys (4 warps x 16 keys) of one KV head; K/V stay in shared memory. It walks the
// row blocks (BQ rows = (token, query head) pairs, aligned to the sequence start) that see the
// keys: base blocks covering tokens [j0, j1 + w - 1], then output blocks from token j0 on; Q, dO,
// lse2, Δ and the rows' positions of the next block are prefetched (cp.async, 2 buffers) while
// the current one is computed. Per block and warp (transposed: keys are the M dimension):
// S^T = K Q^T, dP^T = V dO^T, P^T masked, dS^T = P^T (dP^T - Δ), dv += P^T dO, dk += dS^T Q.
template <int D>
struct BwdKvShape {
  static constexpr int BQ = D <= 64 ? 64 : 32;  // rows per step (registers: S^T and dP^T are 16 x BQ)
};

template <typename T, int D>
__global__ void __launch_bounds__(128) mma_bwd_dkdv_kernel(const __grid_constant__ BwdParams p) {
  constexpr int NW = 4, BN = kBwdBN, BQ = BwdKvShape<D>::BQ, CH = D / 8, NTQ = BQ / 8, DT = D / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);
  T* sV = sK + BN * D;
  T* sQ = sV + BN * D;       // [2][BQ][D]
  T* sdO = sQ + 2 * BQ * D;  // [2][BQ][D]
  float* sL = reinterpret_cast<float*>(sdO + 2 * BQ * D);  // [2][BQ] lse2
  float* sDl = sL + 2 * BQ;                                  // [2][BQ] Δ
  int* sPos = reinterpret_cast<int*>(sDl + 2 * BQ);          // [2][BQ] cache row of the row's token, -2^30 if none
  const KernelParams& f = p.f;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const SeqDesc& sd = f.seq[blockIdx.z];
  // KV head fastest: the key blocks that see the most rows (the first ones: every later output
  // row sees them) start first for every head (longest-first dispatch, a shorter tail).
  const int kvh = blockIdx.x % f.Hkv, group = f.group;
  const int j0 = blockIdx.x / f.Hkv * BN;
  if (j0 >= sd.cache_len) return;
  const int j1 = (int)min((long long)j0 + BN, sd.cache_len) - 1;
  const long long fpb = sd.cache_len - sd.T, fpo = sd.cache_len - sd.T_out;
  // Row ranges (rows r = token * group + g) of both streams that see keys [j0, j1].
  int nb_base = 0, rb_base0 = 0, nb_out = 0, rb_out0 = 0;
  {
    const long long i_lo = max(0LL, (long long)j0 - fpb);
    const long long i_hi = min((long long)sd.T - 1, (long long)j1 + f.window - 1 - fpb);
    if (i_lo <= i_hi) {
      rb_base0 = (int)(i_lo * group / BQ);
      nb_base = (int)(((i_hi + 1) * group - 1) / BQ) - rb_base0 + 1;
    }
    const long long o_lo = max(0LL, (long long)j0 - fpo);
    if (o_lo < sd.T_out) {
      rb_out0 = (int)(o_lo * group / BQ);
      nb_out = (int)(((long long)sd.T_out * group - 1) / BQ) - rb_out0 + 1;
    }
  }
  const int nb = nb_base + nb_out;
  const T* kg = static_cast<const T*>(f.k) + sd.kv_base + (size_t)kvh * D;
  const T* vg = static_cast<const T*>(f.v) + sd.kv_base + (size_t)kvh * D;
  const size_t kv_row = (size_t)f.Hkv * D;
  for (int idx = tid; idx < BN * CH; idx += NW * 32) {
    const int row = idx / CH, ch = idx % CH;
    const int n = j0 + row;
    const bool ok = n <= j1;
    const size_t off = ok ? (size_t)n * kv_row + ch * 8 : 0;
    cp_async16(sK + swz<D>(row, ch), kg + off, ok);
    cp_async16(sV + swz<D>(row, ch), vg + off, ok);
  }
  auto prefetch = [&](int it, int buf) {
    const bool is_out = it >= nb_base;
    const int rb = is_out ? rb_out0 + (it - nb_base) : rb_base0 + it;
    const int ntok = is_out ? sd.T_out : sd.T, nrows = ntok * group;
    const int qoff = is_out ? sd.out_off : sd.q_off;
    const T* qsrc = static_cast<const T*>(is_out ? f.q_out : f.q);
    const T* dosrc = static_cast<const T*>(is_out ? p.dO_out : p.dO);
    T* q_dst = sQ + buf * BQ * D;
    T* do_dst = sdO + buf * BQ * D;
    for (int idx = tid; idx < BQ * CH; idx += NW * 32) {
      const int row = idx / CH, ch = idx % CH, r = rb * BQ + row;
      const bool ok = r < nrows;
      const int tok = p.group_div.div(r);
      const size_t off = ok ? ((size_t)(qoff + tok) * f.Hq + kvh * group + (r - tok * group)) * D + ch * 8 : 0;
      cp_async16(q_dst + swz<D>(row, ch), qsrc + off, ok);
      cp_async16(do_dst + swz<D>(row, ch), dosrc + off, ok);
    }
    for (int row = tid; row < BQ; row += NW * 32) {
      const int r = rb * BQ + row;
      const bool ok = r < nrows;
      const int tok = p.group_div.div(r);
      const long long ridx = ok ? bwd_row_index(p, sd, is_out, tok, kvh * group + (r - tok * group)) : 0;
      cp_async4(sL + buf * BQ + row, p.lse2 + ridx, ok);
      cp_async4(sDl + buf * BQ + row, p.delta + ridx, ok);
      sPos[buf * BQ + row] = ok ? (int)((is_out ? fpo : fpb) + tok) : -(1 << 30);
    }
  };
  if (nb > 0) prefetch(0, 0);
  cp_async_commit();

  const int g = lane >> 2, c = lane & 3;
  const int kw0 = warp * 16;  // this warp's keys: j0 + kw0 .. j0 + kw0 + 15
  const int key[2] = {j0 + kw0 + g, j0 + kw0 + g + 8};
  const bool wactive = j0 + kw0 <= j1;
  const int wk_lo = j0 + kw0, wk_hi = min(j1, j0 + kw0 + 15);
  float dk[DT][4], dv[DT][4];
#pragma unroll
  for (int j = 0; j < DT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.f;

  for (int it = 0; it < nb; ++it) {
    if (it + 1 < nb) prefetch(it + 1, (it + 1) & 1);
    cp_async_commit();
    cp_async_wait<1>();  // K/V and block `it` have landed
    __syncthreads();
    const int buf = it & 1;
    const bool is_out = it >= nb_base;
    const T* qb = sQ + buf * BQ * D;
    const T* dob = sdO + buf * BQ * D;
    const float* lb = sL + buf * BQ;
    const float* db = sDl + buf * BQ;
    const int* pb = sPos + buf * BQ;
    // Does any row of the block see this warp's keys? (rows' positions are ascending; invalid
    // trailing rows have a negative sentinel, so take the last valid one)
    bool live = wactive;
    if (live) {
      const int pmin = pb[0];
      int pmax = pb[BQ - 1];
      if (pmax < 0) {
        const int rb = is_out ? rb_out0 + (it - nb_base) : rb_base0 + it;
        const int nrows = (is_out ? sd.T_out : sd.T) * group;
        pmax = pb[nrows - 1 - rb * BQ];
      }
      live = pmax >= wk_lo && (is_out || (long long)pmin - f.window + 1 <= wk_hi);
    }
    if (live) {
      float s[NTQ][4], dp[NTQ][4];
#pragma unroll
      for (int j = 0; j < NTQ; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t ka[4], va[4];
        ldsm_x4(ka, sK + frag_a<D>(kw0, kk, lane));
        ldsm_x4(va, sV + frag_a<D>(kw0, kk, lane));
#pragma unroll
        for (int np = 0; np < BQ / 16; ++np) {
          uint32_t b[4];
          ldsm_x4(b, qb + frag_b_nk<D>(np * 16, kk, lane));
          Mma<T>::run(s[2 * np], ka, b[0], b[1]);
          Mma<T>::run(s[2 * np + 1], ka, b[2], b[3]);
          ldsm_x4(b, dob + frag_b_nk<D>(np * 16, kk, lane));
          Mma<T>::run(dp[2 * np], va, b[0], b[1]);
          Mma<T>::run(dp[2 * np + 1], va, b[2], b[3]);
        }
      }
      // Output rows that all see all of this warp's keys (below the causal diagonal; every row
      // valid and past position 0): no mask, the common case of PT/SFT. Same arithmetic.
      const bool full = is_out && wk_hi == wk_lo + 15 && pb[BQ - 1] >= 0 && pb[0] >= wk_hi && pb[0] > 0;
      if (full) {
#pragma unroll
        for (int j = 0; j < NTQ; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = j * 8 + 2 * c + (e & 1);
            const float pe = fast_exp2(__fmaf_rn(s[j][e], f.scale_log2, -lb[col]));
            s[j][e] = pe;                                                 // P^T
            dp[j][e] = __fmul_rn(pe, __fsub_rn(dp[j][e], db[col]));  // dS^T
          }
      } else {
#pragma unroll
        for (int j = 0; j < NTQ; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = j * 8 + 2 * c + (e & 1), kp = key[e >> 1], pos = pb[col];
            const bool ok = kp <= pos && (is_out || (long long)(pos - kp) < f.window);
            float pe = fast_exp2(__fmaf_rn(s[j][e], f.scale_log2, -lb[col]));
            if (!ok) pe = 0.f;
            const bool single = pos == 0 || (!is_out && f.window == 1);  // the row sees one key: dS = 0
            s[j][e] = pe;                                                                   // P^T
            dp[j][e] = single ? 0.f : __fmul_rn(pe, __fsub_rn(dp[j][e], db[col]));  // dS^T
          }
      }
#pragma unroll
      for (int kk = 0; kk < BQ / 16; ++kk) {
        uint32_t pa[4], sa[4];
        pack_a<T>(pa, s[2 * kk], s[2 * kk + 1]);
        pack_a<T>(sa, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
        for (int dd = 0; dd < D / 16; ++dd) {
          uint32_t b[4];
          ldsm_x4_t(b, dob + frag_b_kn<D>(kk * 16, dd, lane));
          Mma<T>::run(dv[2 * dd], pa, b[0], b[1]);
          Mma<T>::run(dv[2 * dd + 1], pa, b[2], b[3]);
          ldsm_x4_t(b, qb + frag_b_kn<D>(kk * 16, dd, lane));
          Mma<T>::run(dk[2 * dd], sa, b[0], b[1]);
          Mma<T>::run(dk[2 * dd + 1], sa, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // everyone is done with buffer `buf` before the next prefetch reuses it
  }
  cp_async_wait<0>();
  if (!wactive) return;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int n = key[h];
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

}  // namespace orthros::cuda::detail
