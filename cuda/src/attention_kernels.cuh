// Kernels of the Orthros attention operator: a tensor-core (mma.sync m16n8k16) tiled kernel for
// bf16/f16 with D = 64/128, a SIMT kernel for every other supported case, and the split-KV merge.
//
// Work of one launch: grid (x, H_kv, sequences). blockIdx.x enumerates first the output-stream
// row blocks times their KV splits (longest rows first), then the base-stream row blocks.
// A "row" is one (query token, query head of the GQA group) pair: rows r = i*group + g of KV head
// h are query token i, query head h*group + g; packing the group into the rows lets one K/V tile
// in shared memory serve all query heads of a KV head (GQA without repeating K/V).
//
// Per row, the arithmetic depends only on the row's own key range [lo, hi] and on fixed, absolute
// tile boundaries (multiples of the tile size BN): tiles fully outside a row's range are exact
// no-ops on its state, so the result does not depend on which other rows share the warp/CTA.
#pragma once

#include "common.cuh"
#include "mma_tiles.cuh"

#include <cstdint>

namespace orthros::cuda::detail {

// ---- work decomposition shared by both kernels ---------------------------------------------
struct Work {
  bool valid, is_out, split;
  int rb, sp, n_tok, nrows;
  int first_pos;  // cache row of token 0 of this stream
  int tb, te;     // CTA tile range (inclusive), te < tb: empty
};

__device__ __forceinline__ int row_lo(const KernelParams& p, const Work& w, int r) {
  const int t = w.first_pos + p.group_div.div(r);
  return w.is_out ? 0 : (int)max(0LL, (long long)t - p.window + 1);
}
__device__ __forceinline__ int row_hi(const KernelParams& p, const Work& w, int r) {
  return w.first_pos + p.group_div.div(r);
}

/// The work of block index x (the forward: blockIdx.x; the backward flattens (x, KV head)).
template <int BM, int BN>
__device__ __forceinline__ Work make_work_at(const KernelParams& p, const SeqDesc& sd, int x) {
  Work w;
  const int out_work = p.max_out_blocks * p.nsplit;
  w.sp = 0;
  if (x < out_work) {
    w.is_out = true;
    const int q = p.nsplit_div.div(x);
    w.rb = p.max_out_blocks - 1 - q;
    w.sp = x - q * p.nsplit;
  } else {
    w.is_out = false;
    w.rb = x - out_work;
  }
  w.n_tok = w.is_out ? sd.T_out : sd.T;
  w.nrows = w.n_tok * p.group;
  w.valid = w.rb * BM < w.nrows;
  w.split = w.is_out && p.nsplit > 1;
  w.first_pos = (int)(sd.cache_len - w.n_tok);
  if (!w.valid) return w;
  const int r0 = w.rb * BM, r1 = min(w.nrows, r0 + BM) - 1;
  int tb = row_lo(p, w, r0) / BN, te = row_hi(p, w, r1) / BN;
  if (w.split) {
    if (p.split_chunked) {
      const int cb = w.sp * p.chunk_tiles;
      tb = max(tb, cb);
      te = min(te, cb + p.chunk_tiles - 1);
    } else {
      const long long nt = te - tb + 1;
      const int b0 = tb + (int)(nt * w.sp / p.nsplit), e0 = tb + (int)(nt * (w.sp + 1) / p.nsplit) - 1;
      tb = b0;
      te = e0;
    }
  }
  w.tb = tb;
  w.te = te;
  return w;
}

template <int BM, int BN>
__device__ __forceinline__ Work make_work(const KernelParams& p, const SeqDesc& sd) {
  return make_work_at<BM, BN>(p, sd, blockIdx.x);
}

__device__ __forceinline__ float* partial_ptr(const KernelParams& p, const SeqDesc& sd, int i, int head, int sp) {
  return p.partial + ((size_t)((size_t)(sd.out_off + i) * p.Hq + head) * p.nsplit + sp) * (size_t)(p.D + 2);
}

/// One 16-row block's step of the online softmax over a KV tile (log2 domain), shared by the
/// mma.sync and the wgmma kernels so their per-row arithmetic is the same source: scale the scores
/// s (m16n8 C layout, NT 8-key groups; this thread's rows g and g+8 are h = 0, 1), mask keys
/// outside [lo[h], hi[h]] (skipped when `full`: every row of the warp sees the whole tile), update
/// the running max m and sum l and leave P = exp2(s - m) in s; returns in `alpha` the factor the
/// output accumulator must be scaled by (rescale_rows) before P V is added. `kbase` is the key
/// index of column 2c of group 0. A tile outside a row's range is an exact no-op on that row's
/// state (alpha = 1, p = 0).
template <int NT>
__device__ __forceinline__ void online_softmax_scores(float (&s)[NT][4], float (&m)[2], float (&l)[2],
                                                      const int (&lo)[2], const int (&hi)[2], int kbase, bool full,
                                                      float scale_log2, float (&alpha)[2]) {
  // Key kbase + j*8 + (e&1) is in [lo, hi] iff its column j*8 + (e&1) (a constant) is in
  // [lo - kbase, hi - kbase]: the same test, one compare per bound.
  const int lor[2] = {lo[0] - kbase, lo[1] - kbase}, hir[2] = {hi[0] - kbase, hi[1] - kbase};
  if (full) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = __fmul_rn(s[j][e], scale_log2);
  } else {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1, col = j * 8 + (e & 1);
        const float v = __fmul_rn(s[j][e], scale_log2);
        s[j][e] = (col < lor[h] || col > hir[h]) ? kNegInf : v;
      }
  }
  // Row maxima as a pairwise tree (max is exact and order-free: the same value as a running max,
  // with a dependency depth of log2(2 NT) instead of 2 NT).
  static_assert((NT & (NT - 1)) == 0, "the pairwise max needs a power-of-two number of 8-key groups");
  float mx[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float t[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) t[j] = fmaxf(s[j][2 * h], s[j][2 * h + 1]);
#pragma unroll
    for (int w = NT / 2; w >= 1; w /= 2)
#pragma unroll
      for (int j = 0; j < w; ++j) t[j] = fmaxf(t[j], t[j + w]);
    mx[h] = t[0];
  }
  float muse[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    const float mn = fmaxf(m[h], mx[h]);
    muse[h] = mn == kNegInf ? 0.f : mn;
    alpha[h] = fast_exp2(__fsub_rn(m[h], muse[h]));
    m[h] = mn;
  }
  float rs[2] = {0.f, 0.f};
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float pe = fast_exp2(__fsub_rn(s[j][e], muse[e >> 1]));
      s[j][e] = pe;
      rs[e >> 1] = __fadd_rn(rs[e >> 1], pe);
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) l[h] = __fadd_rn(__fmul_rn(l[h], alpha[h]), rs[h]);
}

