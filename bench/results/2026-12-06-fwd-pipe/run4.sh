#!/usr/bin/env bash
# Device call 4 (2026-12-06, third session): the final forward (pipelined fast mode, FMA exponents
# on rows that see all of a thread's keys, the row sums as pairwise trees; the turn ring dropped
# from the fast mode). Tests: kernel-family suite (default; bands of 7), forward, layer and
# backward suites, orthros verify on the GPU, the four sanitizers. Then A/B against 23b1719
# (bench_attention_gpu_base) and call 3's binary (bench_attention_gpu_prev, 7e0db40: sequential
# row sums, ring on items of >= 32 tiles), interleaved, three times; then the whole forward
# benchmark and the peers. From the repository root, after copying the two old binaries into
# build-cuda-carry/ and ORTHROS_GPU_BUILD_DIR=build bash ci/gpu_stage.sh:
#   bash bench/results/2026-12-06-fwd-pipe/run4.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
RUNS=${RUNS:-9}
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; cat "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
t0=$SECONDS
st() { echo "[$((SECONDS - t0)) s] $*"; }
st "kernel-family suite: default; bands of 7"
timeout 100 "$BIN/test_attention_kernels_gpu" > "$OUTDIR/kernels.log" 2>&1
kx=$?; echo "kernels exit $kx"; grep -E "FAILED|PASSED|Failure|Expected|Which is|actual" "$OUTDIR/kernels.log" | head -12
ORTHROS_FWD_BAND=7 timeout 100 "$BIN/test_attention_kernels_gpu" > "$OUTDIR/kernels_band7.log" 2>&1
kr=$?; echo "kernels band7 exit $kr"; grep -E "FAILED|PASSED|Failure" "$OUTDIR/kernels_band7.log" | head -6
st "forward, layer, backward suites; orthros verify --device cuda"
RC_PARAMS=max_success=40 timeout 120 "$BIN/test_attention_gpu" > "$OUTDIR/tests.log" 2>&1
fx=$?; echo "forward exit $fx"; grep -E "FAILED|PASSED|Failure|Falsifiable|seed" "$OUTDIR/tests.log" | head -12
timeout 60 "$BIN/test_layer_gpu" > "$OUTDIR/layer.log" 2>&1
echo "layer exit $?"; grep -E "FAILED|PASSED" "$OUTDIR/layer.log" | head -3
timeout 150 "$BIN/test_attention_backward_gpu" > "$OUTDIR/backward.log" 2>&1
echo "backward exit $?"; grep -E "FAILED|PASSED|Failure" "$OUTDIR/backward.log" | head -6
timeout 120 "$BIN/orthros" verify --device cuda --config qwen3-8b --seq-len 1200 > "$OUTDIR/verify.log" 2>&1
echo "verify exit $?"; tail -4 "$OUTDIR/verify.log"
if [ "$kx" != 0 ] || [ "$kr" != 0 ] || [ "$fx" != 0 ]; then st "tests failed: no benchmark"; exit 1; fi
st "sanitizers on the kernel-family suite"
for tool in synccheck racecheck memcheck initcheck; do
  timeout 60 compute-sanitizer --tool $tool --error-exitcode 3 "$BIN/test_attention_kernels_gpu" \
    --gtest_filter='*HopperMatchesGeneric*:*Float32*' > "$OUTDIR/san_$tool.log" 2>&1
  echo "$tool exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$OUTDIR/san_$tool.log" | head -3 | tr '\n' ' ')"
done
st "A/B: base (23b1719), prev (7e0db40), new"
: > "$OUTDIR/ab.txt"
for rep in 1 2 3; do
  for cfg in base prev new; do
    bin=bench_attention_gpu
    case $cfg in base) bin=bench_attention_gpu_base;; prev) bin=bench_attention_gpu_prev;; esac
    for only in prefill_T pt_T; do
      timeout 60 "$BIN/$bin" --runs "$RUNS" --only $only > "$OUTDIR/b.log" 2>&1 || echo "bench exit $?"
      grep -E "^(prefill|pt)_T[0-9]+K +B" "$OUTDIR/b.log" | grep -v generic \
        | awk -v c=$cfg -v r=$rep '{print "rep", r, "cfg", c, $1, $(NF-4), $(NF-3)}' >> "$OUTDIR/ab.txt"
    done
  done
done
python3 - "$OUTDIR/ab.txt" <<'PY'
import sys, collections
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    d[(f[4], f[5], f[3])].append(float(f[6]))
cfgs = ["base", "prev", "new"]
print("case mode | " + " | ".join(cfgs) + "   (ms: min of 3 medians, then the 3 medians)")
for case in sorted({(k[0], k[1]) for k in d}):
    print(case[0], case[1], "|", " | ".join(f"{min(d[(case[0], case[1], c)]):.4f}" for c in cfgs))
    print("    ", "  ".join(str(d[(case[0], case[1], c)]) for c in cfgs))
PY
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
head -12 "$OUTDIR/summary.md"
st done
