#!/usr/bin/env bash
# Device call 1 (2026-12-06, third session): the Hopper forward's fast mode with its softmax
# overlapped with the previous tile's P V (intra-warpgroup pipelining), and the folded epilogue
# store loops. Tests first (the kernel-family suite bitwise against the generic kernels, the
# forward and layer suites, the four sanitizers); then A/B against the previous commit's benchmark
# binary (bench_attention_gpu_base, built from 23b1719 and staged beside the new one), interleaved,
# twice; then the whole forward benchmark and the peers. From the repository root, after
# cp <old bench_attention_gpu> build-cuda-carry/bench_attention_gpu_base and
# ORTHROS_GPU_BUILD_DIR=build bash ci/gpu_stage.sh:
#   bash bench/results/2026-12-06-fwd-pipe/run.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
RUNS=${RUNS:-9}
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; cat "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
t0=$SECONDS
st() { echo "[$((SECONDS - t0)) s] $*"; }
st "kernel-family suite, forward suite, layer suite"
timeout 100 "$BIN/test_attention_kernels_gpu" > "$OUTDIR/kernels.log" 2>&1
kx=$?; echo "kernels exit $kx"; grep -E "^\[       OK|FAILED|PASSED|Failure|Expected|Which is|actual" "$OUTDIR/kernels.log" | head -20
RC_PARAMS=max_success=40 timeout 120 "$BIN/test_attention_gpu" > "$OUTDIR/tests.log" 2>&1
fx=$?; echo "forward exit $fx"; grep -E "FAILED|PASSED|Failure" "$OUTDIR/tests.log" | head -8
timeout 60 "$BIN/test_layer_gpu" > "$OUTDIR/layer.log" 2>&1
echo "layer exit $?"; grep -E "FAILED|PASSED" "$OUTDIR/layer.log" | head -3
if [ "$kx" != 0 ] || [ "$fx" != 0 ]; then st "tests failed: no benchmark"; exit 1; fi
st "sanitizers on the kernel-family suite"
for tool in synccheck racecheck memcheck initcheck; do
  timeout 60 compute-sanitizer --tool $tool --error-exitcode 3 "$BIN/test_attention_kernels_gpu" \
    --gtest_filter='*HopperMatchesGeneric*:*Float32*' > "$OUTDIR/san_$tool.log" 2>&1
  echo "$tool exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$OUTDIR/san_$tool.log" | head -3 | tr '\n' ' ')"
done
st "A/B: base (23b1719) vs new, interleaved"
: > "$OUTDIR/ab.txt"
for rep in 1 2; do
  for bin in bench_attention_gpu_base bench_attention_gpu; do
    for only in prefill_T pt_T; do
      timeout 60 "$BIN/$bin" --runs "$RUNS" --only $only > "$OUTDIR/b.log" 2>&1 || echo "bench exit $?"
      grep -E "^(prefill|pt)_T[0-9]+K +B" "$OUTDIR/b.log" | awk -v b=$bin -v r=$rep '{print "rep", r, b, $1, $(NF-4), $(NF-3)}' \
        | tee -a "$OUTDIR/ab.txt"
    done
  done
done
st "whole forward benchmark, peers"
timeout 100 "$BIN/bench_attention_gpu" --runs "$RUNS" --json "$OUTDIR/bench_ours.json" > "$OUTDIR/bench_ours.log" 2>&1
echo "bench exit $?"
if ls .whl/nvidia_cudnn_frontend-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
timeout 150 python3 bench/gpu/peers.py --runs "$RUNS" --json "$OUTDIR/bench_peers.json" > "$OUTDIR/bench_peers.log" 2>&1
echo "peers exit $?"
python3 bench/gpu/summarize.py "$OUTDIR/bench_ours.json" "$OUTDIR/bench_peers.json" > "$OUTDIR/summary.md" 2>&1
head -40 "$OUTDIR/summary.md"
st done
