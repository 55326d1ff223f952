#!/usr/bin/env bash
# Configures and builds Orthros into ./build (CUDA kernels too when nvcc is on PATH).
# Usage: ci/build.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${ORTHROS_JOBS:-2}"
# NCCL transport of context parallelism: ON whenever ci/setup.sh unpacked the pinned
# wheel into .deps/nccl and nvcc exists (explicit, so a build dir configured before flips on).
NCCL_ARGS=()
if [ -f .deps/nccl/include/nccl.h ] && { command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; }; then
  NCCL_ARGS=(-DORTHROS_NCCL=ON)
fi
# nanobind for the extension orthros._cuda (cuda/python/): ci/setup.sh's pinned venv .deps/nanobind.
NB_ARGS=()
if [ -x .deps/nanobind/bin/python ] && nb_dir=$(.deps/nanobind/bin/python -m nanobind --cmake_dir 2>/dev/null); then
  NB_ARGS=(-Dnanobind_DIR="$nb_dir")
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${NCCL_ARGS[@]}" "${NB_ARGS[@]}" "$@"
cmake --build build -j "$JOBS"
