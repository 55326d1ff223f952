#!/usr/bin/env bash
# Fifth device call (2026-12-06), the final commit's forward tests: the kernel-family suite (new:
# the float32 output stream on every family) with the default bands and bands of 7, the forward
# suite, the layer suite, and the four sanitizers on the kernel-family suite. From the repository
# root, after ORTHROS_GPU_BUILD_DIR=build bash ci/gpu_stage.sh:
#   bash bench/results/2026-12-06-fwd-order/run5.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; cat "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
t0=$SECONDS
st() { echo "[$((SECONDS - t0)) s] $*"; }
for band in "" 7; do
  st "kernel-family tests, ORTHROS_FWD_BAND='$band'"
  ORTHROS_FWD_BAND=$band timeout 150 "$BIN/test_attention_kernels_gpu" > "$OUTDIR/kernels_band$band.log" 2>&1
  echo "exit $?"; grep -E "^\[       OK|FAILED|PASSED|Failure|Expected|Which is|actual" "$OUTDIR/kernels_band$band.log" | head -20
done
st "forward suite, layer suite"
RC_PARAMS=max_success=40 timeout 150 "$BIN/test_attention_gpu" > "$OUTDIR/tests.log" 2>&1
echo "forward exit $?"; grep -E "FAILED|PASSED" "$OUTDIR/tests.log" | head -5
timeout 100 "$BIN/test_layer_gpu" > "$OUTDIR/layer.log" 2>&1
echo "layer exit $?"; grep -E "FAILED|PASSED" "$OUTDIR/layer.log" | head -3
st "sanitizers on the kernel-family suite"
for tool in synccheck racecheck memcheck initcheck; do
  timeout 90 compute-sanitizer --tool $tool --error-exitcode 3 "$BIN/test_attention_kernels_gpu" \
    --gtest_filter='*HopperMatchesGeneric*:*Float32*' > "$OUTDIR/san_$tool.log" 2>&1
  echo "$tool exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$OUTDIR/san_$tool.log" | head -3 | tr '\n' ' ')"
done
st done
