#!/usr/bin/env bash
# Quick start 1: install what `orthros verify` needs, build only the CPU oracle and the `orthros`
# command, and run the main job `orthros verify`.
# Extra arguments go to `orthros verify` (e.g. --config llama3.1-8b --seq-len 512).
# Builds into build-verify/ (its own folder: never reconfigures ci/test.sh's build/). No tests,
# benchmarks or Python module; the CUDA kernels only when asked (ORTHROS_CUDA=ON; nvcc on PATH) or
# when a GPU is present (nvidia-smi lists one and nvcc exists): then `orthros verify --device cuda`
# works too. ORTHROS_CUDA=OFF never builds them.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD_DIR:-build-verify}
CUDA=${ORTHROS_CUDA:-auto}
if [ "$CUDA" = auto ]; then
  CUDA=OFF
  if { command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; } &&
     nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    CUDA=ON
  fi
fi
echo "[verify] CUDA kernels: $CUDA (ORTHROS_CUDA=ON|OFF decides; default: ON only with a GPU present)"
if [ "$CUDA" = ON ]; then bash ci/setup.sh; else bash ci/setup.sh --minimal; fi
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DORTHROS_CUDA="$CUDA" -DORTHROS_TESTS=OFF \
  -DORTHROS_BENCH=OFF -DORTHROS_PYTHON=OFF >/dev/null
cmake --build "$BUILD" -j "${ORTHROS_JOBS:-2}" --target orthros
"./$BUILD/verify/cli/orthros" verify "$@"