/// o[j][e] *= alpha[row of e] (the accumulator layout of online_softmax_scores). Skipped when
/// every alpha of the warp is exactly 1 (no row's running max moved: most tiles of a long causal
/// row): x * 1 = x exactly, so the skip changes no bit. Warp-uniform branch (called by all lanes).
template <int DT>
__device__ __forceinline__ void rescale_rows(float (&o)[DT][4], const float (&alpha)[2]) {
  if (!__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) return;
#pragma unroll
  for (int j = 0; j < DT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[j][e] = __fmul_rn(o[j][e], alpha[e >> 1]);
}

/// online_softmax_scores followed by rescale_rows.
template <int NT, int DT>
__device__ __forceinline__ void online_softmax_tile(float (&s)[NT][4], float (&m)[2], float (&l)[2], float (&o)[DT][4],
                                                    const int (&lo)[2], const int (&hi)[2], int kbase, bool full,
                                                    float scale_log2) {
  float alpha[2];
  online_softmax_scores(s, m, l, lo, hi, kbase, full, scale_log2, alpha);
  rescale_rows(o, alpha);
}

/// Sum over the 4 threads of a quad (the columns of one accumulator row), fixed order.
__device__ __forceinline__ float quad_sum(float x) {
  x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return x;
}

/// Deterministic mode: the running output of one thread's accumulator elements (j, e), read with
/// get() and written with set(). RegAcc: registers (the mma.sync kernel; the Hopper kernel keeps
/// it in shared memory to save 64 registers per thread at D = 128). EmptyUntil: reads +0, the
/// empty running output, until `filled` (a row block's first merge), then `acc`.
template <int DT>
struct RegAcc {
  float (&a)[DT][4];
  __device__ float get(int j, int e) const { return a[j][e]; }
  __device__ void set(int j, int e, float v) const { a[j][e] = v; }
};
template <typename Acc>
struct EmptyUntil {
  const Acc& acc;
  bool filled;
  __device__ float get(int j, int e) const { return filled ? acc.get(j, e) : 0.f; }
};

/// One accumulator row h (elements (j, 2h), (j, 2h+1)) of merge_chunk_state: the chunk's max m
/// and quad-summed sum lf merged into (rm, rl), the output read from `src`, written to `dst`.
template <int DT, typename Src, typename Dst>
__device__ __forceinline__ void merge_chunk_row(int h, float m, float lf, const float (&o)[DT][4], float& rm,
                                                float& rl, const Src& src, const Dst& dst) {
  const MergeCoeffs cf = merge_coeffs(rm, m);
  rl = merge_val(rl, lf, cf);
#pragma unroll
  for (int j = 0; j < DT; ++j) {
    const float v0 = merge_val(src.get(j, 2 * h), o[j][2 * h], cf);
    const float v1 = merge_val(src.get(j, 2 * h + 1), o[j][2 * h + 1], cf);
    dst.set(j, 2 * h, v0);
    dst.set(j, 2 * h + 1, v1);
  }
  rm = cf.m;
}
/// The empty running output (+0), as a merge source.
struct ZeroAcc {
  __device__ float get(int, int) const { return 0.f; }
};

/// Deterministic mode: merges one 16-row block's chunk state (m, l, o; l is this thread's partial
/// row sum) into its running state (rm, rl and the running output read from `src`) with
/// merge_coeffs/merge_val, and writes the merged running output to `dst` (which may be the
/// chunk's own registers: the last chunk of a row block merges in place). Every kernel's chunk
/// merge is this code, so the bits are the same wherever it runs.
template <int DT, typename Src, typename Dst>
__device__ __forceinline__ void merge_chunk_state(const float (&m)[2], const float (&l)[2], const float (&o)[DT][4],
                                                  float (&rm)[2], float (&rl)[2], const Src& src, const Dst& dst) {
#pragma unroll
  for (int h = 0; h < 2; ++h) merge_chunk_row(h, m[h], quad_sum(l[h]), o, rm[h], rl[h], src, dst);
}

/// merge_chunk_state of a row block's first (or only) chunk into the empty running state
/// (rm = -inf, rl = 0, output +0), in place: the same bits with fewer operations. For a finite
/// chunk max m, merge_coeffs(-inf, m) gives fa = 2^-inf = +0 and fb = 2^0 = 1 exactly, so every
/// merged value 0 * fa + x * fb is +0 + x; any other m (an empty chunk, an overflowed score) takes
/// the general path (merge_chunk_row from the empty state).
template <int DT>
__device__ __forceinline__ void merge_first_chunk(const float (&m)[2], const float (&l)[2], float (&o)[DT][4],
                                                  float (&rm)[2], float (&rl)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float lf = quad_sum(l[h]);
    if (fabsf(m[h]) < INFINITY) {
      rl[h] = __fadd_rn(0.f, lf);
#pragma unroll
      for (int j = 0; j < DT; ++j) {
        o[j][2 * h] = __fadd_rn(0.f, o[j][2 * h]);
        o[j][2 * h + 1] = __fadd_rn(0.f, o[j][2 * h + 1]);
      }
      rm[h] = m[h];
    } else {
      rm[h] = kNegInf;
      rl[h] = 0.f;
      merge_chunk_row(h, m[h], lf, o, rm[h], rl[h], ZeroAcc{}, RegAcc<DT>{o});
    }
  }
}

