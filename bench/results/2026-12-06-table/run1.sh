#!/usr/bin/env bash
# Device call 1 of the seventh session (2026-12-06): issue 20's table at the commit in
# $BIN/COMMIT, then its GPU tests. From the repository root after
# ORTHROS_GPU_BUILD_DIR=build bash ci/gpu_stage.sh (carry build-xz and .whl):
#   bash bench/results/2026-12-06-table/run1.sh
# In order (the table first, so that a call cut short still brings it): the backward benchmark
# (ours, median of 9) and its peers (cuDNN window + causal, FA2), the forward benchmark and its
# peers; then the backward suite on five paths, the layer backward (two-kernel and fused dq),
# verify --grad, the four sanitizers on the backward (default, fused dq, plain loop), the forward
# suite on both paths, the kernel-family suite and the four sanitizers on the forward's small
# cases. Logs go into one archive (the device returns at most 8 files); key lines on stdout.
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
t0=$SECONDS
st() { echo "[$((SECONDS - t0)) s] $*" | tee -a "$OUTDIR/summary.txt"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader; head -1 "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
L=$OUTDIR/logs; mkdir -p "$L"
if ls .whl/nvidia_cudnn_frontend-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
timeout 150 "$BIN/bench_attention_backward_gpu" --runs 9 --json "$L/bench_bwd_ours.json" > "$L/bench_bwd_ours.log" 2>&1
st "bench backward (ours) exit $?"
timeout 200 python3 bench/gpu/peers_backward.py --runs 9 --json "$L/bench_bwd_peers.json" > "$L/bench_bwd_peers.log" 2>&1
st "peers backward exit $?"
python3 bench/gpu/summarize_backward.py "$L/bench_bwd_ours.json" "$L/bench_bwd_peers.json" > "$OUTDIR/summary_bwd.md" 2>&1
timeout 120 "$BIN/bench_attention_gpu" --runs 9 --json "$L/bench_fwd_ours.json" > "$L/bench_fwd_ours.log" 2>&1
st "bench forward (ours) exit $?"
timeout 200 python3 bench/gpu/peers.py --runs 9 --json "$L/bench_fwd_peers.json" > "$L/bench_fwd_peers.log" 2>&1
st "peers forward exit $?"
python3 bench/gpu/summarize.py "$L/bench_fwd_ours.json" "$L/bench_fwd_peers.json" > "$OUTDIR/summary_fwd.md" 2>&1
cat "$OUTDIR/summary_bwd.md"; grep -E "pt_T|prefill_T128K|copy" "$OUTDIR/summary_fwd.md" | head -12
rc_all=0
for path in automatic generic fused unpiped serial; do
  kernel=automatic fused= pipe= concurrent=
  case $path in generic) kernel=generic ;; fused) fused=1 ;; unpiped) pipe=0 ;; serial) concurrent=0 ;; esac
  ORTHROS_TEST_KERNEL=$kernel ORTHROS_BWD_FUSED_DQ=$fused ORTHROS_BWD_PIPE=$pipe ORTHROS_BWD_CONCURRENT=$concurrent \
    timeout 100 "$BIN/test_attention_backward_gpu" > "$L/tests_bwd_$path.log" 2>&1
  rc=$?; [ $rc_all -eq 0 ] && rc_all=$rc
  st "backward tests ($path) exit $rc: $(grep -E '^\[  (PASSED|FAILED)' "$L/tests_bwd_$path.log" | tr '\n' ' ')"
done
for fused in "" 1; do
  ORTHROS_BWD_FUSED_DQ=$fused timeout 100 "$BIN/test_layer_backward_gpu" > "$L/tests_layer_bwd$fused.log" 2>&1
  rc=$?; [ $rc_all -eq 0 ] && rc_all=$rc
  st "layer backward tests${fused:+ (fused dq)} exit $rc: $(grep -E '^\[  (PASSED|FAILED)' "$L/tests_layer_bwd$fused.log" | tr '\n' ' ')"
done
for cfg in "qwen3-8b 256" "llama3.1-8b 200" "tiny 40"; do
  set -- $cfg
  timeout 100 "$BIN/orthros" verify --grad --device cuda --config $1 --seq-len $2 > "$L/verify_grad_$1.log" 2>&1
  rc=$?; [ $rc_all -eq 0 ] && rc_all=$rc; st "verify --grad --device cuda $1 exit $rc: $(tail -1 "$L/verify_grad_$1.log")"
done
for variant in "" fused unpiped; do
  fused= pipe=
  case $variant in fused) fused=1 ;; unpiped) pipe=0 ;; esac
  for tool in memcheck racecheck initcheck synccheck; do
    ORTHROS_BWD_FUSED_DQ=$fused ORTHROS_BWD_PIPE=$pipe timeout 90 compute-sanitizer --tool $tool --error-exitcode 3 \
      "$BIN/test_attention_backward_gpu" --gtest_filter='*SanitizerSmall*' > "$L/san_bwd_$tool$variant.log" 2>&1
    rc=$?; [ $rc_all -eq 0 ] && rc_all=$rc
    st "backward $tool${variant:+ ($variant)} exit $rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$L/san_bwd_$tool$variant.log" | head -1)"
  done
done
for kernel in automatic generic; do
  ORTHROS_TEST_KERNEL=$kernel RC_PARAMS=max_success=40 timeout 150 "$BIN/test_attention_gpu" > "$L/tests_fwd_$kernel.log" 2>&1
  rc=$?; [ $rc_all -eq 0 ] && rc_all=$rc
  st "forward tests ($kernel) exit $rc: $(grep -E '^\[  (PASSED|FAILED)' "$L/tests_fwd_$kernel.log" | tr '\n' ' ')"
done
timeout 100 "$BIN/test_attention_kernels_gpu" > "$L/tests_kernels.log" 2>&1
rc=$?; [ $rc_all -eq 0 ] && rc_all=$rc; st "kernel-family tests exit $rc: $(grep -E '^\[  (PASSED|FAILED)' "$L/tests_kernels.log" | tr '\n' ' ')"
for tool in memcheck racecheck initcheck synccheck; do
  RC_PARAMS=max_success=3 timeout 150 compute-sanitizer --tool $tool --error-exitcode 3 "$BIN/test_attention_gpu" \
    --gtest_filter='-*RaggedBatchOver48Sequences*:*DecodeSplitCounts4096*' > "$L/san_fwd_$tool.log" 2>&1
  rc=$?; [ $rc_all -eq 0 ] && rc_all=$rc
  st "forward $tool exit $rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$L/san_fwd_$tool.log" | head -1)"
done
st "all tests exit $rc_all"
tar -C "$OUTDIR" -cJf "$OUTDIR/logs.tar.xz" logs && rm -rf "$L"
