// Epilogue of the tensor-core forward kernels: a 16-row block's result written to the output and
// LSE, or its unnormalized state to the split-KV partial buffer.
#pragma once

#include "common/mma_tiles.cuh"
#include "forward/online_softmax.cuh"
#include "forward/work.cuh"

#include <cstdint>

namespace orthros::cuda::detail {

/// Stores two adjacent output elements (x, y) at dst: float32 as they are (the float32 output
/// stream), bf16/f16 rounded once to nearest even and packed.
__device__ __forceinline__ void store_pair(float* dst, float x, float y) {
  *reinterpret_cast<float2*>(dst) = make_float2(x, y);
}
template <typename T>
__device__ __forceinline__ void store_pair(T* dst, float x, float y) {
  *reinterpret_cast<uint32_t*>(dst) = Mma<T>::pack(x, y);
}

/// Query token i (of the stream) and query head of row r of KV head kvh (rows r = i*group + g).
__device__ __forceinline__ void row_token_head(const KernelParams& p, int kvh, int r, int& i, int& head) {
  i = p.group_div.div(r);
  head = kvh * p.group + (r - i * p.group);
}

/// Writes one 16-row block's result: row0 is its first row (rows row0 + g, row0 + g + 8 of this
/// thread; rv: row exists). Split-KV: the unnormalized state (m, quad-summed l, o) of split w.sp;
/// otherwise o / l in T (o_out in float32 with p.o_out_f32) and the LSE. `l_final` true: l is
/// already the row total (det running state).
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
    const size_t off = ((size_t)(qoff + i) * p.Hq + head) * D;
    const float inv = __frcp_rn(lf);
    const auto store_row = [&](auto* dst) {
#pragma unroll
      for (int j = 0; j < DT; ++j)
        store_pair(dst + j * 8 + 2 * c, __fmul_rn(o[j][2 * h], inv), __fmul_rn(o[j][2 * h + 1], inv));
    };
    if (w.is_out && p.o_out_f32)  // float32 output stream (AttentionBuffers::o_out_float32)
      store_row(static_cast<float*>(p.o_out) + off);
    else
      store_row(static_cast<T*>(w.is_out ? p.o_out : p.o) + off);
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

}  // namespace orthros::cuda::detail
