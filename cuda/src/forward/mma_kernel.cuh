// The tensor-core (mma.sync m16n8k16) forward kernel for bf16/f16, D = 64/128.
#pragma once

#include "common/mma_tiles.cuh"
#include "common/tile_config.cuh"
#include "common/tile_loaders.cuh"
#include "forward/chunk_merge.cuh"
#include "forward/epilogue.cuh"
#include "forward/work.cuh"

#include <cstdint>

namespace orthros::cuda::detail {

// ---- tensor-core kernel ---------------------------------------------------------------------
// NW warps per CTA, each warp MT m16 tiles (16*MT rows); KV tiles of kKeyTile keys in a STAGES-deep
// cp.async ring. MT = 2 halves the shared-memory reads of K/V per mma (the B fragments serve two
// m tiles); Q fragments then come from shared memory per k-step instead of registers.
/// Shared memory of mma_attn_kernel: the row block's Q and a STAGES-deep ring of K and V tiles,
/// each [rows][D] with swizzled 16-byte chunks (swz). The launch reserves sizeof of it.
template <typename T, int D, int BM, int STAGES>
struct MmaFwdSmem {
  T q[BM * D];
  T k[STAGES][kKeyTile * D];
  T v[STAGES][kKeyTile * D];
};

template <typename T, int D, int NW, int MT, int STAGES, bool DET>
__global__ void __launch_bounds__(NW * 32) mma_attn_kernel(const __grid_constant__ KernelParams p) {
  constexpr int WM = 16 * MT, BM = NW * WM, BN = kKeyTile, NT = BN / 8, DT = D / 8;
  constexpr bool QREG = (MT == 1);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  auto& smem = *reinterpret_cast<MmaFwdSmem<T, D, BM, STAGES>*>(smem_raw);
  T* sQ = smem.q;
  T* sK = smem.k[0];
  T* sV = smem.v[0];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const SeqDesc& sd = p.seq[blockIdx.z];
  const int kvh = blockIdx.y;
  const Work w = make_work<BM, BN>(p, sd);
  if (!w.valid) return;

  const T* qsrc = static_cast<const T*>(w.is_out ? p.q_out : p.q);
  const int qoff = w.is_out ? sd.out_off : sd.q_off;
  const T* kg = static_cast<const T*>(p.k) + sd.kv_base + (size_t)kvh * D;
  const T* vg = static_cast<const T*>(p.v) + sd.kv_base + (size_t)kvh * D;
  const size_t kv_row = (size_t)p.Hkv * D;
  const int r0 = w.rb * BM, r1 = min(w.nrows, r0 + BM) - 1;
  const int ntiles = w.te >= w.tb ? w.te - w.tb + 1 : 0;

  // Q rows of the block (zero-filled past the last row): cp.async group 0.
  load_q_tile<BM, D>(p, GroupDiv{p.group}, qoff, kvh, r0, r1, tid, NW * 32, Swizzle<D>{},
                     [&](int dst, bool ok, const auto& off) { cp_async16(sQ + dst, ok ? qsrc + off() : qsrc, ok); });
  cp_async_commit();
  auto load_kv = [&](int tile, int buf) {
    load_kv_tile<BN, D>(sK + buf * BN * D, sV + buf * BN * D, kg, vg, (long long)tile * BN,
                        [&](long long n) { return n < sd.cache_len; }, kv_row, tid, NW * 32, Swizzle<D>{});
  };
  // Prologue: tiles 0 .. STAGES-2, one group each (empty groups keep the count uniform).
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    if (st < ntiles) load_kv(w.tb + st, st);
    cp_async_commit();
  }

  // This warp's rows and tile range.
  const int wr0 = r0 + warp * WM, wr1 = min(r1, wr0 + WM - 1);
  const bool wactive = wr0 <= r1;
  const int g = lane >> 2, c = lane & 3;
  int lo[MT][2], hi[MT][2];
  bool rv[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wr0 + mt * 16 + g + 8 * h;
      rv[mt][h] = r <= r1;
      lo[mt][h] = rv[mt][h] ? row_lo(p, w, r) : 1;
      hi[mt][h] = rv[mt][h] ? row_hi(p, w, r) : 0;
    }
  const int wtb = wactive ? row_lo(p, w, wr0) / BN : 1, wte = wactive ? row_hi(p, w, wr1) / BN : 0;

