#!/usr/bin/env bash
# Fourth device call (2026-12-06): the Hopper forward with the L2-aware default order (bands only
# where several KV heads' K/V fit half the L2), tests and sanitizers, then A/B against x fastest
# (ORTHROS_FWD_BAND=1000000) and bands of 33 (4 per round on 132 SMs) at every size, twice,
# interleaved; then the whole forward benchmark and the peers. From the repository root, after
# ORTHROS_GPU_BUILD_DIR=build bash ci/gpu_stage.sh:
#   bash bench/results/2026-12-06-fwd-order/run4.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
RUNS=${RUNS:-9}
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; cat "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
t0=$SECONDS
st() { echo "[$((SECONDS - t0)) s] $*"; }
st "forward tests (default order), bands of 7, layer tests"
RC_PARAMS=max_success=40 timeout 150 "$BIN/test_attention_gpu" > "$OUTDIR/tests.log" 2>&1
echo "default exit $?"; grep -E "FAILED|PASSED|Failure" "$OUTDIR/tests.log" | head -8
ORTHROS_FWD_BAND=7 RC_PARAMS=max_success=40 timeout 150 "$BIN/test_attention_gpu" > "$OUTDIR/tests_band7.log" 2>&1
echo "band7 exit $?"; grep -E "FAILED|PASSED|Failure" "$OUTDIR/tests_band7.log" | head -8
timeout 120 "$BIN/test_layer_gpu" > "$OUTDIR/tests_layer.log" 2>&1
echo "layer exit $?"; grep -E "FAILED|PASSED|Failure" "$OUTDIR/tests_layer.log" | head -4
st "sanitizers"
for tool in synccheck racecheck memcheck initcheck; do
  timeout 60 compute-sanitizer --tool $tool --error-exitcode 3 "$BIN/test_attention_gpu" \
    --gtest_filter='*HopperMatchesGeneric*:*WindowBoundary*' > "$OUTDIR/san_$tool.log" 2>&1
  echo "$tool exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$OUTDIR/san_$tool.log" | head -3 | tr '\n' ' ')"
done
st "A/B"
: > "$OUTDIR/ab.txt"
for rep in 1 2; do
  for band in 0 1000000 33; do
    for only in prefill_T pt_T; do
      ORTHROS_FWD_BAND=$band timeout 60 "$BIN/bench_attention_gpu" --runs "$RUNS" --only $only > "$OUTDIR/b.log" 2>&1 \
        || echo "bench exit $?"
      grep -E "^(prefill|pt)_T[0-9]+K +B.*fast *[0-9]" "$OUTDIR/b.log" | awk -v b=$band -v r=$rep '{print "rep", r, "band", b, $1, $(NF-3)}' \
        | tee -a "$OUTDIR/ab.txt"
    done
  done
done
st "whole forward benchmark, peers"
timeout 120 "$BIN/bench_attention_gpu" --runs "$RUNS" --json "$OUTDIR/bench_ours.json" > "$OUTDIR/bench_ours.log" 2>&1
echo "bench exit $?"
if ls .whl/nvidia_cudnn_frontend-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
timeout 150 python3 bench/gpu/peers.py --runs "$RUNS" --json "$OUTDIR/bench_peers.json" > "$OUTDIR/bench_peers.log" 2>&1
echo "peers exit $?"
python3 bench/gpu/summarize.py "$OUTDIR/bench_ours.json" "$OUTDIR/bench_peers.json" > "$OUTDIR/summary.md" 2>&1
cat "$OUTDIR/summary.md" | head -40
st done
