#!/usr/bin/env bash
# The library adapters of examples/ports/ (cuDNN frontend, PyTorch's FlashAttention varlen,
# FlexAttention, xformers) on the golden suites, judged by `orthros check --diagnose`, on the device
# machine in one command, from the repository root:
#   bash ci/gpu_ports.sh
# Needs: the orthros CLI of this checkout (ORTHROS, else ports-carry/orthros from
# ci/gpu_ports_stage.sh, else $BIN/orthros of ci/gpu_stage.sh), Python 3 with torch (CUDA) and
# numpy, and the wheels nvidia-cudnn-frontend 1.32.0 and xformers 0.0.35 in .whl/ (installed
# here --no-deps into /tmp/site; a library that does not import is reported as such, not fatal).
# Suites (written here by `orthros golden`, seed 7): operator bf16 and f16 x tiny and qwen3-8b,
# forward and --grad; layer bf16 and f16 (one layer suite covers the qwen3-8b, llama3.1-8b and tiny
# shapes). Subsets: PORTS_LIBS="cudnn flash", PORTS_SUITES="op-tiny-bf16 op-grad-tiny-bf16 layer-bf16"
# (names below); PORTS_DEVICE=cpu
# for a dry run of the script without a GPU (FlexAttention forward only).
# Writes under $OUT (or ./gpu-out)/ports/: LIB/SUITE.{log,txt,json} (adapter log, check report,
# check --json) and summary.md (library x suite -> cases passed; every failure with its tensor,
# error vs bound and --diagnose's cause; the conventions each self-check found), printed last.
# Exit status: 0 when every adapter ran (failures of a library are results, not errors).
# The suites are generated in parallel (~20 s each). Several calls may share one $OUT: run
# PORTS_GOLDEN_ONLY=1 first (writes the suites and exits), then one call per library in parallel
# with PORTS_NO_INSTALL=1 PORTS_NO_SUMMARY=1, then examples/ports/summarize_ports.py over all of
# them (ci/gpu_ports_hf.sh does this).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
source ci/gpu_env.sh  # BIN, OUTDIR, LD_LIBRARY_PATH
for d in ports-carry build-py312-carry; do [ -d $d ] && export LD_LIBRARY_PATH="$PWD/$d:$LD_LIBRARY_PATH"; done
if [ -z "${ORTHROS:-}" ]; then
  for c in ports-carry/orthros build-py312-carry/orthros-cli "$BIN/orthros"; do [ -x "$c" ] && { ORTHROS=$c; break; }; done
fi
[ -x "${ORTHROS:-}" ] || { echo "gpu_ports: no orthros CLI (set ORTHROS or carry ports-carry/ from ci/gpu_ports_stage.sh)" >&2; exit 2; }
PY=${PYTHON:-python3}
P="$OUTDIR/ports"
mkdir -p "$P"
source ci/python_package.sh
[ -z "${PORTS_NO_INSTALL:-}" ] && orthros_carried_wheels "$PY" '*.whl'
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; git rev-parse HEAD 2>/dev/null
  "$PY" - <<'PYV'
import importlib, torch
print(f"python {__import__('platform').python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
for m in ("cudnn", "xformers"):
    try:
        mod = importlib.import_module(m)
        extra = f", cuDNN backend {mod.backend_version()}" if hasattr(mod, "backend_version") else ""
        print(f"{m} {getattr(mod, '__version__', '?')}{extra}")
    except Exception as e:
        print(f"{m}: import failed: {type(e).__name__}: {e}")
PYV
} 2>&1 | tee "$P/env.txt"

declare -A SUITE_ARGS=(
  [op-tiny-bf16]="--config tiny --dtype bf16"        [op-tiny-f16]="--config tiny --dtype f16"
  [op-qwen3-8b-bf16]="--config qwen3-8b --dtype bf16" [op-qwen3-8b-f16]="--config qwen3-8b --dtype f16"
  [op-grad-tiny-bf16]="--config tiny --dtype bf16 --grad"        [op-grad-tiny-f16]="--config tiny --dtype f16 --grad"
  [op-grad-qwen3-8b-bf16]="--config qwen3-8b --dtype bf16 --grad" [op-grad-qwen3-8b-f16]="--config qwen3-8b --dtype f16 --grad"
  [layer-bf16]="--level layer --dtype bf16"         [layer-f16]="--level layer --dtype f16")
ORDER="op-tiny-bf16 op-tiny-f16 op-qwen3-8b-bf16 op-qwen3-8b-f16 op-grad-tiny-bf16 op-grad-tiny-f16 op-grad-qwen3-8b-bf16 op-grad-qwen3-8b-f16 layer-bf16 layer-f16"
SUITES=${PORTS_SUITES:-$ORDER}
LIBS=${PORTS_LIBS:-cudnn flash flex xformers}

G="$P/golden"
for s in $SUITES; do
  [ -n "${SUITE_ARGS[$s]+x}" ] || { echo "gpu_ports: unknown suite $s (one of: $ORDER)" >&2; exit 2; }
  [ -f "$G/$s/manifest.json" ] && continue
  # shellcheck disable=SC2086
  "$ORTHROS" golden --out "$G/$s" --seed 7 ${SUITE_ARGS[$s]} >"$P/golden_$s.log" 2>&1 &
done
wait
for s in $SUITES; do
  [ -f "$G/$s/manifest.json" ] || { echo "gpu_ports: orthros golden $s failed (see $P/golden_$s.log)" >&2; exit 2; }
done
[ -n "${PORTS_GOLDEN_ONLY:-}" ] && exit 0

for lib in $LIBS; do
  mkdir -p "$P/$lib"
  for s in $SUITES; do
    echo "== $lib on $s"
    out="$P/$lib/$s.results"
    rm -rf "$out"
    XFORMERS_MORE_DETAILS=1 timeout "${PORTS_TIMEOUT:-240}" "$PY" "examples/ports/${lib}_port.py" --golden "$G/$s" --out "$out" --device "${PORTS_DEVICE:-cuda}" \
      >"$P/$lib/$s.log" 2>&1
    rc=$?
    grep -E "^\[$lib" "$P/$lib/$s.log" | grep -E "convention found|FAILED|results|skip" | head -20
    if [ "$rc" -ne 0 ]; then
      echo "   adapter exited $rc (last lines of $P/$lib/$s.log):"; tail -3 "$P/$lib/$s.log" | sed 's/^/   /'
      echo "{\"adapter_exit\": $rc}" >"$P/$lib/$s.json"
      continue
    fi
    "$ORTHROS" check --suite "$G/$s" --actual-dir "$out" --skip-missing --diagnose >"$P/$lib/$s.txt" 2>&1
    "$ORTHROS" check --suite "$G/$s" --actual-dir "$out" --skip-missing --diagnose --json >"$P/$lib/$s.json" 2>/dev/null
    tail -1 "$P/$lib/$s.txt"
  done
done
[ -n "${PORTS_NO_SUMMARY:-}" ] && exit 0
"$PY" examples/ports/summarize_ports.py "$P" --libs $LIBS --suites $SUITES >"$P/summary.md"
cat "$P/summary.md"
