#!/usr/bin/env bash
# Device call 6 (2026-12-06, third session): the kernel-family suite with the new
# CustomScalesMatchGenericAndOracle (positive, negative and zero softmax scales: both exponent
# forms of online_softmax_scores), default schedule and bands of 7. From the repository root,
# after ORTHROS_GPU_BUILD_DIR=build bash ci/gpu_stage.sh:
#   bash bench/results/2026-12-06-fwd-pipe/run6.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; cat "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
for band in "" 7; do
  ORTHROS_FWD_BAND=$band timeout 120 "$BIN/test_attention_kernels_gpu" > "$OUTDIR/kernels_band$band.log" 2>&1
  echo "band '$band' exit $?"; grep -E "^\[       OK|FAILED|PASSED|Failure|Expected|Which is|actual|scale=" "$OUTDIR/kernels_band$band.log" | head -20
done
