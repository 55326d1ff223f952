// The tensor-core backward dk/dv kernel (bf16/f16, D = 64/128).
#pragma once

#include "backward/mma_dq_kernel.cuh"
#include "common/tile_loaders.cuh"

#include <cstdint>
#include <type_traits>

namespace orthros::cuda::detail {

// ---- tensor-core dk/dv (bf16/f16, D = 64/128) -----------------------------------------------
// One CTA = 64 keys (4 warps x 16 keys) of one KV head; K/V stay in shared memory. It walks the
// row blocks (BQ rows = (token, query head) pairs, aligned to the sequence start) that see the
// keys: base blocks covering tokens [j0, j1 + w - 1], then output blocks from token j0 on; Q, dO,
// lse2, Δ and the rows' positions of the next block are prefetched (cp.async, 2 buffers) while
// the current one is computed. Per block and warp (transposed: keys are the M dimension):
// S^T = K Q^T, dP^T = V dO^T, P^T masked, dS^T = P^T (dP^T - Δ), dv += P^T dO, dk += dS^T Q.

/// Shared memory of mma_bwd_dkdv_kernel: the CTA's K and V block, two buffers of the current and
/// next row block's Q, dO (swizzled [BQ][D]), lse2, Δ and the rows' cache positions (-2^30: no
/// row). The launch reserves sizeof of it.
template <typename T, int D>
struct BwdKvSmem {
  static constexpr int BQ = BwdKvShape<D>::BQ;
  T k[kBwdBN * D];
  T v[kBwdBN * D];
  T q[2][BQ * D];
  T d_o[2][BQ * D];
  float lse2[2][BQ];
  float delta[2][BQ];
  int pos[2][BQ];
};

template <typename T, int D>
__global__ void __launch_bounds__(128) mma_bwd_dkdv_kernel(const __grid_constant__ BwdParams p) {
  constexpr int NW = 4, BN = kBwdBN, BQ = BwdKvShape<D>::BQ, NTQ = BQ / 8, DT = D / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  auto& smem = *reinterpret_cast<BwdKvSmem<T, D>*>(smem_raw);
  T* sK = smem.k;
  T* sV = smem.v;
  T* sQ = smem.q[0];
  T* sdO = smem.d_o[0];
  float* sL = smem.lse2[0];
  float* sDl = smem.delta[0];
  int* sPos = smem.pos[0];
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
  load_kv_tile<BN, D>(sK, sV, kg, vg, j0, [&](int n) { return n <= j1; }, kv_row, tid, NW * 32, Swizzle<D>{});
  auto prefetch = [&](int it, int buf) {
    const bool is_out = it >= nb_base;
    const int rb = is_out ? rb_out0 + (it - nb_base) : rb_base0 + it;
    const int ntok = is_out ? sd.T_out : sd.T, nrows = ntok * group;
    const int qoff = is_out ? sd.out_off : sd.q_off;
    const T* qsrc = static_cast<const T*>(is_out ? f.q_out : f.q);
    const T* dosrc = static_cast<const T*>(is_out ? p.dO_out : p.dO);
    T* q_dst = sQ + buf * BQ * D;
    T* do_dst = sdO + buf * BQ * D;
    load_q_tile<BQ, D>(f, GroupFastDiv{p.group_div, group}, qoff, kvh, rb * BQ, nrows - 1, tid, NW * 32, Swizzle<D>{},
                       [&](int dst, bool ok, const auto& off_of) {
                         const size_t off = ok ? off_of() : 0;
                         cp_async16(q_dst + dst, qsrc + off, ok);
                         cp_async16(do_dst + dst, dosrc + off, ok);
                       });
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
