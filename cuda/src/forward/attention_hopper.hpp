// Host interface of the Hopper forward kernel (attention_hopper.cu, compiled for sm_90a only).
// attention.cu (the one dispatch place) decides when to use it.
#pragma once

#include "common/device.cuh"
#include "common/tile_config.cuh"

namespace orthros::cuda::detail {

/// True when the current device runs sm_90a code (compute capability 9.0: H100, H200, GH200).
bool hopper_kernel_available();

/// Rows per CTA of the Hopper kernel: kHopperWarpgroupRows per consumer warpgroup.
constexpr int hopper_block_rows(int nwg) { return kHopperWarpgroupRows * nwg; }

/// Extents of the whole call's tensors (the TMA descriptors cover them; kp.seq may be a subset).
struct HopperGeometry {
  long long kv_rows;    // B * capacity: rows of k_cache / v_cache, [rows][H_kv][D]
  long long total_q;    // rows of q  [total_q][H_q][D]
  long long total_out;  // rows of q_out
};

/// Launches the warp-specialized wgmma kernel over the work items (x, KV head, sequence) of one
/// launch, x < gx (make_work_at's enumeration; BM = hopper_block_rows(nwg), BN = 64), as a
/// persistent grid. dtype bf16/f16, D 64/128, nwg 3 (fast) / 2 (deterministic); throws orthros::Error otherwise,
/// CudaError when a TMA descriptor cannot be encoded or the launch fails.
void launch_hopper_forward(DType dtype, int D, int nwg, bool deterministic, const KernelParams& kp,
                           const HopperGeometry& geo, long long gx, cudaStream_t stream);

}  // namespace orthros::cuda::detail
