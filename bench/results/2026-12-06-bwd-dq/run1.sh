#!/usr/bin/env bash
# Device call 1 (2026-12-06, fourth session): the fused dq with each warpgroup's dQ over its own
# keys (no cross-warpgroup barrier; two bulk reductions per half and row block) and the two-kernel
# path's dq kernel on a second stream beside the dk/dv kernel. Tests (automatic, fused forced,
# generic), racecheck/synccheck/memcheck on the fused dq, then A/B against 7a52d3e
# (bench_attention_backward_gpu_base), interleaved twice. From the repository root, after copying
# the old binary into build-cuda-carry/ and ORTHROS_GPU_BUILD_DIR=build bash ci/gpu_stage.sh:
#   bash bench/results/2026-12-06-bwd-dq/run1.sh
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
  grep -E "FAILED|Failure" "$OUTDIR/t_$path.log" | head -5
done
for tool in racecheck synccheck memcheck; do
  ORTHROS_BWD_FUSED_DQ=1 timeout 120 compute-sanitizer --tool $tool --error-exitcode 3 "$BIN/test_attention_backward_gpu" \
    --gtest_filter='*SanitizerSmall*' > "$OUTDIR/san_$tool.log" 2>&1
  st "$tool (fused) exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUTDIR/san_$tool.log" | head -2 | tr '\n' ' ')"
done
: > "$OUTDIR/ab.txt"
for rep in 1 2; do
  for cfg in base new new_serial base_fused new_fused; do
    bin=bench_attention_backward_gpu conc= fused=
    case $cfg in base*) bin=bench_attention_backward_gpu_base ;; esac
    case $cfg in *_serial) conc=0 ;; *_fused) fused=1 ;; esac
    ORTHROS_BWD_CONCURRENT=$conc ORTHROS_BWD_FUSED_DQ=$fused timeout 120 "$BIN/$bin" --backward-only --runs "$RUNS" \
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
cfgs = ["base", "new", "new_serial", "base_fused", "new_fused"]
print("case | " + " | ".join(cfgs) + "  (ms, min of 2 medians; new/base)")
for case in sorted({k[0] for k in d}, key=lambda s: (s.split("_")[0], int(s.split("_")[1][1:-1]))):
    v = {c: min(d[(case, c)]) for c in cfgs if d[(case, c)]}
    print(case, "|", " | ".join(f"{v.get(c, float('nan')):.3f}" for c in cfgs),
          f"| {v['new'] / v['base']:.3f}  fused {v['new_fused'] / v['base_fused']:.3f}")
PY
st done
