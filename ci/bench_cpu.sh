#!/usr/bin/env bash
# One command for the CPU complexity results (docs/performance.md): installs the Debian
# dependencies, builds the CPU benchmark, runs the sweep single-threaded, checks the fitted
# exponents against the paper's analysis and draws the plots into bench/results/.
#   bash ci/bench_cpu.sh            # writes bench/results/cpu-<UTC date>.{json,md} and cpu-<date>-*.png
# Environment: BUILD_DIR (default build-bench), OUT_DIR (default bench/results),
#              ORTHROS_BENCH_SCALE (default 1; e.g. 0.25 for a short sweep).
# Exit status: non-zero when a fit contradicts the analysis (the plots are still written).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
BUILD=${BUILD_DIR:-build-bench}
OUTDIR=${OUT_DIR:-bench/results}
DATE=$(date -u +%F)
PY=/usr/bin/python3   # Debian's python3 (numpy, matplotlib from ci/setup.sh)
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j2 --target orthros_bench_cpu
mkdir -p "$OUTDIR"
export OMP_NUM_THREADS=1  # single thread: stable timing on shared 2-core machines
status=0
"$PY" bench/scripts/check_complexity.py --binary "$BUILD/bench/cpu/orthros_bench_cpu" \
  --scale "${ORTHROS_BENCH_SCALE:-1}" --min-time 0.1 --repetitions 3 \
  --out "$OUTDIR/cpu-$DATE.json" --md "$OUTDIR/cpu-$DATE.md" || status=$?
"$PY" bench/scripts/plot.py --cpu "$OUTDIR/cpu-$DATE.json"
exit $status
