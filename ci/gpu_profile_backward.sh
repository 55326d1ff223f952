#!/usr/bin/env bash
# Nsight Compute look at the Hopper backward kernels, run on the device machine from the
# repository root after ci/gpu_stage.sh:  bash ci/gpu_profile_backward.sh
# Profiles one launch of hopper_dq_kernel and one of hopper_bwd_kernel (dk/dv) of the PT 8K
# backward (qwen3-8b shape, bench_attention_backward_gpu --quick; the 4th launch of each: past the
# 3 warm-ups), clocks left as they are, and prints the warp-stall reasons (>= 0.05 warps stalled
# per issued instruction), speed-of-light, tensor-pipe and memory lines. Full reports:
# $OUT/ncu_bwd_KERNEL.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
source ci/gpu_env.sh  # BIN, OUTDIR, LD_LIBRARY_PATH
for k in hopper_dq_kernel hopper_bwd_kernel; do
  log="$OUTDIR/ncu_bwd_$k.txt"
  timeout 240 ncu --clock-control none --kernel-name "regex:$k" --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
    --section LaunchStats --section ComputeWorkloadAnalysis \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum" \
    "$BIN/bench_attention_backward_gpu" --runs 1 --quick >"$log" 2>&1
  echo "== ncu $k: exit $?"
  grep -E "issue_stalled" "$log" | awk '$NF+0 >= 0.05' | sed 's/  */ /g'
  grep -E "gmma|inst_executed|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Issue Slots Busy|No Eligible|Eligible Warps|Registers Per Thread|Shared Memory Configuration Size" "$log" \
    | sed 's/  */ /g' | head -30
done
