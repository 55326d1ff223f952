#!/usr/bin/env bash
# The final device call of 2026-12-06 (lean: device time was short after ~25 minutes of refused
# starts), from the repository root after ORTHROS_GPU_BUILD_DIR=build bash ci/gpu_stage.sh
# (carry build-xz and .whl):  bash bench/results/2026-12-06-bwd-pipeline/run_final.sh
# Backward tests on the automatic (pipelined at these sizes), plain-loop and fused-dq paths, the
# layer backward, verify --grad, the four sanitizers, our benchmark and the cuDNN/FA2 peers with the
# summary, then the pipelined loop forced off / on at PT 24K (two kernels). Key lines on stdout.
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
t0=$SECONDS
st() { echo "[$((SECONDS - t0)) s] $*"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; head -1 "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
rc_all=0
for path in automatic unpiped fused; do
  pipe= fused=
  case $path in unpiped) pipe=0 ;; fused) fused=1 ;; esac
  ORTHROS_BWD_PIPE=$pipe ORTHROS_BWD_FUSED_DQ=$fused timeout 150 "$BIN/test_attention_backward_gpu" > /tmp/t_$path.log 2>&1
  rc=$?; [ $rc_all -eq 0 ] && rc_all=$rc
  st "backward tests ($path) exit $rc: $(grep -E '^\[  (PASSED|FAILED)' /tmp/t_$path.log | tr '\n' ' ')"
  grep -E "FAILED|Failure" /tmp/t_$path.log | head -5
done
timeout 150 "$BIN/test_layer_backward_gpu" > /tmp/t_layer.log 2>&1; rc=$?; [ $rc_all -eq 0 ] && rc_all=$rc
st "layer backward tests exit $rc: $(grep -E '^\[  (PASSED|FAILED)' /tmp/t_layer.log | tr '\n' ' ')"
timeout 100 "$BIN/orthros" verify --grad --device cuda --config qwen3-8b --seq-len 256 > /tmp/t_verify.log 2>&1; rc=$?
[ $rc_all -eq 0 ] && rc_all=$rc; st "verify --grad --device cuda qwen3-8b exit $rc: $(tail -1 /tmp/t_verify.log)"
for v in "memcheck " "racecheck " "synccheck " "initcheck " "racecheck 1" "synccheck 1"; do
  set -- $v
  ORTHROS_BWD_FUSED_DQ=${2:-} timeout 90 compute-sanitizer --tool $1 --error-exitcode 3 "$BIN/test_attention_backward_gpu" \
    --gtest_filter='*SanitizerSmall*' > /tmp/s.log 2>&1; rc=$?; [ $rc_all -eq 0 ] && rc_all=$rc
  st "$1${2:+ (fused dq)} exit $rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/s.log | head -1)"
done
cat /tmp/t_*.log > "$OUTDIR/tests.log"
timeout 150 "$BIN/bench_attention_backward_gpu" --runs 9 --json "$OUTDIR/bench_bwd_ours.json" > "$OUTDIR/bench_bwd_ours.log" 2>&1
st "bench ours exit $?"
if ls .whl/nvidia_cudnn_frontend-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
timeout 200 python3 bench/gpu/peers_backward.py --runs 9 --json "$OUTDIR/bench_bwd_peers.json" > "$OUTDIR/bench_bwd_peers.log" 2>&1
st "peers exit $?"
python3 bench/gpu/summarize_backward.py "$OUTDIR/bench_bwd_ours.json" "$OUTDIR/bench_bwd_peers.json" > "$OUTDIR/summary_bwd.md" 2>&1
for p in 0 1; do
  ORTHROS_BWD_PIPE=$p ORTHROS_BWD_FUSED_DQ=0 timeout 60 "$BIN/bench_attention_backward_gpu" --backward-only --runs 9 \
    --seq-lens 24576 > /tmp/ab$p.log 2>&1
  st "A/B PIPE=$p (two kernels): $(grep -E '_bwd ' /tmp/ab$p.log | awk '{print $1, $(NF-1)}' | tr '\n' ' ')"
done
cat /tmp/ab0.log /tmp/ab1.log > "$OUTDIR/ab_24k.log"
st "all tests exit $rc_all"
grep -E "_bwd|only" "$OUTDIR/bench_bwd_ours.log" | grep -v generic
cat "$OUTDIR/summary_bwd.md"
