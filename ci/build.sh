#!/usr/bin/env bash
# Configures and builds Orthros into ./build (CUDA kernels too when nvcc is on PATH).
# Usage: ci/build.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${ORTHROS_JOBS:-2}"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$JOBS"
