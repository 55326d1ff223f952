#!/usr/bin/env bash
# Quick start 2: install dependencies, build, and run the CPU test suite (labels unit, property).
# GPU tests (label gpu) skip without a GPU; timing checks (label bench) are excluded because
# wall-clock fits are noisy on shared CI machines (run them with `ctest -L bench`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
bash ci/build.sh
cd build
ctest -LE bench -j "${ORTHROS_JOBS:-2}" --output-on-failure --timeout 900
