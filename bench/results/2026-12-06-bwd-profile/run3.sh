#!/usr/bin/env bash
# Device call 3 (2026-12-06, fifth session): the fused dq with a 3-stage Q/dO ring and one dS^T
# buffer, lse2 read in pairs from the rows' own order (bench_attention_backward_gpu), against
# fe589b8 (_base) and the same build with 2 stages (_s2). In order: the backward suite on five
# paths, verify --grad, the layer backward with the fused dq; A/B interleaved (PT/SFT 8K and 32K,
# twice); the sanitizers on the three dk/dv loops (SanitizerSmall: all four on the fused dq,
# racecheck and synccheck on the others); the stall table of the new fused kernel at PT 32K; the
# whole backward benchmark (new build) and the same-run peers (cuDNN window + causal, FA2).
#   bash bench/results/2026-12-06-bwd-profile/run3.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
here=bench/results/2026-12-06-bwd-profile
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; head -2 "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
t0=$SECONDS
st() { echo "[$((SECONDS - t0)) s] $*"; }
for path in automatic generic fused unpiped serial; do
  kernel=automatic fused= pipe= concurrent=
  case $path in generic) kernel=generic ;; fused) fused=1 ;; unpiped) pipe=0 ;; serial) concurrent=0 ;; esac
  ORTHROS_TEST_KERNEL=$kernel ORTHROS_BWD_FUSED_DQ=$fused ORTHROS_BWD_PIPE=$pipe ORTHROS_BWD_CONCURRENT=$concurrent \
    timeout 100 "$BIN/test_attention_backward_gpu" > /tmp/t_$path.log 2>&1
  st "backward tests ($path) exit $?: $(grep -E '^\[  (PASSED|FAILED)' /tmp/t_$path.log | tr '\n' ' ')" | tee -a "$OUTDIR/tests_summary.txt"
  grep -E -A4 "Failure" /tmp/t_$path.log | head -12 | tee -a "$OUTDIR/tests_summary.txt"
done
for cfg in "qwen3-8b 256" "llama3.1-8b 200" "tiny 40"; do
  set -- $cfg
  timeout 100 "$BIN/orthros" verify --grad --device cuda --config $1 --seq-len $2 > /tmp/verify.log 2>&1
  st "verify --grad --device cuda $1 exit $?: $(grep -E 'PASS|FAIL' /tmp/verify.log | tail -1)" | tee -a "$OUTDIR/tests_summary.txt"
done
ORTHROS_BWD_FUSED_DQ=1 timeout 100 "$BIN/test_layer_backward_gpu" > /tmp/layer.log 2>&1
st "layer backward tests (fused dq) exit $?: $(grep -E '^\[  (PASSED|FAILED)' /tmp/layer.log | tr '\n' ' ')" | tee -a "$OUTDIR/tests_summary.txt"
: > "$OUTDIR/ab.txt"
for rep in 1 2; do
  for bin in bench_attention_backward_gpu_base bench_attention_backward_gpu_s2 bench_attention_backward_gpu; do
    timeout 100 "$BIN/$bin" --backward-only --runs 9 --seq-lens 8192,32768 2>&1 | grep -E "_bwd " \
      | awk -v b=$bin -v r=$rep '{print "rep", r, b, $1, $(NF-1)}' | tee -a "$OUTDIR/ab.txt"
  done
done
st "A/B done"
for variant in fused pipelined unpiped; do
  fused= pipe=
  case $variant in fused) fused=1 ;; unpiped) pipe=0 ;; esac
  tools="racecheck synccheck memcheck initcheck"
  [ $variant != fused ] && tools="racecheck synccheck"
  for tool in $tools; do
    ORTHROS_BWD_FUSED_DQ=$fused ORTHROS_BWD_PIPE=$pipe timeout 120 compute-sanitizer --tool $tool --error-exitcode 3 \
      "$BIN/test_attention_backward_gpu" --gtest_filter='*SanitizerSmall*' > /tmp/san_$tool.log 2>&1
    st "$tool ($variant) exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' /tmp/san_$tool.log | head -3 | tr '\n' ' ')" | tee -a "$OUTDIR/tests_summary.txt"
  done
done
rep=/tmp/fused32k
timeout 120 ncu --clock-control none --kernel-name "regex:hopper_bwd_kernel" --launch-skip 1 --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SourceCounters --import-source no -o $rep -f \
  "$BIN/bench_attention_backward_gpu" --backward-only --runs 1 --seq-lens 32768 > /tmp/ncu_run.log 2>&1
echo "ncu exit $?"
ncu --import $rep.ncu-rep --page details > "$OUTDIR/ncu_details.txt" 2>&1
ncu --import $rep.ncu-rep --page source --csv --print-source sass > /tmp/src.csv 2>/dev/null
python3 $here/stall_table.py /tmp/src.csv > "$OUTDIR/ncu_source_top.txt" 2>&1
grep -E "Duration|SM Frequency|Compute \(SM\)|L2 Cache Throughput" "$OUTDIR/ncu_details.txt"
sed -n '/top instructions/,$p' "$OUTDIR/ncu_source_top.txt" | head -12
st "benchmark and peers"
timeout 200 "$BIN/bench_attention_backward_gpu" --runs 7 --json "$OUTDIR/bench_bwd_ours.json" > /tmp/bench_ours.log 2>&1
echo "bench exit $?"
if ls .whl/nvidia_cudnn_frontend-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
timeout 200 python3 bench/gpu/peers_backward.py --runs 7 --json "$OUTDIR/bench_bwd_peers.json" > /tmp/peers.log 2>&1
echo "peers exit $?"
python3 bench/gpu/summarize_backward.py "$OUTDIR/bench_bwd_ours.json" "$OUTDIR/bench_bwd_peers.json" | tee "$OUTDIR/summary_bwd.md"
st done
