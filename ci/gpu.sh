#!/usr/bin/env bash
# GPU job (forward and layer), run on the device machine in ONE call, from the repository root:
#   bash ci/gpu.sh
# Expects the binaries built on the build host (cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release;
# cmake --build build-cuda --target test_attention_gpu bench_attention_gpu) copied with
# libgomp.so.1 into build-cuda-carry/ (ci/gpu_stage.sh does it), that folder carried along.
# ORTHROS_SKIP_TESTS, ORTHROS_SKIP_SANITIZER, ORTHROS_SKIP_CLI, ORTHROS_SKIP_BENCH and
# ORTHROS_SKIP_COMPLEXITY (any value) leave a part out, to split the job over calls.
# Writes logs under $OUT (or ./gpu-out), prints the target table last. Exit status: nonzero if
# the GPU tests failed.
set -uo pipefail
cd "$(dirname "$0")/.."
source ci/gpu_env.sh  # BIN, OUTDIR, LD_LIBRARY_PATH (cuBLAS, NCCL)
source ci/python_package.sh  # orthros_carried_wheels
RUNS=${ORTHROS_BENCH_RUNS:-25}
QUICK=${ORTHROS_BENCH_QUICK:+--quick}

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; cat "$BIN/COMMIT" 2>/dev/null; date -u; } \
  | tee "$OUTDIR/env.txt"

test_rc=0
if [ -z "${ORTHROS_SKIP_TESTS:-}" ]; then
  echo "== gpu tests"
  RC_PARAMS=${RC_PARAMS:-max_success=100} timeout 420 "$BIN/test_attention_gpu" 2>&1 | tee "$OUTDIR/tests.log" \
    | grep -E "^\[  |^\[       OK|FAILED|Failure|max err|skipped" 
  test_rc=${PIPESTATUS[0]}
  # On a Hopper GPU the default path is the wgmma kernel; the fallback kernels run the same suite.
  echo "== gpu tests, generic kernels (ORTHROS_TEST_KERNEL=generic)"
  ORTHROS_TEST_KERNEL=generic RC_PARAMS=${RC_PARAMS:-max_success=100} timeout 420 "$BIN/test_attention_gpu" 2>&1 \
    | tee "$OUTDIR/tests_generic.log" | grep -E "FAILED|Failure|PASSED|skipped"
  generic_rc=${PIPESTATUS[0]}; [ "$generic_rc" -ne 0 ] && test_rc=$generic_rc
  echo "== gpu kernel-family tests (Hopper vs generic bitwise, float32 output stream; default bands, bands of 7)"
  for band in "" 7; do
    ORTHROS_FWD_BAND=$band timeout 300 "$BIN/test_attention_kernels_gpu" 2>&1 | tee -a "$OUTDIR/tests_kernels.log" \
      | grep -E "FAILED|Failure|PASSED|skipped"
    kernels_rc=${PIPESTATUS[0]}; [ "$kernels_rc" -ne 0 ] && test_rc=$kernels_rc
  done
  echo "== gpu layer tests"
  timeout 120 "$BIN/test_layer_gpu" 2>&1 | tee "$OUTDIR/tests_layer.log" | grep -E "^\[  |^\[       OK|FAILED|Failure|worst|skipped"
  layer_rc=${PIPESTATUS[0]}; [ "$layer_rc" -ne 0 ] && test_rc=$layer_rc
fi

