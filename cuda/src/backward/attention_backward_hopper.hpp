// Host interface of the Hopper backward kernels (attention_backward_hopper.cu: dk/dv,
// attention_backward_hopper_dq.cu: dq; compiled for sm_90a only). attention_backward.cu (the
// backward's one dispatch place) decides when to use them.
#pragma once

#include "backward/params.cuh"
#include "common/tile_config.cuh"
#include "forward/attention_hopper.hpp"

#include <cuda.h>

namespace orthros::cuda::detail {

/// Encodes the TMA descriptors of the backward's query-like inputs (encode_gqa_rows_map, boxes of
/// block_rows rows): q and d_o over geo.total_q tokens, q_out and d_o_out over geo.total_out (a
/// stream without tokens is left unencoded; the kernels never read it). Returns false and encodes
/// nothing when !tma_query_maps_fit(group, geo): the kernel then loads Q and dO by cp.async.
/// \throws CudaError as encode_tensor_map.
bool encode_bwd_query_maps(DType dtype, const BwdParams& bp, const HopperGeometry& geo, int block_rows,
                           CUtensorMap* q, CUtensorMap* d_o, CUtensorMap* q_out, CUtensorMap* d_o_out);

/// Rows per CTA of the Hopper dq kernel.
constexpr int kHopperDqBlockRows = kHopperWarpgroupRows * kHopperConsumers;

/// Launches the KV-block-outer wgmma dk/dv kernel (attention_backward_hopper.cu) over `grid` =
/// (key blocks of kHopperBwdKeys x H_kv, 1, sequences of bp.f.seq): writes dk and dv of every key.
/// Needs the pre-pass's bp.delta and bp.lse2. dtype bf16/f16, D 64/128 (orthros::Error
/// otherwise); CudaError when a TMA descriptor cannot be encoded or the launch fails.
void launch_hopper_backward(DType dtype, const BwdParams& bp, const HopperGeometry& geo, dim3 grid,
                            cudaStream_t stream);

/// Launches the query-outer wgmma dq kernel (attention_backward_hopper_dq.cu) over `grid` =
/// (work items x H_kv, 1, sequences of bp.f.seq): work item x is make_work_at<kHopperDqBlockRows,
/// kKeyTile>(x) (bp.f.max_out_blocks counted in blocks of kHopperDqBlockRows rows); writes dq and
/// dq_out. Needs the pre-pass's bp.delta and bp.lse2. dtype bf16/f16, D 64/128 (orthros::Error
/// otherwise); CudaError when a TMA descriptor cannot be encoded or the launch fails.
void launch_hopper_backward_dq(DType dtype, const BwdParams& bp, const HopperGeometry& geo, dim3 grid,
                               cudaStream_t stream);

}  // namespace orthros::cuda::detail
