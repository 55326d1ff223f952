#!/usr/bin/env bash
# Builds the compiled half of the Python package `orthros` (orthros._core and the CUDA extension
# orthros._cuda) for the GPU machine's Python 3.12, and stages it for ci/gpu_torch.sh:
#   bash ci/gpu_stage_python.sh            -> build-py312-carry/ (carry it with the device call)
# The build host's CMake uses Python 3.11; the device image runs CPython 3.12.3 (torch 2.11, CUDA
# 13.0), so this configures its own build dir (build-py312) against a 3.12 interpreter
# (ORTHROS_GPU_PYTHON, default pyenv's 3.12.1: same minor version, same ABI) with nanobind and
# pybind11 pinned from PyPI into a 3.12 venv under .deps/ (git-ignored). _cuda asks for
# nanobind's STABLE_ABI (abi3), which needs CMake >= 3.26; with Debian 12's 3.25 both modules are
# cpython-312 builds, which the device's 3.12.3 loads the same (one minor version, one ABI). Only
# the two modules, the CUDA library they need and the `orthros` command (build-py312-carry/
# orthros-cli) are built. The pure-Python files are NOT staged: ci/gpu_torch.sh takes them from
# the working tree it runs in, so the carry stays valid while they change. Size: about 13 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${ORTHROS_GPU_PYTHON:-/root/.pyenv/versions/3.12.1/bin/python3}
NANOBIND_VERSION=2.9.2   # as ci/setup.sh and pyproject.toml
PYBIND11_VERSION=2.13.6  # as pyproject.toml (Debian's 2.10 predates Python 3.12)
VENV=.deps/py312-build
BUILD=build-py312
CARRY=build-py312-carry
if [ "$("$VENV/bin/python" -c 'import nanobind, pybind11; print(nanobind.__version__, pybind11.__version__)' 2>/dev/null)" \
     != "$NANOBIND_VERSION $PYBIND11_VERSION" ]; then
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "nanobind==$NANOBIND_VERSION" "pybind11==$PYBIND11_VERSION"
fi
LAUNCHER=()
if command -v ccache >/dev/null 2>&1; then
  LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(dirname "$PWD")}
fi
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DORTHROS_CUDA=ON -DORTHROS_TESTS=OFF -DORTHROS_BENCH=OFF \
  -DPython_EXECUTABLE="$PY" -Dnanobind_DIR="$("$VENV/bin/python" -m nanobind --cmake_dir)" \
  -Dpybind11_DIR="$("$VENV/bin/python" -m pybind11 --cmakedir)" "${LAUNCHER[@]}" >"$BUILD.configure.log"
mv "$BUILD.configure.log" "$BUILD/configure.log"
grep -E "orthros._cuda|python bindings" "$BUILD/configure.log"
# The `orthros` command too: verify/torch's golden tests generate their suites with it.
cmake --build "$BUILD" -j "${ORTHROS_JOBS:-2}" --target orthros_python orthros_cuda_python orthros
rm -rf "$CARRY"
mkdir -p "$CARRY/orthros"
cp "$BUILD"/python/orthros/_core*.so "$BUILD"/python/orthros/_cuda*.so "$CARRY/orthros/"
cp "$BUILD/verify/cli/orthros" "$CARRY/orthros-cli"  # not "orthros": that is the package folder
strip --strip-unneeded "$CARRY"/orthros/*.so "$CARRY/orthros-cli"
# libgomp.so.1: the OpenMP runtime of _core and the command (the device image may lack it).
cp "$(g++ -print-file-name=libgomp.so.1)" "$CARRY/"
{ git rev-parse HEAD; git status --porcelain -- cuda verify/python verify/kit reference/include | head -20; "$PY" --version; } \
  > "$CARRY/COMMIT"
ls -l "$CARRY" "$CARRY/orthros"
du -sh "$CARRY"