if [ -z "${ORTHROS_SKIP_SANITIZER:-}" ]; then
  # compute-sanitizer over the GPU tests: few property draws (kernels run ~10-100x slower
  # under the tools); summaries in $OUTDIR/sanitizer_summary.txt. A report fails the job.
  : >"$OUTDIR/sanitizer_summary.txt"
  # All four tools: memcheck (out-of-bounds/misaligned accesses), racecheck (shared-memory
  # hazards), initcheck (reads of uninitialised device memory), synccheck (barrier misuse, e.g.
  # an mbarrier phase receiving more arrivals than it was initialised with).
  for tool in ${ORTHROS_SANITIZER_TOOLS:-memcheck racecheck initcheck synccheck}; do
    for t in test_attention_gpu test_attention_kernels_gpu test_layer_gpu; do
      log="$OUTDIR/sanitizer_${tool}_$t.log"
      RC_PARAMS=max_success=3 timeout 400 compute-sanitizer --tool $tool --error-exitcode 3 "$BIN/$t" \
        --gtest_filter='-*RaggedBatchOver48Sequences*:*DecodeSplitCounts4096*:*HopperWindowsAndGroupsMatchGeneric*' \
        >"$log" 2>&1
      san_rc=$?
      # racecheck does not model the mbarrier/TMA synchronization of cuBLAS's own sm90 kernels
      # (nvjet_*, used by the layer's projections): hazards reported only inside them are listed but
      # not counted (excluding them with --kernel-name-exclude crashes the tool on the H200).
      ours=$(grep "Race reported" "$log" | grep -vc "nvjet_sm90_")
      theirs=$(grep "Race reported" "$log" | grep -c "nvjet_sm90_")
      if [ "$tool" = racecheck ] && [ "$san_rc" -eq 3 ] && [ "$ours" -eq 0 ] && ! grep -q FAILED "$log"; then
        san_rc=0
      fi
      { echo "== compute-sanitizer $tool $t: exit $san_rc (race hazards in our kernels: $ours, in cuBLAS nvjet kernels: $theirs)"
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|tests ran|PASSED|FAILED" "$log" | tail -4; } \
        | tee -a "$OUTDIR/sanitizer_summary.txt"
      [ "$san_rc" -ne 0 ] && test_rc=$san_rc
    done
  done
fi

if [ -x "$BIN/orthros" ] && [ -z "${ORTHROS_SKIP_CLI:-}" ]; then
  echo "== orthros verify --device cuda"
  for spec in "tiny 300" "qwen3-8b 1200"; do
    set -- $spec
    timeout 180 "$BIN/orthros" verify --device cuda --config $1 --seq-len $2 2>&1 | tee -a "$OUTDIR/verify_cuda.log"
    verify_rc=${PIPESTATUS[0]}; [ "$verify_rc" -ne 0 ] && test_rc=$verify_rc
  done
fi

if [ -z "${ORTHROS_SKIP_BENCH:-}" ]; then
  echo "== benchmarks (ours)"
  timeout 300 "$BIN/bench_attention_gpu" --runs "$RUNS" $QUICK --json "$OUTDIR/bench_ours.json" 2>&1 | tee "$OUTDIR/bench_ours.log"
  echo "== benchmarks (PyTorch and cuDNN peers)"
  # cuDNN's sliding-window forward needs nvidia-cudnn-frontend==1.32.0, carried as a wheel:
  # here `pip download --no-deps --only-binary=:all: --python-version 3.12 nvidia-cudnn-frontend==1.32.0 -d .whl/`.
  orthros_carried_wheels python3 'nvidia_cudnn_frontend-*.whl'
  timeout 400 python3 bench/gpu/peers.py --runs "$RUNS" $QUICK --json "$OUTDIR/bench_peers.json" 2>&1 \
    | grep -v Warning | tee "$OUTDIR/bench_peers.log"
  echo "== summary"
  python3 bench/gpu/summarize.py "$OUTDIR/bench_ours.json" "$OUTDIR/bench_peers.json" > "$OUTDIR/summary.md"
fi
if [ -x "$BIN/orthros_bench_gpu" ] && [ -z "${ORTHROS_SKIP_COMPLEXITY:-}" ]; then
  echo "== complexity sweep"
  bash bench/scripts/gpu_complexity.sh "$BIN/orthros_bench_gpu" "$OUTDIR" > "$OUTDIR/gpu_complexity.log" 2>&1 \
    || echo "complexity sweep exit status $?"
  grep -E "BigO|RMS" "$OUTDIR/gpu_complexity.log" | head -40
fi
[ -f "$OUTDIR/summary.md" ] && cat "$OUTDIR/summary.md"
echo "gpu tests exit status: $test_rc"
exit $test_rc
