#!/usr/bin/env bash
# Device call 2 (2026-12-06, fourth session): the fused dq back to its 7a52d3e form (call 1's
# per-warpgroup dQ was 14-22 % slower); the dk/dv kernel on a greatest-priority side stream beside
# the dq kernel. Backward tests (automatic, generic), layer backward tests, verify --grad, memcheck,
# then A/B against 7a52d3e (bench_attention_backward_gpu_base) on the two-kernel path
# (ORTHROS_BWD_FUSED_DQ=0), interleaved twice. From the repository root, after copying the old
# binary into build-cuda-carry/ and ORTHROS_GPU_BUILD_DIR=build bash ci/gpu_stage.sh:
#   bash bench/results/2026-12-06-bwd-dq/run2.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
RUNS=${RUNS:-9}
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; head -1 "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
t0=$SECONDS
st() { echo "[$((SECONDS - t0)) s] $*"; }
for path in automatic generic; do
  kernel=automatic
  case $path in generic) kernel=generic ;; esac
  ORTHROS_TEST_KERNEL=$kernel timeout 150 "$BIN/test_attention_backward_gpu" > "$OUTDIR/t_$path.log" 2>&1
  st "backward tests ($path) exit $?: $(grep -E '^\[  (PASSED|FAILED)' "$OUTDIR/t_$path.log" | tr '\n' ' ')"
  grep -E -A4 "Failure" "$OUTDIR/t_$path.log" | head -12
done
timeout 150 "$BIN/test_layer_backward_gpu" > "$OUTDIR/t_layer.log" 2>&1
st "layer backward tests exit $?: $(grep -E '^\[  (PASSED|FAILED)' "$OUTDIR/t_layer.log" | tr '\n' ' ')"
timeout 100 "$BIN/orthros" verify --grad --device cuda --config qwen3-8b --seq-len 600 > "$OUTDIR/verify.log" 2>&1
st "verify --grad exit $?: $(tail -1 "$OUTDIR/verify.log")"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 "$BIN/test_attention_backward_gpu" \
  --gtest_filter='*SanitizerSmall*:*Graph*' > "$OUTDIR/san_memcheck.log" 2>&1
st "memcheck exit $?: $(grep -E 'ERROR SUMMARY' "$OUTDIR/san_memcheck.log" | head -1)"
: > "$OUTDIR/ab.txt"
for rep in 1 2; do
  for cfg in base new new_serial; do
    bin=bench_attention_backward_gpu conc=
    case $cfg in base) bin=bench_attention_backward_gpu_base ;; new_serial) conc=0 ;; esac
    ORTHROS_BWD_CONCURRENT=$conc ORTHROS_BWD_FUSED_DQ=0 timeout 120 "$BIN/$bin" --backward-only --runs "$RUNS" \
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
cfgs = ["base", "new", "new_serial"]
print("case | " + " | ".join(cfgs) + "  (ms, the 2 medians; min new / min base)")
for case in sorted({k[0] for k in d}, key=lambda s: (s.split("_")[0], int(s.split("_")[1][1:-1]))):
    print(case, "|", " | ".join("/".join(f"{x:.3f}" for x in d[(case, c)]) for c in cfgs),
          f"| {min(d[(case, 'new')]) / min(d[(case, 'base')]):.3f}")
PY
st done
