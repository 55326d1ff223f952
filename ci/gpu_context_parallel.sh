#!/usr/bin/env bash
# GPU job (context parallelism), run on the device machine from the repository root:
#   bash ci/gpu_context_parallel.sh
# Expects test_context_parallel_gpu and bench_context_parallel (ci/gpu_stage.sh, NCCL build) in
# $ORTHROS_GPU_BIN (default build-cuda-carry) and libnccl.so.2 from the image's nvidia-nccl wheel
# (the PyTorch environment's nvidia/nccl/lib) or on LD_LIBRARY_PATH. Steps: the loopback tests
# (R virtual ranks on each GPU), compute-sanitizer memcheck + racecheck on a subset, the benchmark
# (R = 1 .. visible GPUs); the benchmark's table last. Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
source ci/gpu_env.sh  # BIN, OUTDIR, LD_LIBRARY_PATH (cuBLAS, NCCL)
echo "== context-parallel tests (libnccl from ${NCCL_LIB:-LD_LIBRARY_PATH})"
timeout 240 "$BIN/test_context_parallel_gpu" > "$OUTDIR/tests_cp.log" 2>&1
rc=$?
grep -E "^\[  |^\[       OK|FAILED|Failure" "$OUTDIR/tests_cp.log" | cut -c1-200
echo "context-parallel tests exit status: $rc"
for tool in memcheck racecheck; do
  echo "== compute-sanitizer $tool (context parallel: decode + arguments)"
  timeout 240 compute-sanitizer --tool $tool --error-exitcode 3 "$BIN/test_context_parallel_gpu" \
    --gtest_filter='*Decode*:*Args*' > "$OUTDIR/sanitizer_cp_$tool.log" 2>&1
  echo "$tool exit status: $?"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$OUTDIR/sanitizer_cp_$tool.log" | head -4
done
echo "== context-parallel benchmark"
timeout 300 "$BIN/bench_context_parallel" --runs "${ORTHROS_BENCH_RUNS:-10}" --json "$OUTDIR/bench_cp.json" 2>&1 \
  | tee "$OUTDIR/bench_cp.log"
exit $rc
