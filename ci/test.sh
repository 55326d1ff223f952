#!/usr/bin/env bash
# Quick start 2: install dependencies, build, and run the CPU test suite (labels unit, property).
# GPU tests (label gpu) skip without a GPU; timing checks (label bench) are excluded because
# wall-clock fits are noisy on shared CI machines (run them with `ctest -L bench`).
# Then the hardening jobs: the same suite under ASan + UBSan (ci/sanitize.sh) and the readers'
# fuzz targets for a bounded time (ci/fuzz.sh); ORTHROS_SKIP_HARDENING=1 skips both.
set -euo pipefail
cd "$(dirname "$0")/.."
ORTHROS_SETUP_TORCH=1 bash ci/setup.sh   # also torch for verify/torch (the orthros.torch tests)
bash ci/build.sh
cd build
ctest -LE bench -j "${ORTHROS_JOBS:-2}" --output-on-failure --timeout 900
cd ..
if [ "${ORTHROS_SKIP_HARDENING:-0}" != 1 ]; then
  bash ci/sanitize.sh
  bash ci/fuzz.sh
fi
