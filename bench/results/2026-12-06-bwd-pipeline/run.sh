#!/usr/bin/env bash
# One device call (2026-12-06): the pipelined dk/dv consumer loop (ORTHROS_BWD_PIPE=1) against the
# kept loop, same binary; plus the forward and context-parallel tests of the float32 partial
# outputs. From the repository root, after ORTHROS_GPU_BUILD_DIR=build bash ci/gpu_stage.sh:
#   bash bench/results/2026-12-06-bwd-pipeline/run.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
RUNS=${RUNS:-9}
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; cat "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
t0=$SECONDS
st() { echo "[$((SECONDS - t0)) s] $*"; }
st "backward tests, pipelined loop"
ORTHROS_BWD_PIPE=1 timeout 200 "$BIN/test_attention_backward_gpu" > "$OUTDIR/tests_bwd_pipe.log" 2>&1
echo "tests_bwd_pipe exit $?"; grep -E "FAILED|PASSED|Failure" "$OUTDIR/tests_bwd_pipe.log" | head -8
st "sanitizers, pipelined loop"
for tool in memcheck racecheck synccheck initcheck; do
  ORTHROS_BWD_PIPE=1 timeout 120 compute-sanitizer --tool $tool --error-exitcode 3 "$BIN/test_attention_backward_gpu" \
    --gtest_filter='*SanitizerSmall*' > "$OUTDIR/san_$tool.log" 2>&1
  echo "$tool exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUTDIR/san_$tool.log" | head -2 | tr '\n' ' ')"
done
for v in "0 0" "1 0" "0 auto"; do
  set -- $v
  st "bench PIPE=$1 FUSED=$2"
  if [ "$2" = auto ]; then f=; else f=$2; fi
  ORTHROS_BWD_PIPE=$1 ORTHROS_BWD_FUSED_DQ=$f timeout 200 "$BIN/bench_attention_backward_gpu" --backward-only --runs "$RUNS" \
    --json "$OUTDIR/bench_pipe$1_fused$2.json" > "$OUTDIR/bench_pipe$1_fused$2.log" 2>&1
  echo "exit $?"; grep -E "_bwd|only" "$OUTDIR/bench_pipe$1_fused$2.log" | head -8
done
st "forward tests, context-parallel tests"
timeout 150 "$BIN/test_attention_gpu" > "$OUTDIR/tests_fwd.log" 2>&1; echo "forward exit $?"
grep -E "FAILED|PASSED" "$OUTDIR/tests_fwd.log" | head -5
timeout 150 "$BIN/test_context_parallel_gpu" > "$OUTDIR/tests_cp.log" 2>&1; echo "context parallel exit $?"
grep -E "FAILED|PASSED" "$OUTDIR/tests_cp.log" | head -5
st done
