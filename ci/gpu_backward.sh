#!/usr/bin/env bash
# GPU job of issue 10 (attention backward), run on the device machine in ONE call from the
# repository root:  bash ci/gpu_backward.sh
# Expects build-cuda-carry/ from ci/gpu_stage.sh (test_attention_backward_gpu,
# bench_attention_backward_gpu, libgomp) and, for the cuDNN sliding-window peer, the wheel of
# nvidia-cudnn-frontend==1.32.0 in .whl/ (here: pip download --no-deps nvidia-cudnn-frontend==1.32.0
# -d .whl/; carry .whl). Steps: GPU tests, compute-sanitizer memcheck + racecheck on the small
# shapes, our benchmark, the PyTorch/cuDNN peers, the summary table last. Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${ORTHROS_GPU_BIN:-build-cuda-carry}
OUTDIR=${OUT:-gpu-out}
RUNS=${ORTHROS_BENCH_RUNS:-15}
mkdir -p "$OUTDIR"
export LD_LIBRARY_PATH="$PWD/$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; cat "$BIN/COMMIT" 2>/dev/null; date -u; } \
  | tee "$OUTDIR/env.txt"
echo "== backward gpu tests"
timeout 240 "$BIN/test_attention_backward_gpu" > "$OUTDIR/tests_bwd.log" 2>&1
test_rc=$?
grep -E "^\[  |^\[       OK|FAILED|Failure|^\[ bwd|^(dq|dk|dv|dq_out):" "$OUTDIR/tests_bwd.log" | cut -c1-300
echo "tests exit status: $test_rc"
if [ -z "${ORTHROS_SKIP_SANITIZER:-}" ]; then
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer $tool (SanitizerSmall)"
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 3 "$BIN/test_attention_backward_gpu" \
      --gtest_filter='*SanitizerSmall*' > "$OUTDIR/sanitizer_$tool.log" 2>&1
    echo "$tool exit status: $?"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Hazard|Invalid|PASSED|FAILED" "$OUTDIR/sanitizer_$tool.log" | head -8
  done
fi
if [ -z "${ORTHROS_SKIP_BENCH:-}" ]; then
  echo "== benchmark (ours)"
  timeout 200 "$BIN/bench_attention_backward_gpu" --runs "$RUNS" --json "$OUTDIR/bench_bwd_ours.json" 2>&1 \
    | tee "$OUTDIR/bench_bwd_ours.log"
  echo "== benchmark (peers)"
  if ls .whl/nvidia_cudnn_frontend-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  timeout 300 python3 bench/gpu/peers_backward.py --runs "$RUNS" --json "$OUTDIR/bench_bwd_peers.json" 2>&1 \
    | grep -v Warning | tee "$OUTDIR/bench_bwd_peers.log"
  echo "== summary"
  python3 bench/gpu/summarize_backward.py "$OUTDIR/bench_bwd_ours.json" "$OUTDIR/bench_bwd_peers.json" \
    | tee "$OUTDIR/summary_bwd.md"
fi
exit $test_rc
