#!/usr/bin/env bash
# The final device call of 2026-12-06, from the repository root after
# ORTHROS_GPU_BUILD_DIR=build bash ci/gpu_stage.sh (carry build-xz and .whl):
#   bash bench/results/2026-12-06-h200-bwd-pipeline/run_final.sh
# ci/gpu_backward.sh (tests on four paths, layer backward, verify --grad, sanitizers, our benchmark,
# the cuDNN/FA2 peers, the summary), then the pipelined loop forced off / on at PT 24K and 32K
# (two kernels), then Nsight Compute of the dk/dv kernel at PT 32K both ways. Logs: $OUT/logs.tar.xz.
set -uo pipefail
cd "$(dirname "$0")/../../.."
FINAL_OUT=${OUT:-gpu-out}
export OUT=/tmp/orthros-gpu-out
mkdir -p "$OUT"
t0=$SECONDS
ORTHROS_BENCH_RUNS=9 ORTHROS_LAYER_SANITIZER_TOOLS="" bash ci/gpu_backward.sh > "$OUT/gpu_backward.log" 2>&1
echo "gpu_backward.sh exit $? ($((SECONDS - t0)) s)"
grep -E "exit status|ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED|verify.*(PASS|FAIL)" "$OUT/gpu_backward.log" | head -60
source ci/gpu_env.sh
for p in 0 1; do
  ORTHROS_BWD_PIPE=$p ORTHROS_BWD_FUSED_DQ=0 timeout 120 "$BIN/bench_attention_backward_gpu" --backward-only --runs 9 \
    --seq-lens 24576,32768 > "$OUT/ab_pipe$p.log" 2>&1
  echo "== A/B PIPE=$p (two kernels) exit $?"; grep -E "_bwd " "$OUT/ab_pipe$p.log"
done
echo "[$((SECONDS - t0)) s] ncu"
for p in 0 1; do
  ORTHROS_BWD_PIPE=$p ORTHROS_BWD_FUSED_DQ=0 timeout 100 ncu --clock-control none --kernel-name "regex:hopper_bwd_kernel" \
    --launch-skip 3 --launch-count 1 --metrics gpu__time_duration.sum,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,lts__t_bytes.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__throughput.avg.pct_of_peak_sustained_elapsed,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio \
    "$BIN/bench_attention_backward_gpu" --runs 1 --backward-only --seq-lens 32768 > "$OUT/ncu_pipe$p.txt" 2>&1
  echo "== ncu PIPE=$p exit $?"; grep -E "duration|hit_rate|bytes|gmma|throughput|stalled" "$OUT/ncu_pipe$p.txt" | sed 's/  */ /g'
done
echo "[$((SECONDS - t0)) s] done"
tar -C "$OUT" -cf - . | xz -6 > "$FINAL_OUT/logs.tar.xz"
cp "$OUT/summary_bwd.md" "$FINAL_OUT/" 2>/dev/null
sed -n '/== summary/,$p' "$OUT/gpu_backward.log" | tail -40
