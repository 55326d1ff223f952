#!/usr/bin/env bash
# Second device call (2026-12-06): the pipelined dk/dv loop with a 2- or 3-stage Q/dO ring
# (ORTHROS_BWD_PIPE=2/3) against the kept loop (0), two kernels (ORTHROS_BWD_FUSED_DQ=0), PT 8K-32K;
# then Nsight Compute of the dk/dv kernel at PT 32K (L2 hit rate, DRAM bytes) for 0 and 3.
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
t0=$SECONDS
st() { echo "[$((SECONDS - t0)) s] $*"; }
st "backward tests, 2-stage pipelined loop"
ORTHROS_BWD_PIPE=2 timeout 200 "$BIN/test_attention_backward_gpu" > "$OUTDIR/tests_bwd_pipe2.log" 2>&1
echo "exit $?"; grep -E "FAILED|PASSED" "$OUTDIR/tests_bwd_pipe2.log" | head -4
for rep in 1 2; do
  for p in 0 2 3; do
    ORTHROS_BWD_PIPE=$p ORTHROS_BWD_FUSED_DQ=0 timeout 200 "$BIN/bench_attention_backward_gpu" --backward-only --runs 9 \
      --seq-lens 8192,16384,24576,32768 > "$OUTDIR/b_pipe${p}_r$rep.log" 2>&1
    echo "== rep $rep PIPE=$p exit $?"; grep -E "^pt_.*_bwd " "$OUTDIR/b_pipe${p}_r$rep.log" | awk '{print $1, $(NF-1)}' | tr '\n' ' '; echo
  done
done
st "ncu"
for p in 0 3; do
  ORTHROS_BWD_PIPE=$p ORTHROS_BWD_FUSED_DQ=0 timeout 200 ncu --clock-control none --kernel-name "regex:hopper_bwd_kernel" \
    --launch-skip 3 --launch-count 1 --metrics gpu__time_duration.sum,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,lts__t_bytes.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__throughput.avg.pct_of_peak_sustained_elapsed,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio \
    "$BIN/bench_attention_backward_gpu" --runs 1 --backward-only --seq-lens 32768 > "$OUTDIR/ncu_pipe$p.txt" 2>&1
  echo "== ncu PIPE=$p exit $?"; grep -E "duration|hit_rate|bytes|gmma|throughput|stalled" "$OUTDIR/ncu_pipe$p.txt" | sed 's/  */ /g'
done
st done
