#!/usr/bin/env bash
# Device call 5 (2026-12-06, third session): Nsight Compute (--set full, one launch, clocks as
# found) of the final forward kernel in the fast mode at PT 32K and prefill 128K, the two rows of
# issue 20 it misses. From the repository root, after ORTHROS_GPU_BUILD_DIR=build bash ci/gpu_stage.sh:
#   bash bench/results/2026-12-06-fwd-pipe/run5.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; cat "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
ncu --query-metrics --chip gh100 2>/dev/null | grep -iE "gmma|pipe_tensor" | head -8
for c in pt_T32K prefill_T128K; do
  log="$OUTDIR/ncu_$c.txt"
  timeout 200 ncu --clock-control none --set full --kernel-name regex:hopper_attn_kernel --launch-skip 2 --launch-count 1 \
    --metrics "sm__pipe_tensor_cycles_active_realtime.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active_realtime.avg.pct_of_peak_sustained_active" \
    "$BIN/bench_attention_gpu" --runs 1 --only $c > "$log" 2>&1
  echo "== ncu $c: exit $?"
  grep -E "realtime|Tensor|Duration|SM Busy|Issue Slots Busy|Compute \(SM\) Throughput|L2 Cache Throughput|DRAM Throughput|L1/TEX Cache Throughput|L2 Hit Rate|highest utilized|Warp Cycles Per Issued|No Eligible|Theoretical Occupancy" "$log" \
    | grep -vE "^\s+(OPT|INF|WRN)" | sed 's/  */ /g' | head -24
  grep -E "stalled|stall" "$log" | grep -E "cycles being stalled|represents about" | sed 's/  */ /g' | head -6
done