/// merge_chunk_state (running output read from `src`, written to `dst`), then resets the chunk
/// state (m = -inf, l = 0, o = 0) for the next chunk.
template <int DT, typename Src, typename Dst>
__device__ __forceinline__ void flush_chunk_tile(float (&m)[2], float (&l)[2], float (&o)[DT][4], float (&rm)[2],
                                                 float (&rl)[2], const Src& src, const Dst& dst) {
  merge_chunk_state(m, l, o, rm, rl, src, dst);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m[h] = kNegInf;
    l[h] = 0.f;
#pragma unroll
    for (int j = 0; j < DT; ++j) {
      o[j][2 * h] = 0.f;
      o[j][2 * h + 1] = 0.f;
    }
  }
}
/// flush_chunk_tile with the running output `ro` read and written in place.
template <int DT, typename Acc>
__device__ __forceinline__ void flush_chunk_tile(float (&m)[2], float (&l)[2], float (&o)[DT][4], float (&rm)[2],
                                                 float (&rl)[2], const Acc& ro) {
  flush_chunk_tile(m, l, o, rm, rl, ro, ro);
}

/// Query token i (of the stream) and query head of row r of KV head kvh (rows r = i*group + g).
__device__ __forceinline__ void row_token_head(const KernelParams& p, int kvh, int r, int& i, int& head) {
  i = p.group_div.div(r);
  head = kvh * p.group + (r - i * p.group);
}

