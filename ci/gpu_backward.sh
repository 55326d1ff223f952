#!/usr/bin/env bash
# GPU job (attention backward), run on the device machine in ONE call from the
# repository root:  bash ci/gpu_backward.sh
# Expects build-cuda-carry/ from ci/gpu_stage.sh (test_attention_backward_gpu,
# bench_attention_backward_gpu, libgomp) and, for the cuDNN sliding-window peer, the wheel of
# nvidia-cudnn-frontend==1.32.0 in .whl/ (here: pip download --no-deps nvidia-cudnn-frontend==1.32.0
# -d .whl/ --python-version 3.12 --only-binary=:all:, the device's Python; carry .whl). Steps: GPU
# tests on both kernel paths (automatic: wgmma on an H100/H200; generic), the layer backward tests,
# verify --grad --device cuda, compute-sanitizer (memcheck, racecheck, initcheck, synccheck) on the
# small shapes and memcheck + racecheck on the layer backward (ORTHROS_LAYER_SANITIZER_TOOLS="" skips
# them), our benchmark, the PyTorch/cuDNN peers, with build-py312-carry (ci/gpu_stage_python.sh)
# ours and cuDNN interleaved in one process (bench/gpu/peers_backward_interleaved.py), the summary
# tables last. Logs under $OUT.
# ORTHROS_SKIP_TESTS, ORTHROS_SKIP_SANITIZER and ORTHROS_SKIP_BENCH (any value) leave out the
# tests (GPU tests and verify --grad), the sanitizers or the benchmarks, to split the job over calls.
set -uo pipefail
cd "$(dirname "$0")/.."
source ci/gpu_env.sh  # BIN, OUTDIR, LD_LIBRARY_PATH (cuBLAS, NCCL)
source ci/python_package.sh  # orthros_carried_wheels, orthros_python_package
RUNS=${ORTHROS_BENCH_RUNS:-15}
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; cat "$BIN/COMMIT" 2>/dev/null; date -u; } \
  | tee "$OUTDIR/env.txt"
test_rc=0
# The backward on both kernel paths (automatic: the wgmma kernels on an H100/H200; generic:
# mma.sync), and the automatic path with the fused dq forced (ORTHROS_BWD_FUSED_DQ=1: by default it
# runs only for sequences of >= 12K tokens, longer than the tests').
# And the automatic path with the dk/dv kernel's pipelined loop off (ORTHROS_BWD_PIPE=0: by
# default it runs below 24K output rows, so these sizes would never reach the plain loop at D = 128),
# and with the dq and dk/dv kernels on one stream (ORTHROS_BWD_CONCURRENT=0).
if [ -z "${ORTHROS_SKIP_TESTS:-}" ]; then
  for path in automatic generic fused unpiped serial; do
    echo "== backward gpu tests ($path)"
    kernel=automatic fused= pipe= concurrent=
    case $path in generic) kernel=generic ;; fused) fused=1 ;; unpiped) pipe=0 ;; serial) concurrent=0 ;; esac
    ORTHROS_TEST_KERNEL=$kernel ORTHROS_BWD_FUSED_DQ=$fused ORTHROS_BWD_PIPE=$pipe ORTHROS_BWD_CONCURRENT=$concurrent \
      timeout 240 "$BIN/test_attention_backward_gpu" \
      > "$OUTDIR/tests_bwd_$path.log" 2>&1
    rc=$?
    grep -E "^\[  |^\[       OK|FAILED|Failure|^\[ bwd|^(dq|dk|dv|dq_out):" "$OUTDIR/tests_bwd_$path.log" | cut -c1-300
    echo "tests ($path) exit status: $rc"; [ $test_rc -eq 0 ] && test_rc=$rc
  done
  for fused in "" 1; do
    echo "== layer backward gpu tests${fused:+ (fused dq)}"
    ORTHROS_BWD_FUSED_DQ=$fused timeout 240 "$BIN/test_layer_backward_gpu" > "$OUTDIR/tests_layer_bwd$fused.log" 2>&1
    layer_rc=$?
    grep -E "^\[  |^\[       OK|FAILED|Failure|worst|FAIL" "$OUTDIR/tests_layer_bwd$fused.log" | cut -c1-300
    echo "layer tests exit status: $layer_rc"
    [ $test_rc -eq 0 ] && test_rc=$layer_rc
  done
  echo "== orthros verify --grad --device cuda"
  for cfg in "qwen3-8b 256" "llama3.1-8b 200" "tiny 40"; do
    set -- $cfg
    timeout 240 "$BIN/orthros" verify --grad --device cuda --config $1 --seq-len $2 2>&1 | tee -a "$OUTDIR/verify_grad_cuda.log"
    rc=${PIPESTATUS[0]}; echo "verify --grad --device cuda $1 exit status: $rc"; [ $test_rc -eq 0 ] && test_rc=$rc
  done
