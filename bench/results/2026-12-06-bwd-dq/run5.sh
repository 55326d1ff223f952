#!/usr/bin/env bash
# Device call 5 (2026-12-06, fourth session): the dk/dv kernel computes P^T with one warp-uniform
# branch per row block instead of a masked branch per element (ptxas: BSSY 45 -> 14 per kernel;
# Nsight Compute at PT 32K put ~17 % of the fused kernel's stall samples on BSSY/BSYNC). Same
# arithmetic. Backward tests on the four paths, sanitizers, then A/B against 118fc22's binary
# (bench_attention_backward_gpu_prev), interleaved twice, automatic and fused dq forced. From the
# repository root, after copying the old binary into build-cuda-carry/ and
# ORTHROS_GPU_BUILD_DIR=build bash ci/gpu_stage.sh:
#   bash bench/results/2026-12-06-bwd-dq/run5.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
RUNS=${RUNS:-9}
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; head -1 "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
t0=$SECONDS
st() { echo "[$((SECONDS - t0)) s] $*"; }
for path in automatic fused unpiped; do
  fused= pipe=
  case $path in fused) fused=1 ;; unpiped) pipe=0 ;; esac
  ORTHROS_BWD_FUSED_DQ=$fused ORTHROS_BWD_PIPE=$pipe timeout 150 "$BIN/test_attention_backward_gpu" > "$OUTDIR/t_$path.log" 2>&1
  st "backward tests ($path) exit $?: $(grep -E '^\[  (PASSED|FAILED)' "$OUTDIR/t_$path.log" | tr '\n' ' ')"
  grep -E -A4 "Failure" "$OUTDIR/t_$path.log" | head -12
done
for v in "memcheck " "racecheck " "memcheck 1" "racecheck 1"; do
  set -- $v
  ORTHROS_BWD_FUSED_DQ=${2:-} timeout 120 compute-sanitizer --tool $1 --error-exitcode 3 "$BIN/test_attention_backward_gpu" \
    --gtest_filter='*SanitizerSmall*' > "$OUTDIR/san.log" 2>&1
  st "$1${2:+ (fused dq)} exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUTDIR/san.log" | head -1)"
done
: > "$OUTDIR/ab.txt"
for rep in 1 2; do
  for cfg in prev new prev_fused new_fused; do
    bin=bench_attention_backward_gpu fused=
    case $cfg in prev*) bin=bench_attention_backward_gpu_prev ;; esac
    case $cfg in *_fused) fused=1 ;; esac
    ORTHROS_BWD_FUSED_DQ=$fused timeout 120 "$BIN/$bin" --backward-only --runs "$RUNS" \
      --seq-lens 8192,32768 > "$OUTDIR/b_${cfg}_$rep.log" 2>&1 || echo "bench $cfg exit $?"
    grep -E "_bwd" "$OUTDIR/b_${cfg}_$rep.log" | awk -v c=$cfg -v r=$rep '{print r, c, $1, $(NF-1)}' >> "$OUTDIR/ab.txt"
  done
  st "A/B rep $rep done"
done
python3 - "$OUTDIR/ab.txt" <<'PY'
import sys, collections
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r, c, case, ms = line.split()
    d[(case, c)].append(float(ms))
cfgs = ["prev", "new", "prev_fused", "new_fused"]
print("case | " + " | ".join(cfgs) + "  (ms, the 2 medians; min new / min prev, auto and fused)")
for case in sorted({k[0] for k in d}, key=lambda s: (s.split("_")[0], int(s.split("_")[1][1:-1]))):
    m = {c: min(d[(case, c)]) for c in cfgs}
    print(case, "|", " | ".join("/".join(f"{x:.3f}" for x in d[(case, c)]) for c in cfgs),
          f"| {m['new'] / m['prev']:.3f} {m['new_fused'] / m['prev_fused']:.3f}")
PY
st done