/// Writes one 16-row block's result: row0 is its first row (rows row0 + g, row0 + g + 8 of this
/// thread; rv: row exists). Split-KV: the unnormalized state (m, quad-summed l, o) of split w.sp;
/// otherwise o / l in T and the LSE. `l_final` true: l is already the row total (det running state).
template <typename T, int DT>
__device__ __forceinline__ void store_tile_rows(const KernelParams& p, const SeqDesc& sd, const Work& w, int kvh,
                                                int row0, const bool (&rv)[2], const float (&m)[2], const float (&l)[2],
                                                const float (&o)[DT][4], bool l_final) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3, D = DT * 8;
  float lfs[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float lf = l_final ? l[h] : quad_sum(l[h]);
    lfs[h] = lf;
    if (!rv[h]) continue;
    int i, head;
    row_token_head(p, kvh, row0 + g + 8 * h, i, head);
    if (w.split) {
      float* dst = partial_ptr(p, sd, i, head, w.sp);
      if (c == 0) {
        dst[0] = m[h];
        dst[1] = lf;
      }
#pragma unroll
      for (int j = 0; j < DT; ++j) {
        dst[2 + j * 8 + 2 * c] = o[j][2 * h];
        dst[2 + j * 8 + 2 * c + 1] = o[j][2 * h + 1];
      }
      continue;
    }
    const int qoff = w.is_out ? sd.out_off : sd.q_off;
    T* dst = static_cast<T*>(w.is_out ? p.o_out : p.o) + ((size_t)(qoff + i) * p.Hq + head) * D;
    const float inv = __frcp_rn(lf);
#pragma unroll
    for (int j = 0; j < DT; ++j) {
      const uint32_t v = Mma<T>::pack(__fmul_rn(o[j][2 * h], inv), __fmul_rn(o[j][2 * h + 1], inv));
      *reinterpret_cast<uint32_t*>(dst + j * 8 + 2 * c) = v;
    }
  }
  // The LSE of row h is written by lane c = h of its quad: one pass of state_lse's float64
  // arithmetic for both rows instead of one per row.
  float* lptr = w.is_out ? p.lse_out : p.lse;
  const int h = c & 1;
  if (!w.split && lptr && c < 2 && (h ? rv[1] : rv[0])) {
    const float mh = h ? m[1] : m[0];
    const float lh = h ? lfs[1] : lfs[0];
    int i, head;
    row_token_head(p, kvh, row0 + g + 8 * h, i, head);
    const int qoff = w.is_out ? sd.out_off : sd.q_off;
    lptr[(size_t)(qoff + i) * p.Hq + head] = state_lse(mh, lh);
  }
}

