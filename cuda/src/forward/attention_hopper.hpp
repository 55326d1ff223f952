// Host interface of the Hopper forward kernel (attention_hopper.cu, compiled for sm_90a only).
// attention.cu (the one dispatch place) decides when to use it.
#pragma once

#include "common/device.cuh"
#include "common/tile_config.cuh"

#include <cuda.h>

namespace orthros::cuda::detail {

/// True when the current device runs sm_90a code (compute capability 9.0: H100, H200, GH200).
bool hopper_kernel_available();

/// Encodes a TMA descriptor of a row-major bf16/f16 tensor of `rank` (2 or 3) dims (dims[0]
/// innermost, in elements; strides in bytes for dims 1..) read in boxes of `box` elements with the
/// 128-byte swizzle and zeros outside the tensor. Maps are cached per thread (the last 16).
/// \throws CudaError when the driver cannot encode it (names `what`).
void encode_tensor_map(CUtensorMap* map, DType dt, const void* ptr, int rank, const cuuint64_t* dims,
                       const cuuint64_t* strides, const cuuint32_t* box, const char* what);

/// The TMA descriptor of a query-like tensor [tokens][H_q][D] (q, q_out, dO, dO_out) read in GQA
/// row blocks: a box of 64 dims x the group's `group` heads x block_rows / group tokens (rows
/// r = token * group + head, as the kernels number them; needs 64 % group == 0 and
/// block_rows % group == 0). \throws CudaError as encode_tensor_map.
void encode_gqa_rows_map(CUtensorMap* map, DType dt, const void* ptr, long long tokens, int Hq, int D, int group,
                         int block_rows, const char* what);

/// The TMA descriptors of the K and V caches, [kv_rows][H_kv * kp.D] (every cache row of the
/// batch: row b * capacity + n), read in boxes of 64 dims x box_rows cache rows (<= 256), into
/// k_map / v_map. Returns false and encodes nothing when kv_rows is 0 or does not fit TMA's int32
/// coordinates: the kernel then loads every K/V tile by cp.async. \throws CudaError as
/// encode_tensor_map.
bool encode_kv_cache_maps(CUtensorMap* k_map, CUtensorMap* v_map, DType dt, const KernelParams& kp, long long kv_rows,
                          int box_rows);

/// Rows per CTA of the Hopper kernel: kHopperWarpgroupRows per consumer warpgroup.
constexpr int hopper_block_rows(int nwg) { return kHopperWarpgroupRows * nwg; }

/// Extents of the whole call's tensors, forward and backward (the TMA descriptors cover them;
/// kp.seq may be a subset of the batch).
struct HopperGeometry {
  long long kv_rows;    // B * capacity: rows of k_cache / v_cache, [rows][H_kv][D]
  long long total_q;    // rows of q (and of the backward's d_o)  [total_q][H_q][D]
  long long total_out;  // rows of q_out (and of d_o_out)
};

/// Whether the query-like tensors can be read by TMA in GQA row blocks (encode_gqa_rows_map): the
/// group divides 64 (every 64-row slice, one warpgroup's or one step's, starts at a token) and
/// both streams' tokens fit TMA's int32 coordinates. Otherwise the kernels load them by cp.async.
inline bool tma_query_maps_fit(int group, const HopperGeometry& geo) {
  return 64 % group == 0 && geo.total_q < (1LL << 31) && geo.total_out < (1LL << 31);
}

/// Launches the warp-specialized wgmma kernel over the work items (x, KV head, sequence) of one
/// launch, x < gx (make_work_at's enumeration; BM = hopper_block_rows(nwg), BN = 64), as a
/// persistent grid. The items are dealt in bands of `band` block indices x, band-major, then KV
/// head (0: the default width, kHopperBandsPerRound bands per round of the grid). dtype bf16/f16,
/// D 64/128, nwg 3, band >= 0; throws orthros::Error otherwise, CudaError when a TMA descriptor
/// cannot be encoded or the launch fails.
void launch_hopper_forward(DType dtype, int D, int nwg, bool deterministic, const KernelParams& kp,
                           const HopperGeometry& geo, long long gx, int band, cudaStream_t stream);

}  // namespace orthros::cuda::detail
