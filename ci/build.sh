#!/usr/bin/env bash
# Configures and builds Orthros into ./build (CUDA kernels too when nvcc is on PATH).
# Usage: ci/build.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${ORTHROS_JOBS:-2}"
# ccache (ci/setup.sh), when installed, for a new build tree (an existing one keeps its compile
# commands, so it is not rebuilt): the wheel test (ctest packaging_wheel) compiles the command again
# through `pip install .` and gets these objects from the cache.
LAUNCHER=()
if command -v ccache >/dev/null 2>&1 && [ ! -f build/CMakeCache.txt ]; then
  LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${LAUNCHER[@]}" "$@"
cmake --build build -j "$JOBS"
