#!/usr/bin/env bash
# Configures and builds Orthros into ./build (CUDA kernels too when nvcc is on PATH).
# Usage: ci/build.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${ORTHROS_JOBS:-2}"
# NCCL transport of context parallelism (issue 12): ON whenever ci/setup.sh unpacked the pinned
# wheel into .deps/nccl and nvcc exists (explicit, so a build dir configured before flips on).
NCCL_ARGS=()
if [ -f .deps/nccl/include/nccl.h ] && { command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; }; then
  NCCL_ARGS=(-DORTHROS_NCCL=ON)
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${NCCL_ARGS[@]}" "$@"
cmake --build build -j "$JOBS"
