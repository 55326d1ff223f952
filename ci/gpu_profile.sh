#!/usr/bin/env bash
# Nsight Compute look at the Hopper forward kernel, run on the device machine from the
# repository root after ci/gpu_stage.sh:  bash ci/gpu_profile.sh [CASE ...]
# CASE is a bench_attention_gpu --only substring (default: prefill_T128K pt_T8K). Profiles one
# fast-mode launch of hopper_attn_kernel per case (the 4th: past the 3 warm-ups), clocks left as
# they are (--clock-control none), and prints the warp-stall reasons (warps stalled per issued
# instruction, >= 0.05), instruction count, speed-of-light and memory lines.
# Full reports: $OUT/ncu_CASE.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
source ci/gpu_env.sh  # BIN, OUTDIR, LD_LIBRARY_PATH
cases=("$@")
[ ${#cases[@]} -eq 0 ] && cases=(prefill_T128K pt_T8K)
for c in "${cases[@]}"; do
  log="$OUTDIR/ncu_$c.txt"
  timeout 240 ncu --clock-control none --kernel-name regex:hopper_attn_kernel --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,smsp__cycles_active.avg" \
    "$BIN/bench_attention_gpu" --runs 1 --only "$c" >"$log" 2>&1
  echo "== ncu $c: exit $?"
  grep -E "issue_stalled|inst_executed|cycles_active" "$log" | awk '$NF+0 >= 0.05 || /inst_executed|cycles_active/' | sed 's/  */ /g'
  grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Issue Slots Busy|No Eligible|Active Warps Per Scheduler|Eligible Warps|Warp Cycles Per Issued|Registers Per Thread|Stall|stall" "$log" \
    | sed 's/  */ /g' | head -40
done
