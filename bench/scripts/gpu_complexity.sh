#!/usr/bin/env bash
# GPU complexity sweep: runs orthros_bench_gpu (bench/gpu_complexity) on the device and
# writes two files, <out>/gpu_complexity.json and <out>/gpu_complexity_long.json (Google Benchmark
# JSON); the console table, with the fitted big-O of every family, goes to stdout. Plot them
# afterwards on the build host:
#   /usr/bin/python3 bench/scripts/plot.py --gpu <out>/gpu_complexity.json <out>/gpu_complexity_long.json \
#       --gpu-prefix bench/results/gpu-<date>
# (set ORTHROS_GPU_PLOTS=1 to draw the PNGs on the device too; they count against the device
# tool's 8 returned files).
# Usage: bash bench/scripts/gpu_complexity.sh <path/to/orthros_bench_gpu> <out dir>
#   e.g. on the device: bash bench/scripts/gpu_complexity.sh build-cuda-carry/orthros_bench_gpu "$OUT"
# The binary's folder must also hold libbenchmark.so.1debian (the build copies it there; the
# device image has no Google Benchmark); cuBLAS, for gpu/gemm_bf16 only, is dlopen'ed.
set -euo pipefail
BIN=${1:?usage: gpu_complexity.sh <orthros_bench_gpu> <out dir>}
OUTDIR=${2:?usage: gpu_complexity.sh <orthros_bench_gpu> <out dir>}
HERE=$(cd "$(dirname "$0")" && pwd)
BINDIR=$(cd "$(dirname "$BIN")" && pwd)
export LD_LIBRARY_PATH="$BINDIR:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$OUTDIR"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv || true
# 3 repetitions per point (the plots use their median); each launch is timed with CUDA events
# after an untimed warm-up, with the L2 cache flushed before it. About 1-2 minutes on an H200.
timeout "${ORTHROS_GPU_BENCH_TIMEOUT:-300}" "$BIN" --benchmark_filter=-_long \
  --benchmark_out="$OUTDIR/gpu_complexity.json" --benchmark_out_format=json \
  --benchmark_repetitions=3 --benchmark_min_time=0.05 --benchmark_counters_tabular=true "${@:3}"
# Full causal attention at 256K..1M (seconds per call, one timed call each): a separate file, so
# that a timeout here leaves the main JSON whole. Skip with ORTHROS_GPU_SKIP_LONG=1.
if [ -z "${ORTHROS_GPU_SKIP_LONG:-}" ]; then
  timeout "${ORTHROS_GPU_LONG_TIMEOUT:-180}" "$BIN" --benchmark_filter=_long \
    --benchmark_out="$OUTDIR/gpu_complexity_long.json" --benchmark_out_format=json \
    --benchmark_counters_tabular=true || echo "[gpu_complexity] long full-causal sweep stopped (status $?)"
fi
if [ -n "${ORTHROS_GPU_PLOTS:-}" ] && python3 -c 'import matplotlib, numpy' 2>/dev/null; then
  python3 "$HERE/plot.py" --gpu "$OUTDIR"/gpu_complexity*.json --gpu-prefix "$OUTDIR/gpu" || true
fi