// ---- tensor-core kernel ---------------------------------------------------------------------
// NW warps per CTA, each warp MT m16 tiles (16*MT rows); KV tiles of 64 keys in a STAGES-deep
// cp.async ring. MT = 2 halves the shared-memory reads of K/V per mma (the B fragments serve two
// m tiles); Q fragments then come from shared memory per k-step instead of registers.
template <typename T, int D, int NW, int MT, int STAGES, bool DET>
__global__ void __launch_bounds__(NW * 32) mma_attn_kernel(const __grid_constant__ KernelParams p) {
  constexpr int WM = 16 * MT, BM = NW * WM, BN = 64, CH = D / 8, NT = BN / 8, DT = D / 8;
  constexpr bool QREG = (MT == 1);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + BM * D;
  T* sV = sK + STAGES * BN * D;
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
  for (int idx = tid; idx < BM * CH; idx += NW * 32) {
    const int row = idx / CH, ch = idx % CH, r = r0 + row;
    const bool ok = r <= r1;
    const T* src = ok ? qsrc + ((size_t)(qoff + r / p.group) * p.Hq + kvh * p.group + r % p.group) * D + ch * 8 : qsrc;
    cp_async16(sQ + swz<D>(row, ch), src, ok);
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

// ---- sliding-window base-stream kernel (fast mode) ------------------------------------------
// A persistent CTA walks `blocks_per_cta` consecutive base-stream row blocks (64 rows) of one
// (sequence, KV head). K/V tiles live in a ring of kSlideSlots slots indexed by absolute tile
// number, so each tile is loaded once per CTA, and the next block's Q and new tiles are fetched
// while the current block computes: no per-tile barriers and no pipeline drain between blocks.
// Per row, the arithmetic is the generic kernel's (MT = 1, same tile order and operations).
// The host uses it only when two consecutive blocks span <= kSlideSlots tiles, and only when the
// environment variable ORTHROS_CUDA_SLIDE is set: on the H200 it measured slower than the
// generic kernel (one 4-warp CTA per SM; the softmax phases leave the tensor cores idle).
constexpr int kSlideSlots = 5;

template <typename T, int D>
__global__ void __launch_bounds__(128, 1) swa_slide_kernel(const __grid_constant__ KernelParams p, int blocks_per_cta) {
  constexpr int NW = 4, BM = 64, BN = 64, CH = D / 8, NT = BN / 8, DT = D / 8, NS = kSlideSlots;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // [2][BM][D]
  T* sK = sQ + 2 * BM * D;                  // [NS][BN][D]
  T* sV = sK + NS * BN * D;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const SeqDesc& sd = p.seq[blockIdx.z];
  const int kvh = blockIdx.y;
  Work w;  // base stream of this sequence
  w.is_out = false;
  w.split = false;
  w.sp = 0;
  w.n_tok = sd.T;
  w.nrows = sd.T * p.group;
  w.first_pos = (int)(sd.cache_len - sd.T);
  const int nblocks = (w.nrows + BM - 1) / BM;
  const int rb_begin = blockIdx.x * blocks_per_cta, rb_end = min(nblocks, rb_begin + blocks_per_cta);
  if (rb_begin >= rb_end) return;
  const T* qsrc = static_cast<const T*>(p.q);
  const int qoff = sd.q_off;
  const T* kg = static_cast<const T*>(p.k) + sd.kv_base + (size_t)kvh * D;
  const T* vg = static_cast<const T*>(p.v) + sd.kv_base + (size_t)kvh * D;
  const size_t kv_row = (size_t)p.Hkv * D;
  int loaded_te = -1;  // highest tile issued so far (uniform across the CTA)
  auto prefetch = [&](int rb) {
    const int r0 = rb * BM, r1 = min(w.nrows, r0 + BM) - 1;
    T* q_dst = sQ + (rb & 1) * BM * D;
    for (int idx = tid; idx < BM * CH; idx += NW * 32) {
      const int row = idx / CH, ch = idx % CH, r = r0 + row;
      const bool ok = r <= r1;
      const T* src =
          ok ? qsrc + ((size_t)(qoff + r / p.group) * p.Hq + kvh * p.group + r % p.group) * D + ch * 8 : qsrc;
      cp_async16(q_dst + swz<D>(row, ch), src, ok);
    }
    const int tb = row_lo(p, w, r0) / BN, te = row_hi(p, w, r1) / BN;
    for (int t = max(loaded_te + 1, tb); t <= te; ++t) {
      T* dk = sK + (t % NS) * BN * D;
      T* dv = sV + (t % NS) * BN * D;
      for (int idx = tid; idx < BN * CH; idx += NW * 32) {
        const int row = idx / CH, ch = idx % CH;
        const long long n = (long long)t * BN + row;
        const bool ok = n < sd.cache_len;
        const size_t off = ok ? (size_t)n * kv_row + ch * 8 : 0;
        cp_async16(dk + swz<D>(row, ch), kg + off, ok);
        cp_async16(dv + swz<D>(row, ch), vg + off, ok);
      }
    }
    loaded_te = max(loaded_te, te);
  };
  prefetch(rb_begin);
  cp_async_commit();
  const int g = lane >> 2, c = lane & 3;
  for (int rb = rb_begin; rb < rb_end; ++rb) {
    if (rb + 1 < rb_end) prefetch(rb + 1);
    cp_async_commit();
    cp_async_wait<1>();  // this block's Q and tiles have landed
    __syncthreads();
    const int r0 = rb * BM, r1 = min(w.nrows, r0 + BM) - 1;
    const int tb = row_lo(p, w, r0) / BN, te = row_hi(p, w, r1) / BN;
    const int wr0 = r0 + warp * 16, wr1 = min(r1, wr0 + 15);
    if (wr0 <= r1) {
      const T* sQb = sQ + (rb & 1) * BM * D;
      int lo[2], hi[2];
      bool rv[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wr0 + g + 8 * h;
        rv[h] = r <= r1;
        lo[h] = rv[h] ? row_lo(p, w, r) : 1;
        hi[h] = rv[h] ? row_hi(p, w, r) : 0;
      }
      const int wtb = max(tb, row_lo(p, w, wr0) / BN), wte = min(te, row_hi(p, w, wr1) / BN);
      uint32_t qf[D / 16][4];
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        ldsm_x4(qf[kk], sQb + swz<D>(warp * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), kk * 2 + (lane >> 4)));
      float oacc[DT][4];
      float m[2] = {kNegInf, kNegInf}, l[2] = {0.f, 0.f};
#pragma unroll
      for (int j = 0; j < DT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) oacc[j][e] = 0.f;
      for (int tt = wtb; tt <= wte; ++tt) {
        const T* kb = sK + (tt % NS) * BN * D;
        const T* vb = sV + (tt % NS) * BN * D;
        float s[NT][4];
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[j][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
          for (int np = 0; np < BN / 16; ++np) {
            uint32_t b[4];
            ldsm_x4(b, kb + swz<D>(np * 16 + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1)));
            Mma<T>::run(s[2 * np], qf[kk], b[0], b[1]);
            Mma<T>::run(s[2 * np + 1], qf[kk], b[2], b[3]);
          }
        }
        online_softmax_tile(s, m, l, oacc, lo, hi, tt * BN + 2 * c, false, p.scale_log2);
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
          uint32_t a[4];
          a[0] = Mma<T>::pack(s[2 * kk][0], s[2 * kk][1]);
          a[1] = Mma<T>::pack(s[2 * kk][2], s[2 * kk][3]);
          a[2] = Mma<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
          a[3] = Mma<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
          for (int dp = 0; dp < D / 16; ++dp) {
            uint32_t b[4];
            ldsm_x4_t(b, vb + swz<D>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), dp * 2 + (lane >> 4)));
            Mma<T>::run(oacc[2 * dp], a, b[0], b[1]);
            Mma<T>::run(oacc[2 * dp + 1], a, b[2], b[3]);
          }
        }
      }
      store_tile_rows<T, DT>(p, sd, w, kvh, wr0, rv, m, l, oacc, false);
    }
    __syncthreads();  // everyone is done with this block's Q buffer and with tiles the next prefetch may reuse
  }
  cp_async_wait<0>();
}

