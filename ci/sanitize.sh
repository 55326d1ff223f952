#!/usr/bin/env bash
# Builds the CPU test suite with AddressSanitizer + UndefinedBehaviorSanitizer (g++) into
# ./build-asan and runs it (labels unit, property; gpu and bench excluded). Any sanitizer report
# fails the test that triggered it (-fno-sanitize-recover: UB aborts; ASan aborts by default).
# The Python bindings are left out (an instrumented extension would need ASan preloaded into the
# interpreter), and so are the packaging tests (they build a wheel and a consumer project with
# their own flags) and the layer suite's end-to-end test (NumPy-bound; its C++ side, `orthros
# golden/check --level layer`, runs in the portkit unit tests). Usage: ci/sanitize.sh [cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${ORTHROS_JOBS:-2}"
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DORTHROS_CUDA=OFF -DORTHROS_BENCH=OFF \
  -DORTHROS_PYTHON=OFF -DCMAKE_CXX_FLAGS="$SAN" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" "$@" >/dev/null
cmake --build build-asan -j "$JOBS"
cd build-asan
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest -LE 'bench|gpu' -E '^packaging_|^portkit_layer_golden$' -j "$JOBS" --output-on-failure --timeout 1200
