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

/// The float32 dq accumulator of the fused backward (fast mode): the unscaled sums Σ_j dS_ij k_j of
/// every row, added by the dk/dv kernel's CTAs in no fixed order. One chunk of kHopperBwdRows x D
/// floats per (64-row block, KV head): chunk (block, kvh) at (block * H_kv + kvh) * 64 * D. Block
/// `rb` of sequence `seq` (its index in the whole batch) is dq_acc_block(off, group, seq) + rb,
/// off = the sequence's first token in its stream (q_off, out_off); the output stream's blocks
/// follow the base stream's (out_block0 = dq_acc_blocks(total_q, group, batch)). Inside a chunk
/// the floats are in the wgmma accumulator's register order (column half h of 64 columns, then
/// j = 0..7, thread t = 0..127 of the warpgroup, then the thread's 4 values), so a warpgroup
/// stores its tile with conflict-free 16-byte writes and adds it with one bulk reduction;
/// launch_hopper_dq_convert undoes the order.
struct DqAccumulator {
  float* acc = nullptr;      ///< zero before the dk/dv kernel runs
  long long out_block0 = 0;  ///< first block of the output stream
  int seq0 = 0;              ///< batch index of the launch's first sequence (bp.f.seq[0])
};
/// First accumulator block of a sequence whose stream starts at token `off`: floor(off * group /
/// 64) + seq. The sequence's blocks ceil(T * group / 64) fit below the next sequence's first block
/// (floor(a + b) - floor(a) + 1 >= ceil(b)), so the blocks of different sequences never overlap.
__host__ __device__ inline long long dq_acc_block(long long off, int group, int seq) {
  return off * group / kHopperBwdRows + seq;
}
/// Blocks of a stream of `tokens` tokens over `batch` sequences (a bound of dq_acc_block's range).
inline long long dq_acc_blocks(long long tokens, int group, int batch) {
  return tokens * group / kHopperBwdRows + batch + 1;
}

/// Launches the KV-block-outer wgmma dk/dv kernel (attention_backward_hopper.cu) over `grid` =
/// (key blocks of kHopperBwdKeys x H_kv, 1, sequences of bp.f.seq): writes dk and dv of every key
/// and, when dq.acc is not null, adds every row block's dq partial sum to the accumulator (the
/// fused backward; dq then comes from launch_hopper_dq_convert). `pipelined` selects the consumer
/// loop that issues a row block's S^T and dP^T while the previous block's dK runs (D = 128
/// without the fused dq only; the same products in the same order per element). Needs the pre-pass's bp.delta and
/// bp.lse2. dtype bf16/f16, D 64/128 (orthros::Error otherwise, and for `pipelined` elsewhere);
/// CudaError when a TMA descriptor cannot be encoded or the launch fails.
void launch_hopper_backward(DType dtype, const BwdParams& bp, const HopperGeometry& geo, dim3 grid,
                            const DqAccumulator& dq, bool pipelined, cudaStream_t stream);

/// The fused backward's post-pass over the sequences of bp.f.seq: dq and dq_out = bp.scale * the
/// accumulator's sums, rounded once to the dtype (as the dq kernels round s * acc). `grid` =
/// (max base blocks + max output blocks of 64 rows, H_kv, sequences). CudaError when the launch
/// fails.
void launch_hopper_dq_convert(DType dtype, const BwdParams& bp, const DqAccumulator& dq, int max_base_blocks,
                              dim3 grid, cudaStream_t stream);

/// Launches the query-outer wgmma dq kernel (attention_backward_hopper_dq.cu) over `grid` =
/// (work items x H_kv, 1, sequences of bp.f.seq): work item x is make_work_at<kHopperDqBlockRows,
/// kKeyTile>(x) (bp.f.max_out_blocks counted in blocks of kHopperDqBlockRows rows); writes dq and
/// dq_out. Needs the pre-pass's bp.delta and bp.lse2. dtype bf16/f16, D 64/128 (orthros::Error
/// otherwise); CudaError when a TMA descriptor cannot be encoded or the launch fails.
void launch_hopper_backward_dq(DType dtype, const BwdParams& bp, const HopperGeometry& geo, dim3 grid,
                               cudaStream_t stream);

}  // namespace orthros::cuda::detail
