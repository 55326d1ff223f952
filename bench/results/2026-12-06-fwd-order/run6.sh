#!/usr/bin/env bash
# Sixth device call (2026-12-06): after the forward epilogues' float32 and dtype stores were folded
# into one loop (store_pair): the kernel-family suite (its float32 output-stream test covers the
# Hopper, mma.sync and SIMT epilogues and the merge), the forward suite, the context-parallel suite
# (float32 partials), memcheck and racecheck on the float32 test. From the repository root, after
# ORTHROS_GPU_BUILD_DIR=build bash ci/gpu_stage.sh:
#   bash bench/results/2026-12-06-fwd-order/run6.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; cat "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
t0=$SECONDS
st() { echo "[$((SECONDS - t0)) s] $*"; }
st "kernel-family suite"
timeout 100 "$BIN/test_attention_kernels_gpu" > "$OUTDIR/kernels.log" 2>&1
echo "exit $?"; grep -E "^\[       OK|FAILED|PASSED|Failure" "$OUTDIR/kernels.log" | head -12
st "forward suite, context-parallel suite"
RC_PARAMS=max_success=30 timeout 100 "$BIN/test_attention_gpu" > "$OUTDIR/tests.log" 2>&1
echo "forward exit $?"; grep -E "FAILED|PASSED" "$OUTDIR/tests.log" | head -5
timeout 100 "$BIN/test_context_parallel_gpu" > "$OUTDIR/cp.log" 2>&1
echo "context parallel exit $?"; grep -E "FAILED|PASSED" "$OUTDIR/cp.log" | head -5
st "memcheck, racecheck on the float32 test"
for tool in memcheck racecheck; do
  timeout 60 compute-sanitizer --tool $tool --error-exitcode 3 "$BIN/test_attention_kernels_gpu" \
    --gtest_filter='*Float32*' > "$OUTDIR/san_$tool.log" 2>&1
  echo "$tool exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$OUTDIR/san_$tool.log" | head -3 | tr '\n' ' ')"
done
st done