fi
if [ -z "${ORTHROS_SKIP_SANITIZER:-}" ]; then
  # Every Hopper dk/dv loop: the two kernels with the pipelined loop (default at these sizes), the
  # plain loop (ORTHROS_BWD_PIPE=0) and the fused dq.
  for variant in "" fused unpiped; do
    fused= pipe=
    case $variant in fused) fused=1 ;; unpiped) pipe=0 ;; esac
    for tool in ${ORTHROS_SANITIZER_TOOLS:-memcheck racecheck initcheck synccheck}; do
      echo "== compute-sanitizer $tool (SanitizerSmall${variant:+, $variant})"
      ORTHROS_BWD_FUSED_DQ=$fused ORTHROS_BWD_PIPE=$pipe timeout 150 compute-sanitizer --tool $tool --error-exitcode 3 \
        "$BIN/test_attention_backward_gpu" --gtest_filter='*SanitizerSmall*' > "$OUTDIR/sanitizer_$tool$variant.log" 2>&1
      echo "$tool exit status: $?"
      grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Hazard|Invalid|PASSED|FAILED" "$OUTDIR/sanitizer_$tool$variant.log" | head -8
    done
  done
  # The layer backward (our stage/colsum kernels plus cuBLAS): bf16 cases. Racecheck does not model
  # the mbarrier sync of cuBLAS's nvjet_sm90 GEMMs (bench/results/2026-12-01-h200-sanitizers.md):
  # hazards are listed by kernel name and only ours count.
  for tool in ${ORTHROS_LAYER_SANITIZER_TOOLS-memcheck racecheck}; do
    echo "== compute-sanitizer $tool (layer backward, bf16)"
    timeout 240 compute-sanitizer --tool $tool --error-exitcode 3 "$BIN/test_layer_backward_gpu" \
      --gtest_filter='*Bf16*:*Names*' > "$OUTDIR/sanitizer_layer_$tool.log" 2>&1
    echo "$tool exit status: $?"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$OUTDIR/sanitizer_layer_$tool.log" | head -4
    echo "kernels with reports:"; grep -oE "in [A-Za-z_0-9:<>, ]+(kernel|nvjet)[A-Za-z_0-9]*" "$OUTDIR/sanitizer_layer_$tool.log" | sort | uniq -c | head
  done
fi
if [ -z "${ORTHROS_SKIP_BENCH:-}" ]; then
  echo "== benchmark (ours)"
  timeout 200 "$BIN/bench_attention_backward_gpu" --runs "$RUNS" --json "$OUTDIR/bench_bwd_ours.json" 2>&1 \
    | tee "$OUTDIR/bench_bwd_ours.log"
  echo "== benchmark (peers)"
  orthros_carried_wheels python3 'nvidia_cudnn_frontend-*.whl'
  timeout 300 python3 bench/gpu/peers_backward.py --runs "$RUNS" --json "$OUTDIR/bench_bwd_peers.json" 2>&1 \
    | grep -v Warning | tee "$OUTDIR/bench_bwd_peers.log"
  # Ours and the cuDNN peers in one process, sample by sample in turn (the check of the two-process
  # ratio above): needs orthros._cuda, i.e. ci/gpu_stage_python.sh's carry (build-py312-carry).
  PYCARRY=${ORTHROS_PY_CARRY:-build-py312-carry}
  if [ -d "$PYCARRY/orthros" ]; then
    echo "== benchmark (ours and cuDNN interleaved, one process; extension built at $(head -1 "$PYCARRY/COMMIT"))"
    head -1 "$PYCARRY/COMMIT" | sed 's/^/python carry: /' >> "$OUTDIR/env.txt"
    PKG=$(orthros_python_package "$PYCARRY")
    PYTHONPATH="$PKG${PYTHONPATH:+:$PYTHONPATH}" LD_LIBRARY_PATH="$(cd "$PYCARRY" && pwd):$LD_LIBRARY_PATH" PYTHONDONTWRITEBYTECODE=1 \
      timeout 300 python3 bench/gpu/peers_backward_interleaved.py --runs "$RUNS" --json "$OUTDIR/bench_bwd_interleaved.json" \
      2>&1 | grep -v Warning | tee "$OUTDIR/bench_bwd_interleaved.log"
    rm -rf "$PKG"
  fi
  echo "== summary"
  python3 bench/gpu/summarize_backward.py "$OUTDIR/bench_bwd_ours.json" "$OUTDIR/bench_bwd_peers.json" \
    | tee "$OUTDIR/summary_bwd.md"
  [ -f "$OUTDIR/bench_bwd_interleaved.log" ] && sed -n '/^| T/,$p' "$OUTDIR/bench_bwd_interleaved.log"
fi
exit $test_rc
