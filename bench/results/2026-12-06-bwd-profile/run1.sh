#!/usr/bin/env bash
# Device call 1 (2026-12-06, fifth session), at fe589b8's kernels. On an H200: the whole backward
# job (ci/gpu_backward.sh: tests on five paths, layer tests, verify --grad, the four sanitizers,
# benchmark and same-run peers) and the forward benchmark with its peers (PT 32K, prefill 128K
# against copy bandwidth). On any GPU: Nsight Compute on the fused dk/dv/dq kernel at PT 32K
# (one launch; speed of light, memory, compute, warp states, per-SASS stall samples).
#   bash bench/results/2026-12-06-bwd-profile/run1.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
{ echo "$gpu"; nvidia-smi --query-gpu=driver_version,clocks.max.sm --format=csv,noheader; head -1 "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
t0=$SECONDS
st() { echo "[$((SECONDS - t0)) s] $*"; }
if [[ "$gpu" == *H200* ]]; then
  st "H200: the backward job"
  ORTHROS_BENCH_RUNS=15 ORTHROS_LAYER_SANITIZER_TOOLS="" OUT=$OUTDIR/bwd bash ci/gpu_backward.sh > "$OUTDIR/bwd_job.log" 2>&1
  st "backward job exit $?"
  grep -E "exit status|ERROR SUMMARY|RACECHECK SUMMARY|PASS|FAIL" "$OUTDIR/bwd_job.log" | head -60
  sed -n '/== summary/,$p' "$OUTDIR/bwd_job.log"
  st "H200: the forward benchmark and peers"
  timeout 150 "$BIN/bench_attention_gpu" --runs 15 --json "$OUTDIR/fwd/bench_ours.json" > "$OUTDIR/fwd_ours.log" 2>&1 \
    || echo "forward bench exit $?"
  PYTHONPATH=/tmp/site timeout 200 python3 bench/gpu/peers.py --runs 15 --json "$OUTDIR/fwd/bench_peers.json" \
    > "$OUTDIR/fwd_peers.log" 2>&1 || echo "forward peers exit $?"
  python3 bench/gpu/summarize.py "$OUTDIR/fwd/bench_ours.json" "$OUTDIR/fwd/bench_peers.json" > "$OUTDIR/fwd_summary.md" 2>&1
  grep -E "copy|prefill_T128K|pt_T32K|pt_T8K" "$OUTDIR/fwd_ours.log" | head; head -30 "$OUTDIR/fwd_summary.md"
fi
st "Nsight Compute: the fused kernel at PT 32K"
rep=/tmp/fused32k
timeout 300 ncu --clock-control none --kernel-name "regex:hopper_bwd_kernel" --launch-skip 1 --launch-count 1 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section SchedulerStats --section InstructionStats --section LaunchStats --section Occupancy --section SourceCounters \
  --import-source no -o $rep -f "$BIN/bench_attention_backward_gpu" --backward-only --runs 1 --seq-lens 32768 \
  > /tmp/ncu_run.log 2>&1
st "ncu exit $?"
ncu --import $rep.ncu-rep --page details > "$OUTDIR/ncu_details.txt" 2>&1
ncu --import $rep.ncu-rep --page source --csv --print-source sass > /tmp/src.csv 2>/dev/null
python3 bench/results/2026-12-06-bwd-profile/stall_table.py /tmp/src.csv > "$OUTDIR/ncu_source_top.txt" 2>&1
grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Issue Slots Busy|Registers Per|Executed Ipc A|Warp Cycles Per Issued|No Eligible|Active Warps Per" "$OUTDIR/ncu_details.txt" | head -30
head -45 "$OUTDIR/ncu_source_top.txt"
st done
