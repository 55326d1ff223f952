#!/usr/bin/env bash
# Second device call (2026-12-06): the Hopper forward's item order (ORTHROS_FWD_BAND: 0 = x fastest
# per KV head, the previous order; 1 = KV head fastest; n = bands of n block indices) against the
# base-stream run length (ORTHROS_FWD_BASE_RUN), fast mode, same binary. Tests first on two
# orders. From the repository root, after ORTHROS_GPU_BUILD_DIR=build bash ci/gpu_stage.sh:
#   bash bench/results/2026-12-06-fwd-order/run2.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
RUNS=${RUNS:-9}
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; cat "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
t0=$SECONDS
st() { echo "[$((SECONDS - t0)) s] $*"; }
st "forward tests, band 1, runs 3"
ORTHROS_FWD_BAND=1 ORTHROS_FWD_BASE_RUN=3 RC_PARAMS=max_success=40 timeout 150 "$BIN/test_attention_gpu" > "$OUTDIR/t1.log" 2>&1
echo "exit $?"; grep -E "FAILED|PASSED|Failure" "$OUTDIR/t1.log" | head -8
st "Hopper tests, band 7, runs 2"
ORTHROS_FWD_BAND=7 ORTHROS_FWD_BASE_RUN=2 timeout 100 "$BIN/test_attention_gpu" --gtest_filter='*Hopper*:*Ragged*' > "$OUTDIR/t2.log" 2>&1
echo "exit $?"; grep -E "FAILED|PASSED|Failure" "$OUTDIR/t2.log" | head -8
: > "$OUTDIR/grid.txt"
for band in 0 1 33 132; do
  for run in 1 8 16; do
    for only in prefill_T pt_T; do
      ORTHROS_FWD_BAND=$band ORTHROS_FWD_BASE_RUN=$run timeout 60 "$BIN/bench_attention_gpu" --runs "$RUNS" --only $only \
        > "$OUTDIR/b.log" 2>&1 || echo "bench exit $?"
      grep -E "^(prefill|pt)_T[0-9]+K +B.*fast *[0-9]" "$OUTDIR/b.log" | awk -v b=$band -v r=$run '{print "band", b, "run", r, $1, $(NF-3)}' \
        | tee -a "$OUTDIR/grid.txt"
    done
  done
done
st done