  float oacc[MT][DT][4];
  float m[MT][2], l[MT][2];
  float racc[DET ? MT : 1][DET ? DT : 1][4];
  float rm[MT][2], rl[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m[mt][h] = kNegInf;
      l[mt][h] = 0.f;
      rm[mt][h] = kNegInf;
      rl[mt][h] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < DT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) oacc[mt][j][e] = 0.f;
    if constexpr (DET) {
#pragma unroll
      for (int j = 0; j < DT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) racc[mt][j][e] = 0.f;
    }
  }
  uint32_t qf[QREG ? D / 16 : 1][4];
  int cur_chunk = -1;

  // Merge the chunk state (m, l, oacc) into the running state and reset it (deterministic mode).
  auto flush = [&]() {
    if constexpr (DET) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) flush_chunk_tile(m[mt], l[mt], oacc[mt], rm[mt], rl[mt], RegAcc<DT>{racc[mt]});
    }
  };

  for (int it = 0; it < ntiles; ++it) {
    const int tt = w.tb + it;
    cp_async_wait<STAGES - 2>();  // Q and tile `it` have landed
    __syncthreads();              // ... for every thread; and everyone is done with tile it-1
    if (it + STAGES - 1 < ntiles) load_kv(tt + STAGES - 1, (it + STAGES - 1) % STAGES);
    cp_async_commit();
    if constexpr (QREG) {
      if (it == 0 && wactive) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
          ldsm_x4(qf[kk], sQ + swz<D>(warp * WM + (lane & 7) + (((lane >> 3) & 1) << 3), kk * 2 + (lane >> 4)));
      }
    }
    if (wactive && tt >= wtb && tt <= wte) {
      if constexpr (DET) {
        if (!w.split) {
          const int chunk = tt / p.chunk_tiles;
          if (chunk != cur_chunk) {
            if (cur_chunk >= 0) flush();
            cur_chunk = chunk;
          }
        }
      }
      const int buf = it % STAGES;
      const T* kb = sK + buf * BN * D;
      const T* vb = sV + buf * BN * D;
      float s[MT][NT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][j][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t qa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (QREG) {
#pragma unroll
            for (int e = 0; e < 4; ++e) qa[mt][e] = qf[kk][e];
          } else {
            ldsm_x4(qa[mt],
                    sQ + swz<D>(warp * WM + mt * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), kk * 2 + (lane >> 4)));
          }
        }
#pragma unroll
        for (int np = 0; np < BN / 16; ++np) {
          uint32_t b[4];
          ldsm_x4(b, kb + swz<D>(np * 16 + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1)));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            Mma<T>::run(s[mt][2 * np], qa[mt], b[0], b[1]);
            Mma<T>::run(s[mt][2 * np + 1], qa[mt], b[2], b[3]);
          }
        }
      }
      // Scale, mask, online softmax (log2 domain). When every row of the warp sees every key of
      // the tile (most tiles of the causal stream) the mask is a no-op and is skipped.
      const int kbase = tt * BN + 2 * c;
      bool full = true;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) full = full && lo[mt][h] <= tt * BN && hi[mt][h] >= tt * BN + BN - 1;
      full = __all_sync(0xffffffffu, full);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) online_softmax_tile(s[mt], m[mt], l[mt], oacc[mt], lo[mt], hi[mt], kbase, full, p.scale_log2);
      // O += P V
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          a[mt][0] = Mma<T>::pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          a[mt][1] = Mma<T>::pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          a[mt][2] = Mma<T>::pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          a[mt][3] = Mma<T>::pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t b[4];
          ldsm_x4_t(b, vb + swz<D>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), dp * 2 + (lane >> 4)));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            Mma<T>::run(oacc[mt][2 * dp], a[mt], b[0], b[1]);
            Mma<T>::run(oacc[mt][2 * dp + 1], a[mt], b[2], b[3]);
          }
        }
      }
    }
  }
  cp_async_wait<0>();
  if (!wactive) return;

  if constexpr (DET) {
    if (!w.split) {
      flush();
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) store_tile_rows<T, DT>(p, sd, w, kvh, wr0 + mt * 16, rv[mt], rm[mt], rl[mt], racc[mt], true);
      return;
    }
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) store_tile_rows<T, DT>(p, sd, w, kvh, wr0 + mt * 16, rv[mt], m[mt], l[mt], oacc[mt], false);
}

}  // namespace orthros::cuda::detail
