#!/usr/bin/env bash
# GPU job of the Hugging Face conversion (docs/conversion.md): the bf16 proofs and the benchmarks
# of a converted Qwen3-0.6B-shaped model, in ONE device call from the repository root (installs
# nothing; the timeouts below sum to 460 s):
#   bash examples/hf_conversion/gpu_job.sh
# Carry: build-py312-carry (ci/gpu_stage_python.sh: orthros._core and orthros._cuda built for the
# device's Python 3.12, libgomp) and build/verify/cli/orthros (the CPU oracle command; or set
# ORTHROS). The package is assembled from the working tree's verify/python/orthros/ plus the
# carried modules, as ci/gpu_torch.sh does. Logs and results under $OUT/hf_conversion (or
# ./gpu-out/hf_conversion): proofs.{log,json}, bench.{log,json}, loss.log, loss/loss_curve.{csv,png}, flex.log.
# The tables are printed last. Exit status: nonzero if a proof failed or a part errored.
# HF_JOB_ARGS is appended to every script's arguments (a CPU dry run of the job:
# HF_JOB_ARGS="--device cpu --small" PYTHON=<python with torch> ORTHROS_PY_CARRY=<dir with orthros/_core*.so>).
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${ORTHROS_PY_CARRY:-build-py312-carry}
OUTDIR=${OUT:-gpu-out}/hf_conversion
mkdir -p "$OUTDIR"
PY=${PYTHON:-python3}
[ -d "$BIN/orthros" ] || { echo "no $BIN/orthros: run ci/gpu_stage_python.sh on the build host and carry $BIN"; exit 2; }
export LD_LIBRARY_PATH="$PWD/$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
CUBLAS_SO=$(ldconfig -p | grep -o '/[^ ]*libcublas\.so\.13$' | head -1)
[ -n "$CUBLAS_SO" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$CUBLAS_SO")"
PKG=$(mktemp -d)
mkdir -p "$PKG/orthros"
cp -r verify/python/orthros/. "$PKG/orthros/"
cp "$BIN"/orthros/*.so "$PKG/orthros/"
export PYTHONPATH="$PKG:$PWD/examples/hf_conversion${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
if [ -z "${ORTHROS:-}" ]; then
  for c in "$BIN/orthros-cli" build/verify/cli/orthros; do [ -x "$c" ] && { ORTHROS="$PWD/$c"; break; }; done
fi
export ORTHROS=${ORTHROS:-}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; date -u; git rev-parse HEAD 2>/dev/null
  "$PY" -c "import sys, torch, transformers; print(sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__)"
  "$PY" -c "import orthros._cuda as c; print('orthros._cuda hopper kernels:', c.hopper_kernels_available())"
  echo "oracle: ${ORTHROS:-MISSING}"; } 2>&1 | tee "$OUTDIR/env.txt"
rc=0
EX=examples/hf_conversion
XA=${HF_JOB_ARGS:-}
echo "== proofs (w >= T = original, regimes, greedy, torch vs oracle gradients)"
timeout 150 "$PY" $EX/gpu_proofs.py --out "$OUTDIR" $XA > "$OUTDIR/proofs.log" 2>&1 || rc=1
echo "== benchmarks: prefill / decode at 32K, 128K; training at 8K"
timeout 170 "$PY" $EX/gpu_bench.py --out "$OUTDIR" --only prefill,train $XA > "$OUTDIR/bench.log" 2>&1 || rc=1
echo "== loss curve (250 steps, both models)"
OUT_LOSS="$OUTDIR/loss"; mkdir -p "$OUT_LOSS"
timeout 80 "$PY" $EX/gpu_bench.py --out "$OUT_LOSS" --only loss --loss-steps 250 $XA > "$OUTDIR/loss.log" 2>&1 || rc=1
echo "== training peer: the converted model on FlexAttention (compiles on first use)"
timeout 60 "$PY" $EX/gpu_flex.py --out "$OUTDIR" $XA > "$OUTDIR/flex.log" 2>&1 || rc=1
rm -rf "$PKG"
for f in proofs.log bench.log loss.log flex.log; do
  echo "---- $f"; grep -E "^\|" "$OUTDIR/$f" || tail -15 "$OUTDIR/$f"
done
echo "exit status: $rc"
exit $rc
