#!/usr/bin/env bash
# Device call 6 (2026-12-06, fourth session): where the fused dq pays now (after call 5's faster
# dk/dv chain): the whole backward with the fused dq forced off and on, PT and SFT at 8K-32K.
#   bash bench/results/2026-12-06-bwd-dq/run6.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
RUNS=${RUNS:-9}
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; head -1 "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
: > "$OUTDIR/ab.txt"
for fused in 0 1; do
  ORTHROS_BWD_FUSED_DQ=$fused timeout 150 "$BIN/bench_attention_backward_gpu" --backward-only --runs "$RUNS" \
    --seq-lens 8192,12288,16384,24576,32768 > "$OUTDIR/b_fused$fused.log" 2>&1 || echo "bench exit $?"
  grep -E "_bwd" "$OUTDIR/b_fused$fused.log" | awk -v c=fused$fused '{print c, $1, $(NF-1)}' >> "$OUTDIR/ab.txt"
done
python3 - "$OUTDIR/ab.txt" <<'PY'
import sys, collections
d = {}
for line in open(sys.argv[1]):
    c, case, ms = line.split()
    d[(case, c)] = float(ms)
print("case | two kernels | fused dq | fused / two kernels")
for case in sorted({k[0] for k in d}, key=lambda s: (s.split("_")[0], int(s.split("_")[1][1:-1]))):
    a, b = d[(case, "fused0")], d[(case, "fused1")]
    print(f"{case} | {a:.3f} | {b:.3f} | {b / a:.3f}")
PY