// ---- SIMT kernel (f32, and D other than 64/128) ---------------------------------------------
// One warp per row, 4 rows per CTA; KV tiles of 32 keys (lane j scores key j of the tile);
// lane j accumulates output dims j, j+32, ... (D <= 256).
constexpr int kSimtWarps = 4, kSimtBN = 32, kSimtMaxDpl = 8;

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
  T* optr = static_cast<T*>(w.is_out ? p.o_out : p.o);
  float* lptr = w.is_out ? p.lse_out : p.lse;
  const float inv = __frcp_rn(fl);
  T* dst = optr + ((size_t)(qoff + i) * Hq + head) * D;
#pragma unroll
  for (int k = 0; k < kSimtMaxDpl; ++k) {
    const int d = lane + 32 * k;
    if (d < D) dst[d] = Elem<T>::from_f(__fmul_rn(acc[k], inv));
  }
  if (lane == 0 && lptr) lptr[(size_t)(qoff + i) * Hq + head] = state_lse(fm, fl);
}

// ---- split-KV merge -------------------------------------------------------------------------
// One block per (output row, query head), one thread per output dim d. Every thread runs the
// same sequential merge of the nsplit states in ascending split order (the merge_coeffs/merge_val
// of the in-kernel chunk merges, so the bits match the deterministic PT path); the loads of a
// batch of kMergeBatch states are issued before the batch is merged, so the chain waits on memory
// once per batch instead of once per split.
constexpr int kMergeBatch = 16;

