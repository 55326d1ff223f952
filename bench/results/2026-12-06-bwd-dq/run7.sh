#!/usr/bin/env bash
# Device call 7 (2026-12-06, fourth session): SideStream after review (no fork while the side
# stream is in another capture; creation in the relaxed capture mode) and the graph test's shape
# check. The backward suite on five paths, memcheck on the graph test, the 8K backward timing.
#   bash bench/results/2026-12-06-bwd-dq/run7.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; head -1 "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
t0=$SECONDS
st() { echo "[$((SECONDS - t0)) s] $*"; }
for path in automatic generic fused unpiped serial; do
  kernel=automatic fused= pipe= concurrent=
  case $path in generic) kernel=generic ;; fused) fused=1 ;; unpiped) pipe=0 ;; serial) concurrent=0 ;; esac
  ORTHROS_TEST_KERNEL=$kernel ORTHROS_BWD_FUSED_DQ=$fused ORTHROS_BWD_PIPE=$pipe ORTHROS_BWD_CONCURRENT=$concurrent \
    timeout 100 "$BIN/test_attention_backward_gpu" > "$OUTDIR/t_$path.log" 2>&1
  st "backward tests ($path) exit $?: $(grep -E '^\[  (PASSED|FAILED)' "$OUTDIR/t_$path.log" | tr '\n' ' ')"
  grep -E -A4 "Failure" "$OUTDIR/t_$path.log" | head -12
done
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 3 "$BIN/test_attention_backward_gpu" \
  --gtest_filter='*Graph*' > "$OUTDIR/san.log" 2>&1
st "memcheck (graph test) exit $?: $(grep -E 'ERROR SUMMARY' "$OUTDIR/san.log" | head -1)"
timeout 60 "$BIN/bench_attention_backward_gpu" --backward-only --runs 9 --seq-lens 8192 2>&1 | grep -E "_bwd "
st done
