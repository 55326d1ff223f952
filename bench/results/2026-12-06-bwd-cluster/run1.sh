#!/usr/bin/env bash
# Device call 1 of the cluster experiment (2026-12-06, sixth session): the fused dk/dv/dq kernel
# in clusters of two CTAs on adjacent key blocks of a head, against the same build without
# clusters (ORTHROS_BWD_CLUSTER=0):
#   ORTHROS_BWD_CLUSTER=1  each Q/dO stage loaded once for both CTAs (TMA multicast, half each);
#   ORTHROS_BWD_CLUSTER=2  and the dQ tiles of a row block both CTAs see summed in rank 0's
#                          shared memory (rank 1 stores its tile there) before one bulk reduction.
# In order: a smoke test of each variant (a hang or failure drops it from the benchmark); A/B/C
# interleaved (fused dq forced, PT/SFT 8K and 32K, twice); the backward suite, verify --grad and
# the layer backward on each variant; the four sanitizers on each; Nsight Compute's memory figures
# of the three at PT 32K.
#   bash bench/results/2026-12-06-bwd-cluster/run1.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; head -2 "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
t0=$SECONDS
st() { echo "[$((SECONDS - t0)) s] $*"; }
export ORTHROS_BWD_FUSED_DQ=1
cls=0
for cl in 1 2; do
  ORTHROS_BWD_CLUSTER=$cl timeout 40 "$BIN/test_attention_backward_gpu" --gtest_filter='*SanitizerSmall*' > /tmp/smoke$cl.log 2>&1
  rc=$?
  st "smoke (cluster $cl, SanitizerSmall) exit $rc" | tee -a "$OUTDIR/tests_summary.txt"
  if [ $rc -eq 0 ]; then cls="$cls $cl"; else tail -20 /tmp/smoke$cl.log | tee -a "$OUTDIR/tests_summary.txt"; fi
done
: > "$OUTDIR/ab.txt"
for rep in 1 2; do
  for cl in $cls; do
    ORTHROS_BWD_CLUSTER=$cl timeout 100 "$BIN/bench_attention_backward_gpu" --backward-only --runs 9 \
      --seq-lens 8192,32768 2>&1 | grep -E "_bwd " | awk -v b=cluster$cl -v r=$rep '{print "rep", r, b, $1, $(NF-1)}' \
      | tee -a "$OUTDIR/ab.txt"
  done
done
st "A/B done"
for cl in 1 2; do
  export ORTHROS_BWD_CLUSTER=$cl
  timeout 100 "$BIN/test_attention_backward_gpu" > /tmp/t_$cl.log 2>&1
  st "backward tests (cluster $cl) exit $?: $(grep -E '^\[  (PASSED|FAILED)' /tmp/t_$cl.log | tr '\n' ' ')" | tee -a "$OUTDIR/tests_summary.txt"
  grep -E -A4 "Failure" /tmp/t_$cl.log | head -12 | tee -a "$OUTDIR/tests_summary.txt"
  for cfg in "qwen3-8b 256" "llama3.1-8b 200" "tiny 40"; do
    set -- $cfg
    timeout 100 "$BIN/orthros" verify --grad --device cuda --config $1 --seq-len $2 > /tmp/verify.log 2>&1
    st "verify --grad --device cuda $1 (cluster $cl) exit $?: $(grep -E 'PASS|FAIL' /tmp/verify.log | tail -1)" | tee -a "$OUTDIR/tests_summary.txt"
  done
  timeout 100 "$BIN/test_layer_backward_gpu" > /tmp/layer.log 2>&1
  st "layer backward tests (cluster $cl) exit $?: $(grep -E '^\[  (PASSED|FAILED)' /tmp/layer.log | tr '\n' ' ')" | tee -a "$OUTDIR/tests_summary.txt"
  for tool in synccheck racecheck memcheck initcheck; do
    timeout 120 compute-sanitizer --tool $tool --error-exitcode 3 \
      "$BIN/test_attention_backward_gpu" --gtest_filter='*SanitizerSmall*' > /tmp/san_$tool.log 2>&1
    st "$tool (cluster $cl) exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' /tmp/san_$tool.log | head -3 | tr '\n' ' ')" | tee -a "$OUTDIR/tests_summary.txt"
    grep -m3 -B2 -A8 "Barrier\|Hazard\|Invalid" /tmp/san_$tool.log >> "$OUTDIR/tests_summary.txt"
  done
done
for cl in $cls; do
  ORTHROS_BWD_CLUSTER=$cl timeout 100 ncu --clock-control none --kernel-name "regex:hopper_bwd_kernel" --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    "$BIN/bench_attention_backward_gpu" --backward-only --runs 1 --seq-lens 32768 > "$OUTDIR/ncu_cluster$cl.txt" 2>&1
  st "ncu cluster$cl exit $?"
  grep -E "Duration|DRAM Throughput|L2 Cache Throughput|L2 Hit Rate|Cluster Size" "$OUTDIR/ncu_cluster$cl.txt" | head -8
done
echo "== A/B (ms, median of 9)"; cat "$OUTDIR/ab.txt"
grep -E "exit" "$OUTDIR/tests_summary.txt" | cut -c1-200
