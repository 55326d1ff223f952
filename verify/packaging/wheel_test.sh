#!/usr/bin/env bash
# ctest packaging_wheel: what a user on Debian does, checked end to end.
#   wheel_test.sh SOURCE_DIR WORK_DIR PYTHON
# 1. PYTHON -m venv (python3-venv; --system-site-packages so Debian's python3-numpy satisfies the
#    numpy dependency without a download), then `pip install SOURCE_DIR`: pip's isolated build
#    fetches the pinned scikit-build-core and pybind11 from PyPI and compiles the command and the
#    module (CMake: tests, benchmarks and CUDA off).
# 2. `orthros --help` and `orthros golden --grad` from the venv's PATH.
# 3. test_testing.py with the venv's Python (ORTHROS_EXPECT_INSTALLED=1: the module and the command
#    must come from the venv), no PYTHONPATH, run from WORK_DIR.
# The compile uses ccache when it is installed (ci/setup.sh): the first run compiles the command and
# the module (~4 CPU-minutes), a rerun takes ~1 min (the module misses: pybind11's path in pip's
# isolated build changes each time). Build log: WORK_DIR/pip.log.
set -euo pipefail
SRC=$(cd "$1" && pwd)
WORK=$2
PY=$3
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK"
unset PYTHONPATH PYTHONHOME PIP_REQUIRE_VIRTUALENV ORTHROS
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
export CMAKE_BUILD_PARALLEL_LEVEL=${ORTHROS_JOBS:-2}
if command -v ccache >/dev/null 2>&1 && [ -z "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ]; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache
fi

t0=$SECONDS
"$PY" -m venv --system-site-packages venv
echo "[wheel] venv: $WORK/venv ($("$WORK/venv/bin/python" --version))"
if ! "$WORK/venv/bin/python" -m pip install -v "$SRC" > pip.log 2>&1; then
  tail -n 60 pip.log
  echo "[wheel] FAILED: pip install $SRC (log: $WORK/pip.log; the isolated build needs PyPI)"
  exit 1
fi
grep -E "Successfully installed|Created wheel" pip.log || true
echo "[wheel] pip install: $((SECONDS - t0)) s"

export PATH="$WORK/venv/bin:$PATH"
exe=$(command -v orthros)
[ "$exe" = "$WORK/venv/bin/orthros" ] || { echo "[wheel] FAILED: orthros on PATH is $exe, not the venv's"; exit 1; }
orthros --help | grep -q "golden" || { echo "[wheel] FAILED: orthros --help lists no golden"; exit 1; }
orthros golden --out "$WORK/golden-grad" --grad
[ -f "$WORK/golden-grad/manifest.json" ] || { echo "[wheel] FAILED: no manifest"; exit 1; }

ORTHROS_EXPECT_INSTALLED=1 "$WORK/venv/bin/python" "$SRC/verify/packaging/test_testing.py"
# orthros.torch is in the wheel (pure Python; imported only with torch, which this venv may lack)
"$WORK/venv/bin/python" -c "import orthros, os, sys; p = os.path.join(os.path.dirname(orthros.__file__), 'torch', '__init__.py'); sys.exit(0 if os.path.isfile(p) else '[wheel] FAILED: no ' + p)"
echo "[wheel] passed in $((SECONDS - t0)) s"
