#!/usr/bin/env bash
# Device call 1 of the split-barrier experiment (2026-12-06, seventh session). Binaries in $BIN:
#   bench_attention_backward_gpu_base     c8af6de: one full/empty barrier pair per Q/dO stage
#   bench_attention_backward_gpu          Q (with lse2, Δ) and dO on barriers of their own, dO
#                                         released after G3 (dV) instead of after G4 (dK)
#   *_dofirst                             the same, G2 (dP^T = V dO^T) issued before G1 (S^T)
# In order: a smoke test of each split build (a failure drops it from the benchmark); the three
# interleaved twice (backward only, default paths: PT 8K and SFT two kernels, PT 32K fused dq,
# median of 9) and once with the fused dq forced; the backward suite on five paths, the layer
# backward, verify --grad and the four sanitizers on three loops of the split build; the suite and
# the sanitizers of the fused loop on the dofirst build; then issue 20's table (ours and the
# backward and forward peers). Logs are packed after each phase (the device returns 8 files).
#   bash bench/results/2026-12-06-bwd-split/run1.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
t0=$SECONDS
st() { echo "[$((SECONDS - t0)) s] $*" | tee -a "$OUTDIR/summary.txt"; }
L=$OUTDIR/logs; mkdir -p "$L"
pack() { tar -C "$OUTDIR" -cJf "$OUTDIR/logs.tar.xz" logs; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader; cat "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
B=$BIN/bench_attention_backward_gpu
vars="base"
for v in split dofirst; do
  tb=$BIN/test_attention_backward_gpu; [ $v = dofirst ] && tb=${tb}_dofirst
  ORTHROS_BWD_FUSED_DQ=1 timeout 40 "$tb" --gtest_filter='*SanitizerSmall*:*TensorCoreBf16*' > "$L/smoke_$v.log" 2>&1
  rc=$?; st "smoke ($v, fused dq) exit $rc"
  [ $rc -eq 0 ] && vars="$vars $v"
done
: > "$OUTDIR/ab.txt"
for rep in 1 2; do
  for v in $vars; do
    bin=$B; [ $v = base ] && bin=${B}_base; [ $v = dofirst ] && bin=${B}_dofirst
    timeout 100 "$bin" --backward-only --runs 9 --seq-lens 8192,32768 > "$L/ab_${v}_$rep.log" 2>&1
    grep -E "_bwd " "$L/ab_${v}_$rep.log" | awk -v b=$v -v r=$rep '{print "rep", r, b, $1, $(NF-1)}' | tee -a "$OUTDIR/ab.txt"
  done
done
for v in $vars; do
  bin=$B; [ $v = base ] && bin=${B}_base; [ $v = dofirst ] && bin=${B}_dofirst
  ORTHROS_BWD_FUSED_DQ=1 timeout 100 "$bin" --backward-only --runs 9 --seq-lens 8192 > "$L/ab_${v}_fused.log" 2>&1
  grep -E "_bwd " "$L/ab_${v}_fused.log" | awk -v b=$v '{print "fused-forced", b, $1, $(NF-1)}' | tee -a "$OUTDIR/ab.txt"
done
st "A/B done"; pack
rc_all=0
for path in automatic generic fused unpiped serial; do
  kernel=automatic fused= pipe= concurrent=
  case $path in generic) kernel=generic ;; fused) fused=1 ;; unpiped) pipe=0 ;; serial) concurrent=0 ;; esac
  ORTHROS_TEST_KERNEL=$kernel ORTHROS_BWD_FUSED_DQ=$fused ORTHROS_BWD_PIPE=$pipe ORTHROS_BWD_CONCURRENT=$concurrent \
    timeout 100 "$BIN/test_attention_backward_gpu" > "$L/tests_bwd_$path.log" 2>&1
  rc=$?; [ $rc_all -eq 0 ] && rc_all=$rc
  st "backward tests ($path) exit $rc: $(grep -E '^\[  (PASSED|FAILED)' "$L/tests_bwd_$path.log" | tr '\n' ' ')"
  grep -E -A4 "Failure" "$L/tests_bwd_$path.log" | head -8
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
st "split build: all tests exit $rc_all"; pack
for fused in "" 1; do
  ORTHROS_BWD_FUSED_DQ=$fused timeout 100 "$BIN/test_attention_backward_gpu_dofirst" > "$L/tests_dofirst$fused.log" 2>&1
  st "dofirst backward tests${fused:+ (fused dq)} exit $?: $(grep -E '^\[  (PASSED|FAILED)' "$L/tests_dofirst$fused.log" | tr '\n' ' ')"
done
for tool in memcheck racecheck initcheck synccheck; do
  ORTHROS_BWD_FUSED_DQ=1 timeout 90 compute-sanitizer --tool $tool --error-exitcode 3 \
    "$BIN/test_attention_backward_gpu_dofirst" --gtest_filter='*SanitizerSmall*' > "$L/san_dofirst_$tool.log" 2>&1
  st "dofirst $tool (fused) exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$L/san_dofirst_$tool.log" | head -1)"
done
pack
if ls .whl/nvidia_cudnn_frontend-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
timeout 120 "$B" --runs 9 --json "$L/bench_bwd_ours.json" > "$L/bench_bwd_ours.log" 2>&1
st "bench backward (ours, split build) exit $?"
timeout 150 python3 bench/gpu/peers_backward.py --runs 9 --json "$L/bench_bwd_peers.json" > "$L/bench_bwd_peers.log" 2>&1
st "peers backward exit $?"
python3 bench/gpu/summarize_backward.py "$L/bench_bwd_ours.json" "$L/bench_bwd_peers.json" > "$OUTDIR/summary_bwd.md" 2>&1
pack
timeout 90 "$BIN/bench_attention_gpu" --runs 9 --json "$L/bench_fwd_ours.json" > "$L/bench_fwd_ours.log" 2>&1
st "bench forward (ours) exit $?"
timeout 150 python3 bench/gpu/peers.py --runs 9 --json "$L/bench_fwd_peers.json" > "$L/bench_fwd_peers.log" 2>&1
st "peers forward exit $?"
python3 bench/gpu/summarize.py "$L/bench_fwd_ours.json" "$L/bench_fwd_peers.json" > "$OUTDIR/summary_fwd.md" 2>&1
pack
echo "== A/B (ms, median of 9)"; cat "$OUTDIR/ab.txt"
cat "$OUTDIR/summary_bwd.md"
