#!/usr/bin/env bash
# One device call for the library ports and the Hugging Face conversion's GPU benchmarks, from the
# repository root (a copy of it: the carried folder holds examples/, ci/, verify/python and
# build-py312-carry from ci/gpu_stage_python.sh, the wheels in .whl/ and the GPL-3 text):
#   bash ci/gpu_ports_hf.sh
# Phase 1, the GPU alone (timings): the training throughput at T = 8K of the converted Qwen3-0.6B
# model on our kernels, the original on SDPA flash and cuDNN (gpu_bench.py --only train), and the
# same Orthros model on FlexAttention (gpu_flex.py); the golden suites are written meanwhile on the
# CPU. Phase 2, in parallel: ci/gpu_ports.sh for each library (cuDNN, FlashAttention, FlexAttention,
# xformers) on every suite, the bf16/f32 gradient cross-check against the oracle (gpu_proofs.py
# --only gradients), and the loss curves (gpu_bench.py --only loss). Every step has its own time
# cap (they sum to 575 s, under one device command's 600 s; the run of 2026-12-02 took 385 s).
# Under $OUT: summary.md (ports table), hf.md (HF tables), ports.tar.xz and hf.tar.xz (logs,
# check reports), loss_curve.csv, loss_curve.png, bench.json, proofs.json.
# Environment: GPL3 (the text; default /usr/share/common-licenses/GPL-3), LOSS_ARGS (gpu_bench.py
# loss arguments), PORTS_SUITES, PORTS_LIBS.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUTDIR=${OUT:-gpu-out}
mkdir -p "$OUTDIR"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
CARRY=build-py312-carry
export LD_LIBRARY_PATH="$PWD/$CARRY${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
CUBLAS_SO=$(ldconfig -p | grep -o '/[^ ]*libcublas\.so\.13$' | head -1)
[ -n "$CUBLAS_SO" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$CUBLAS_SO")"
export ORTHROS="$PWD/$CARRY/orthros-cli" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
PY=${PYTHON:-python3}
# the Python package: the working tree's pure-Python files plus the carried compiled modules
source ci/python_package.sh
PKG=$(orthros_python_package "$CARRY")
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="/tmp/site:$PKG:$PWD/examples/hf_conversion${PYTHONPATH:+:$PYTHONPATH}"
GPL3=${GPL3:-/usr/share/common-licenses/GPL-3}
H="$OUTDIR/hf"; P="$OUTDIR/ports"; mkdir -p "$H" "$P"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat COMMIT 2>/dev/null | head -1
  "$PY" -c "import sys, torch, transformers; print(sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__)"
  "$PY" -c "import orthros._cuda as c; print('orthros._cuda hopper kernels:', c.hopper_kernels_available())"
  ls -l "$GPL3"; } > "$H/env.txt" 2>&1
cat "$H/env.txt"
EX=examples/hf_conversion
stamp "phase 1: golden suites (CPU, background); training throughput at 8K (GPU alone)"
( export OMP_NUM_THREADS=2; PORTS_NO_INSTALL=1 PORTS_GOLDEN_ONLY=1 nice -n 19 bash ci/gpu_ports.sh > "$P/golden.log" 2>&1 ) &
GOLDEN=$!
OMP_NUM_THREADS=4 timeout 60 "$PY" $EX/gpu_bench.py --out "$H" --only train > "$H/train.log" 2>&1; stamp "gpu_bench train: exit $?"
OMP_NUM_THREADS=4 timeout 100 "$PY" $EX/gpu_flex.py --out "$H" > "$H/flex.log" 2>&1; stamp "gpu_flex: exit $?"
wait $GOLDEN; stamp "golden: exit $? ($(ls "$P/golden" | wc -l) suites)"

stamp "phase 2: ports (one job per library), gradient cross-check, loss curves"
export OMP_NUM_THREADS=3
timeout 260 "$PY" $EX/gpu_bench.py --out "$H/loss" --only loss --text "$GPL3" ${LOSS_ARGS:---loss-steps 300} > "$H/loss.log" 2>&1 &
LOSS=$!
timeout 200 "$PY" $EX/gpu_proofs.py --out "$H" --only gradients > "$H/proofs.log" 2>&1 &
PROOFS=$!
LIBS=${PORTS_LIBS:-flex cudnn flash xformers}
JOBS=()
for lib in $LIBS; do
  cap=280; [ "$lib" = flex ] && cap=400
  PORTS_NO_INSTALL=1 PORTS_NO_SUMMARY=1 PORTS_LIBS=$lib PORTS_TIMEOUT=$([ "$lib" = flex ] && echo 150 || echo 90) \
    timeout $cap bash ci/gpu_ports.sh > "$P/console_$lib.log" 2>&1 &
  JOBS+=($!)
done
for j in "${JOBS[@]}"; do wait "$j"; done; stamp "ports jobs done"
wait $PROOFS; stamp "proofs: exit $?"
wait $LOSS; stamp "loss: exit $?"

SUITES=${PORTS_SUITES:-op-tiny-bf16 op-tiny-f16 op-qwen3-8b-bf16 op-qwen3-8b-f16 op-grad-tiny-bf16 op-grad-tiny-f16 op-grad-qwen3-8b-bf16 op-grad-qwen3-8b-f16 layer-bf16 layer-f16}
"$PY" examples/ports/summarize_ports.py "$P" --libs $LIBS --suites $SUITES > "$OUTDIR/summary.md" 2>&1
{ echo "## HF training throughput (T = 8K) and loss curves"; for f in train.log flex.log loss.log proofs.log; do
    echo "### $f"; grep -E "^\||^\{" "$H/$f" | tail -20 || true; tail -3 "$H/$f"; done; } > "$OUTDIR/hf.md" 2>&1
cp "$H/loss/loss_curve.csv" "$H/loss/loss_curve.png" "$OUTDIR/" 2>/dev/null
cp "$H/bench.json" "$H/proofs.json" "$OUTDIR/" 2>/dev/null
( cd "$OUTDIR" && tar -cJf ports.tar.xz --exclude=golden --exclude='*.results' ports && tar -cJf hf.tar.xz hf && rm -rf ports hf )
rm -rf "$PKG"
stamp "done"
cat "$OUTDIR/summary.md" | head -60
cat "$OUTDIR/hf.md"
