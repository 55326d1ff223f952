#!/usr/bin/env bash
# One device call (2026-12-06): the Hopper forward's base-stream runs (ORTHROS_FWD_BASE_RUN=1 is the
# previous schedule, one row block per item, same binary). Tests on the forced-run and automatic
# paths, sanitizers on forced runs, then the forward benchmark's prefill and PT rows for run
# lengths 1 / automatic / 16 and the peers. From the repository root, after
# ORTHROS_GPU_BUILD_DIR=build bash ci/gpu_stage.sh:
#   bash bench/results/2026-12-06-fwd-order/run.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
RUNS=${RUNS:-9}
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; cat "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
t0=$SECONDS
st() { echo "[$((SECONDS - t0)) s] $*"; }
st "forward tests, runs forced to 3"
ORTHROS_FWD_BASE_RUN=3 RC_PARAMS=max_success=40 timeout 150 "$BIN/test_attention_gpu" > "$OUTDIR/tests_runs3.log" 2>&1
echo "runs3 exit $?"; grep -E "FAILED|PASSED|Failure" "$OUTDIR/tests_runs3.log" | head -8
for r in 1 auto 16; do
  st "bench, base run $r"
  if [ "$r" = auto ]; then e=; else e=$r; fi
  ORTHROS_FWD_BASE_RUN=$e timeout 60 "$BIN/bench_attention_gpu" --runs "$RUNS" --only prefill \
    --json "$OUTDIR/bench_prefill_run$r.json" > "$OUTDIR/bench_prefill_run$r.log" 2>&1
  echo "exit $?"; grep -E "^d2d|^prefill" "$OUTDIR/bench_prefill_run$r.log" | grep -v generic
  ORTHROS_FWD_BASE_RUN=$e timeout 60 "$BIN/bench_attention_gpu" --runs "$RUNS" --only pt_ \
    --json "$OUTDIR/bench_pt_run$r.json" > "$OUTDIR/bench_pt_run$r.log" 2>&1
  echo "exit $?"; grep -E "^pt_" "$OUTDIR/bench_pt_run$r.log" | grep -v generic
done
st "peers"
if ls .whl/nvidia_cudnn_frontend-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
timeout 150 python3 bench/gpu/peers.py --runs "$RUNS" --json "$OUTDIR/bench_peers.json" > "$OUTDIR/bench_peers.log" 2>&1
echo "peers exit $?"; grep -E "cudnn|flash" "$OUTDIR/bench_peers.log" | grep -v Warning | head -20
st "forward tests, automatic"
RC_PARAMS=max_success=40 timeout 200 "$BIN/test_attention_gpu" > "$OUTDIR/tests_auto.log" 2>&1
echo "auto exit $?"; grep -E "FAILED|PASSED|Failure" "$OUTDIR/tests_auto.log" | head -8
st "Hopper tests, runs forced to 8"
ORTHROS_FWD_BASE_RUN=8 timeout 100 "$BIN/test_attention_gpu" --gtest_filter='*Hopper*:*Ragged*' > "$OUTDIR/tests_runs8.log" 2>&1
echo "runs8 exit $?"; grep -E "FAILED|PASSED|Failure" "$OUTDIR/tests_runs8.log" | head -8
st "sanitizers, runs forced to 3"
for tool in synccheck racecheck memcheck initcheck; do
  ORTHROS_FWD_BASE_RUN=3 timeout 60 compute-sanitizer --tool $tool --error-exitcode 3 "$BIN/test_attention_gpu" \
    --gtest_filter='*HopperMatchesGeneric*:*WindowBoundary*' > "$OUTDIR/san_$tool.log" 2>&1
  echo "$tool exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$OUTDIR/san_$tool.log" | head -3 | tr '\n' ' ')"
done
st done
