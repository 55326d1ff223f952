// Work decomposition of a forward launch: which row block, stream and KV split block index x
// computes, each row's key range, and the split-KV partial-state address.
#pragma once

#include "common/device.cuh"

#include <cstdint>

namespace orthros::cuda::detail {

// Work of one launch: grid (x, H_kv, sequences). blockIdx.x enumerates first the output-stream
// row blocks times their KV splits (longest rows first), then the base-stream row blocks.
// A "row" is one (query token, query head of the GQA group) pair: rows r = i*group + g of KV head
// h are query token i, query head h*group + g; packing the group into the rows lets one K/V tile
// in shared memory serve all query heads of a KV head (GQA without repeating K/V).
//
// Per row, the arithmetic depends only on the row's own key range [lo, hi] and on fixed, absolute
// tile boundaries (multiples of the tile size BN): tiles fully outside a row's range are exact
// no-ops on its state, so the result does not depend on which other rows share the warp/CTA.

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

}  // namespace orthros::cuda::detail
