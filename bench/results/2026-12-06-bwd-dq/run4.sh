#!/usr/bin/env bash
# Device call 4 (2026-12-06, fourth session): the fused dq's post-pass writes each row's 64 values
# as 16-byte stores through a shared-memory tile (Nsight Compute, PT 32K: 1.90 ms and 2.28 GB of
# DRAM traffic for 1.6 GB of data with the 4-byte stores). Backward tests with the fused dq forced
# (and automatic), then the post-pass's time (ncu) and A/B against the binary before
# (bench_attention_backward_gpu_prev, 921cb48), interleaved twice. From the repository root, after
# copying the old binary into build-cuda-carry/ and ORTHROS_GPU_BUILD_DIR=build bash ci/gpu_stage.sh:
#   bash bench/results/2026-12-06-bwd-dq/run4.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
RUNS=${RUNS:-9}
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; head -1 "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
t0=$SECONDS
st() { echo "[$((SECONDS - t0)) s] $*"; }
for path in fused automatic; do
  fused=
  case $path in fused) fused=1 ;; esac
  ORTHROS_BWD_FUSED_DQ=$fused timeout 150 "$BIN/test_attention_backward_gpu" > "$OUTDIR/t_$path.log" 2>&1
  st "backward tests ($path) exit $?: $(grep -E '^\[  (PASSED|FAILED)' "$OUTDIR/t_$path.log" | tr '\n' ' ')"
  grep -E -A4 "Failure" "$OUTDIR/t_$path.log" | head -12
done
for tool in memcheck racecheck; do
  ORTHROS_BWD_FUSED_DQ=1 timeout 120 compute-sanitizer --tool $tool --error-exitcode 3 "$BIN/test_attention_backward_gpu" \
    --gtest_filter='*SanitizerSmall*' > "$OUTDIR/san.log" 2>&1
  st "$tool (fused dq) exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUTDIR/san.log" | head -1)"
done
timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes.sum --kernel-name "regex:convert" \
  --launch-count 1 "$BIN/bench_attention_backward_gpu" --backward-only --runs 1 --seq-lens 32768 > "$OUTDIR/ncu_convert.txt" 2>&1
st "ncu post-pass, PT 32K: $(grep -E 'gpu__time_duration|dram__bytes' "$OUTDIR/ncu_convert.txt" | sed 's/  */ /g' | tr '\n' ' ')"
: > "$OUTDIR/ab.txt"
for rep in 1 2; do
  for cfg in prev new; do
    bin=bench_attention_backward_gpu
    case $cfg in prev) bin=bench_attention_backward_gpu_prev ;; esac
    timeout 120 "$BIN/$bin" --backward-only --runs "$RUNS" --seq-lens 24576,32768 > "$OUTDIR/b_${cfg}_$rep.log" 2>&1 || echo "bench $cfg exit $?"
    grep -E "_bwd" "$OUTDIR/b_${cfg}_$rep.log" | awk -v c=$cfg -v r=$rep '{print r, c, $1, $(NF-1)}' >> "$OUTDIR/ab.txt"
  done
done
python3 - "$OUTDIR/ab.txt" <<'PY'
import sys, collections
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r, c, case, ms = line.split()
    d[(case, c)].append(float(ms))
print("case | prev | new  (ms, the 2 medians; min new / min prev)")
for case in sorted({k[0] for k in d}):
    print(case, "|", " | ".join("/".join(f"{x:.3f}" for x in d[(case, c)]) for c in ["prev", "new"]),
          f"| {min(d[(case, 'new')]) / min(d[(case, 'prev')]):.3f}")
PY
st done
