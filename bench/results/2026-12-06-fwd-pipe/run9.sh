#!/usr/bin/env bash
# Device call 9 (2026-12-06, third session): after the final review's refactors (one stage wait
# and one cp.async fence for both consumer loops of the Hopper forward, one pairwise-tree helper
# for the softmax's max and sum, one case-upload helper for the GPU tests): the kernel-family suite
# (default, bands of 7), the forward suite, and a timing check against the binary before them
# (bench_attention_gpu_prev2), interleaved. From the repository root, after
# ORTHROS_GPU_BUILD_DIR=build bash ci/gpu_stage.sh:
#   bash bench/results/2026-12-06-fwd-pipe/run9.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; cat "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
for band in "" 7; do
  ORTHROS_FWD_BAND=$band timeout 100 "$BIN/test_attention_kernels_gpu" > "$OUTDIR/kernels_band$band.log" 2>&1
  echo "kernels band '$band' exit $?: $(grep -E 'PASSED|FAILED' "$OUTDIR/kernels_band$band.log" | tr '\n' ' ')"
done
RC_PARAMS=max_success=40 timeout 120 "$BIN/test_attention_gpu" > "$OUTDIR/tests.log" 2>&1
echo "forward exit $?: $(grep -E 'PASSED|FAILED' "$OUTDIR/tests.log" | tr '\n' ' ')"
for rep in 1 2; do
  for bin in bench_attention_gpu_prev2 bench_attention_gpu; do
    timeout 60 "$BIN/$bin" --runs 9 --only pt_T > "$OUTDIR/b.log" 2>&1
    grep -E "^pt_T[0-9]+K +B" "$OUTDIR/b.log" | grep -v generic | awk -v b=$bin -v r=$rep '{print "rep", r, b, $1, $(NF-4), $(NF-3)}'
  done
done
