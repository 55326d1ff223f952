#!/usr/bin/env bash
# Device call of 2026-12-06 (seventh session), c8af6de's kernels: why the PT 32K backward reads
# about 8-9 % slower in the full `bench_attention_backward_gpu` than in its --backward-only rows,
# and the ratio to cuDNN measured in one process. nvidia-smi logs the SM clock, power,
# temperature and the clock-event reasons every 100 ms through:
#   1. --backward-only (PT/SFT 8K and 32K), 2. the full benchmark, 3. peers_backward_interleaved.py
#   (ours and cuDNN in one process, in turn), 4. peers_backward.py (the two-process peers),
#   5. --backward-only again.
# From the repository root after ORTHROS_GPU_BUILD_DIR=build bash ci/gpu_stage.sh and
# bash ci/gpu_stage_python.sh (carry build-xz, build-py312-carry, .whl):
#   bash bench/results/2026-12-06-bwd-clocks/run1.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
L=$OUTDIR/logs; mkdir -p "$L"
pack() { tar -C "$OUTDIR" -cJf "$OUTDIR/logs.tar.xz" logs; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader; head -1 "$BIN/COMMIT"; head -1 build-py312-carry/COMMIT; date -u; } | tee "$OUTDIR/env.txt"
if ls .whl/nvidia_cudnn_frontend-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader -lms 100 > "$L/smi.csv" 2>&1 &
SMI=$!
mark() { echo "$(date -u +%Y/%m/%d\ %H:%M:%S.%N | cut -c1-23) $*" | tee -a "$L/phases.txt"; }
only() {
  mark "start $1"
  timeout 100 "$BIN/bench_attention_backward_gpu" --backward-only --runs 9 --seq-lens 8192,32768 > "$L/$1.log" 2>&1
  mark "end $1"
  grep -E "_bwd " "$L/$1.log" | awk -v b=$1 '{print b, $1, $(NF-1)}' | tee -a "$OUTDIR/times.txt"
  pack
}
sleep 2
only only1
mark "start full"
timeout 150 "$BIN/bench_attention_backward_gpu" --runs 9 --json "$L/bench_bwd_ours.json" > "$L/bench_bwd_ours.log" 2>&1
mark "end full"
grep -E "^(pt|sft)_T(8|32)K_bwd(_det)? " "$L/bench_bwd_ours.log" | awk '{print "full", $1, $(NF-1)}' | tee -a "$OUTDIR/times.txt"
PKG=$(mktemp -d)
mkdir -p "$PKG/orthros" && cp -r verify/python/orthros/. "$PKG/orthros/" && cp build-py312-carry/orthros/*.so "$PKG/orthros/"
mark "start interleaved"
PYTHONPATH="$PKG${PYTHONPATH:+:$PYTHONPATH}" LD_LIBRARY_PATH="$PWD/build-py312-carry:$LD_LIBRARY_PATH" PYTHONDONTWRITEBYTECODE=1 \
  timeout 200 python3 bench/gpu/peers_backward_interleaved.py --runs 9 --json "$L/bench_bwd_interleaved.json" \
  > "$OUTDIR/interleaved.log" 2>&1
mark "end interleaved (exit $?)"; pack
mark "start peers"
timeout 150 python3 bench/gpu/peers_backward.py --runs 9 --json "$L/bench_bwd_peers.json" > "$L/bench_bwd_peers.log" 2>&1
mark "end peers"
python3 bench/gpu/summarize_backward.py "$L/bench_bwd_ours.json" "$L/bench_bwd_peers.json" > "$OUTDIR/summary_bwd.md" 2>&1
only only2
kill $SMI
pack
cat "$OUTDIR/times.txt"; cat "$OUTDIR/summary_bwd.md"; tail -5 "$OUTDIR/interleaved.log"
