#!/usr/bin/env bash
# Installs every build/test dependency of Orthros from Debian packages. Idempotent:
# packages already present are skipped, so a second run costs a few seconds.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  libeigen3-dev            # reference oracle
  libomp-dev               # OpenMP (g++ uses libgomp; kept for clang builds)
  librapidcheck-dev        # property tests
  libgtest-dev googletest  # unit tests
  libbenchmark-dev         # micro-benchmarks
  doxygen libjs-mathjax    # docs target (equations rendered offline by MathJax)
  libcli11-dev             # orthros command line
  nlohmann-json3-dev       # safetensors header, manifests, --json reports
  pybind11-dev python3-dev python3-numpy  # Python bindings (issue 3)
  python3-matplotlib       # plotting benchmark results
  python3-venv             # `pip install .` into a venv (Debian's Python is externally managed; issue 11)
  ninja-build ccache       # the wheel build (scikit-build-core uses Ninja; ccache: a rerun of ctest packaging_wheel takes ~1 min)
  clang libclang-rt-14-dev # libFuzzer + sanitizers for the readers' fuzz targets (ci/fuzz.sh)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "[setup] installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "[setup] all ${#PACKAGES[@]} packages present"
fi
