#!/usr/bin/env bash
# Device call 3 (2026-12-06, fourth session): the fused dq's dK product split around the dQ product
# (its last two k16 steps issued behind dQ, so the dQ tile's staging stores overlap them), and
# SideStream's join when no fork happened (call 2: the graph-capture test's first-use case failed
# with cudaErrorInvalidResourceHandle). Backward tests (automatic, fused forced, generic), the
# sanitizers, then A/B against 7a52d3e (bench_attention_backward_gpu_base), interleaved twice:
# automatic (fused at 32K) and the fused dq forced. From the repository root, after copying the old
# binary into build-cuda-carry/ and ORTHROS_GPU_BUILD_DIR=build bash ci/gpu_stage.sh:
#   bash bench/results/2026-12-06-bwd-dq/run3.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
RUNS=${RUNS:-9}
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; head -1 "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
t0=$SECONDS
st() { echo "[$((SECONDS - t0)) s] $*"; }
for path in automatic fused generic; do
  kernel=automatic fused=
  case $path in generic) kernel=generic ;; fused) fused=1 ;; esac
  ORTHROS_TEST_KERNEL=$kernel ORTHROS_BWD_FUSED_DQ=$fused timeout 150 "$BIN/test_attention_backward_gpu" > "$OUTDIR/t_$path.log" 2>&1
  st "backward tests ($path) exit $?: $(grep -E '^\[  (PASSED|FAILED)' "$OUTDIR/t_$path.log" | tr '\n' ' ')"
  grep -E -A4 "Failure" "$OUTDIR/t_$path.log" | head -12
done
for v in "memcheck " "racecheck 1" "synccheck 1" "memcheck 1"; do
  set -- $v
  ORTHROS_BWD_FUSED_DQ=${2:-} timeout 120 compute-sanitizer --tool $1 --error-exitcode 3 "$BIN/test_attention_backward_gpu" \
    --gtest_filter='*SanitizerSmall*:*Graph*' > "$OUTDIR/san.log" 2>&1
  st "$1${2:+ (fused dq)} exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUTDIR/san.log" | head -1)"
  grep -E "Program hit|Invalid|Hazard" "$OUTDIR/san.log" | head -3
done
: > "$OUTDIR/ab.txt"
for rep in 1 2; do
  for cfg in base new base_fused new_fused; do
    bin=bench_attention_backward_gpu fused=
    case $cfg in base*) bin=bench_attention_backward_gpu_base ;; esac
    case $cfg in *_fused) fused=1 ;; esac
    ORTHROS_BWD_FUSED_DQ=$fused timeout 120 "$BIN/$bin" --backward-only --runs "$RUNS" \
      --seq-lens 8192,16384,32768 > "$OUTDIR/b_${cfg}_$rep.log" 2>&1 || echo "bench $cfg exit $?"
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
cfgs = ["base", "new", "base_fused", "new_fused"]
print("case | " + " | ".join(cfgs) + "  (ms, the 2 medians; min new / min base, auto and fused)")
for case in sorted({k[0] for k in d}, key=lambda s: (s.split("_")[0], int(s.split("_")[1][1:-1]))):
    m = {c: min(d[(case, c)]) for c in cfgs}
    print(case, "|", " | ".join("/".join(f"{x:.3f}" for x in d[(case, c)]) for c in cfgs),
          f"| {m['new'] / m['base']:.3f} {m['new_fused'] / m['base_fused']:.3f}")
PY
st done
