#!/usr/bin/env bash
# GPU complexity sweep (issue 5): runs orthros_bench_gpu on the device and writes
#   <out>/gpu_complexity.json  (Google Benchmark JSON; bench/scripts/plot.py --gpu reads it)
#   <out>/gpu_complexity.log   (console table with fitted big-O per family)
#   <out>/gpu-{latency,efficiency,speedup}.png  (when the device's python3 has matplotlib)
# Usage: bash bench/scripts/gpu_complexity.sh <path/to/orthros_bench_gpu> <out dir>
# e.g. on the device: bash bench/scripts/gpu_complexity.sh build/bench/gpu_complexity/orthros_bench_gpu "$OUT"
set -euo pipefail
BIN=${1:?usage: gpu_complexity.sh <orthros_bench_gpu> <out dir>}
OUTDIR=${2:?usage: gpu_complexity.sh <orthros_bench_gpu> <out dir>}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUTDIR"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv \
  > "$OUTDIR/gpu_complexity.log" 2>&1 || true
# 3 repetitions per point, the plots use their median; every launch is timed with CUDA events
# after an untimed warm-up and an L2 flush.
"$BIN" --benchmark_out="$OUTDIR/gpu_complexity.json" --benchmark_out_format=json \
       --benchmark_repetitions=3 --benchmark_min_time=0.05 --benchmark_counters_tabular=true \
       2>&1 | tee -a "$OUTDIR/gpu_complexity.log"
if python3 -c 'import matplotlib, numpy' 2>/dev/null; then
  python3 "$HERE/plot.py" --gpu "$OUTDIR/gpu_complexity.json" --gpu-prefix "$OUTDIR/gpu" || true
fi