template <typename T>
__global__ void merge_kernel(const float* __restrict__ partial, T* __restrict__ o_out, float* __restrict__ lse_out,
                             long long rows, int nsplit, int D) {
  const long long row = blockIdx.x;
  const int d = threadIdx.x;
  if (row >= rows) return;
  const float* base = partial + (size_t)row * nsplit * (D + 2);
  float M = kNegInf, L = 0.f, acc = 0.f;
  for (int sp0 = 0; sp0 < nsplit; sp0 += kMergeBatch) {
    float mb[kMergeBatch], lb[kMergeBatch], ab[kMergeBatch];
#pragma unroll
    for (int j = 0; j < kMergeBatch; ++j) {
      const bool ok = sp0 + j < nsplit;
      const float* st = base + (size_t)(ok ? sp0 + j : 0) * (D + 2);
      mb[j] = ok ? __ldg(st) : kNegInf;
      lb[j] = ok ? __ldg(st + 1) : 0.f;
      ab[j] = ok ? __ldg(st + 2 + d) : 0.f;
    }
#pragma unroll
    for (int j = 0; j < kMergeBatch; ++j) {
      if (sp0 + j >= nsplit) break;
      const MergeCoeffs cf = merge_coeffs(M, mb[j]);
      L = merge_val(L, lb[j], cf);
      acc = merge_val(acc, ab[j], cf);
      M = cf.m;
    }
  }
  o_out[(size_t)row * D + d] = Elem<T>::from_f(__fmul_rn(acc, __frcp_rn(L)));
  if (d == 0 && lse_out) lse_out[row] = state_lse(M, L);
}

}  // namespace orthros::cuda::detail
