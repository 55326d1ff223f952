#!/usr/bin/env bash
# Installs every build/test dependency of Orthros from Debian packages. Idempotent:
# packages already present are skipped, so a second run costs a few seconds.
#   bash ci/setup.sh             # everything: the test suite, docs, Python, fuzzing, NCCL (with nvcc)
#   bash ci/setup.sh --minimal   # only what `orthros verify` needs (ci/verify.sh): no NCCL download
set -euo pipefail
MINIMAL=0
[ "${1:-}" = "--minimal" ] && MINIMAL=1

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
  pybind11-dev python3-dev python3-numpy  # Python bindings
  python3-pytest           # runs a port's test of orthros.testing.assert_matches_golden (README, verify/packaging)
  python3-matplotlib       # plotting benchmark results
  python3-venv             # `pip install .` into a venv (Debian's Python is externally managed)
  ninja-build ccache       # the wheel build (scikit-build-core uses Ninja; ccache: a rerun of ctest packaging_wheel takes ~1 min)
  clang libclang-rt-14-dev # libFuzzer + sanitizers for the readers' fuzz targets (ci/fuzz.sh)
)

# The verify path (ci/verify.sh): compiler, CMake and the oracle's and command's headers only.
if [ "$MINIMAL" = 1 ]; then
  PACKAGES=(build-essential cmake pkg-config libeigen3-dev libcli11-dev nlohmann-json3-dev)
fi

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

# NCCL for the context-parallel transport (docs/context_parallel.md): the pinned
# nvidia-nccl-cu13 wheel, checked against its sha256 and unpacked into .deps/nccl (include/nccl.h,
# lib/libnccl.so.2; git-ignored, never vendored). CMake finds it there (ORTHROS_NCCL_ROOT).
# Skipped when already unpacked, when no nvcc is found (CPU-only machine), or ORTHROS_SKIP_NCCL=1.
NCCL_VERSION=2.28.9
NCCL_WHEEL=nvidia_nccl_cu13-${NCCL_VERSION}-py3-none-manylinux_2_18_x86_64.whl
NCCL_SHA256=e4553a30f34195f3fa1da02a6da3d6337d28f2003943aa0a3d247bbc25fefc42
NCCL_URL=https://files.pythonhosted.org/packages/b0/b4/878fefaad5b2bcc6fcf8d474a25e3e3774bc5133e4b58adff4d0bca238bc/${NCCL_WHEEL}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
NCCL_DIR="$ROOT/.deps/nccl"
if [ "$MINIMAL" = 1 ]; then
  echo "[setup] NCCL: skipped (--minimal: \`orthros verify\` does not use it)"
elif [ "${ORTHROS_SKIP_NCCL:-0}" = 1 ]; then
  echo "[setup] NCCL: skipped (ORTHROS_SKIP_NCCL=1)"
elif ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "[setup] NCCL: skipped (no nvcc: CPU-only build)"
elif [ -f "$NCCL_DIR/include/nccl.h" ] && [ -f "$NCCL_DIR/lib/libnccl.so.2" ] &&
     [ "$(cat "$NCCL_DIR/VERSION" 2>/dev/null)" = "$NCCL_VERSION" ]; then
  echo "[setup] NCCL $NCCL_VERSION present in .deps/nccl"
else
  cache="$ROOT/.deps/cache"
  mkdir -p "$cache"
  whl="$cache/$NCCL_WHEEL"
  if [ ! -f "$whl" ] || ! echo "$NCCL_SHA256  $whl" | sha256sum -c --status; then
    echo "[setup] NCCL: downloading nvidia-nccl-cu13==$NCCL_VERSION (~200 MB)"
    rm -f "$whl"
    # pip (any python3 that has it; else a throw-away venv, python3-venv bootstraps pip), else curl/wget.
    for py in python3 /usr/bin/python3; do
      if [ ! -f "$whl" ] && "$py" -m pip --version >/dev/null 2>&1; then
        "$py" -m pip download -q --no-deps --only-binary=:all: "nvidia-nccl-cu13==$NCCL_VERSION" -d "$cache" || true
      fi
    done
    if [ ! -f "$whl" ] && /usr/bin/python3 -m venv "$cache/venv" >/dev/null 2>&1; then
      "$cache/venv/bin/python" -m pip download -q --no-deps --only-binary=:all: "nvidia-nccl-cu13==$NCCL_VERSION" \
        -d "$cache" || true
    fi
    if [ ! -f "$whl" ]; then
      if command -v curl >/dev/null 2>&1; then curl -fsSL -o "$whl" "$NCCL_URL"; else wget -q -O "$whl" "$NCCL_URL"; fi
    fi
    echo "$NCCL_SHA256  $whl" | sha256sum -c --status || { echo "[setup] NCCL: sha256 mismatch for $whl" >&2; exit 1; }
  fi
  tmp="$ROOT/.deps/nccl.tmp"
  rm -rf "$tmp" "$NCCL_DIR"
  /usr/bin/env python3 - "$whl" "$tmp" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [m for m in z.namelist() if m.startswith("nvidia/nccl/")])
PY
  mv "$tmp/nvidia/nccl" "$NCCL_DIR"
  rm -rf "$tmp" "$cache"  # the wheel is not needed once unpacked
  echo "$NCCL_VERSION" > "$NCCL_DIR/VERSION"
  echo "[setup] NCCL $NCCL_VERSION unpacked into .deps/nccl"
fi

# nanobind for the Python extension orthros._cuda (cuda/python/, DLPack arrays): the pinned PyPI
# release in a venv of Debian's python3 at .deps/nanobind (git-ignored); ci/build.sh passes its
# CMake directory as nanobind_DIR. Skipped when no nvcc is found (the extension exists only in a
# CUDA build) or when that version is installed already.
NANOBIND_VERSION=2.9.2
NB_VENV="$ROOT/.deps/nanobind"
if [ "$MINIMAL" = 1 ]; then
  echo "[setup] nanobind: skipped (--minimal: the orthros command needs no Python extension)"
elif ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "[setup] nanobind: skipped (no nvcc: CPU-only build)"
elif [ "$("$NB_VENV/bin/python" -c 'import nanobind; print(nanobind.__version__)' 2>/dev/null)" = "$NANOBIND_VERSION" ]; then
  echo "[setup] nanobind $NANOBIND_VERSION present in .deps/nanobind"
else
  rm -rf "$NB_VENV"
  /usr/bin/python3 -m venv "$NB_VENV"
  "$NB_VENV/bin/python" -m pip install -q --disable-pip-version-check "nanobind==$NANOBIND_VERSION"
  echo "[setup] nanobind $NANOBIND_VERSION installed into .deps/nanobind"
fi

# PyTorch for the orthros.torch tests (verify/torch), only when asked: ORTHROS_SETUP_TORCH=1 (set by
# ci/test.sh; ci/verify.sh does not need it). torch pinned from PyPI (no Debian package; ~2 min,
# 4.7 GB) into the venv .deps/venv-torch (git-ignored), made from /usr/bin/python3 with
# --system-site-packages so Debian's numpy and pytest (python3-pytest) are the ones used. CMake
# runs verify/torch with that venv's python (ORTHROS_TORCH_PYTHON); without it those tests skip.
TORCH_VERSION=2.11.0
TORCH_VENV="$ROOT/.deps/venv-torch"
if [ "${ORTHROS_SETUP_TORCH:-0}" = 1 ] && [ "$MINIMAL" != 1 ]; then
  if ! dpkg-query -W -f='${Status}' python3-pytest 2>/dev/null | grep -q "install ok installed"; then
    echo "[setup] installing: python3-pytest"
    $( [ "$(id -u)" -ne 0 ] && echo sudo ) env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends python3-pytest >/dev/null
  fi
  if "$TORCH_VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" \
       >/dev/null 2>&1; then
    echo "[setup] torch $TORCH_VERSION present in .deps/venv-torch"
  else
    echo "[setup] torch: installing torch==$TORCH_VERSION into .deps/venv-torch (~2 min, 4.7 GB)"
    /usr/bin/python3 -m venv --system-site-packages "$TORCH_VENV"
    "$TORCH_VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==$TORCH_VERSION"
  fi
fi

# transformers for the Hugging Face conversion (orthros.torch.convert, verify/hf, examples/hf_conversion):
# the pinned PyPI release (the one the GPU machine has) with its dependencies, into the same venv
# .deps/venv-torch, when torch is asked for (ORTHROS_SETUP_TORCH=1) and that venv exists; skipped
# when already installed or with ORTHROS_SKIP_TRANSFORMERS=1 (the verify/hf tests then skip).
TRANSFORMERS_VERSION=5.17.0
if [ "${ORTHROS_SETUP_TORCH:-0}" != 1 ]; then
  :
elif [ "${ORTHROS_SKIP_TRANSFORMERS:-0}" = 1 ]; then
  echo "[setup] transformers: skipped (ORTHROS_SKIP_TRANSFORMERS=1)"
elif [ ! -x "$TORCH_VENV/bin/python" ]; then
  echo "[setup] transformers: skipped (no torch venv at $TORCH_VENV)"
elif "$TORCH_VENV/bin/python" -c "import sys, transformers; sys.exit(transformers.__version__ != '$TRANSFORMERS_VERSION')" \
     >/dev/null 2>&1; then
  echo "[setup] transformers $TRANSFORMERS_VERSION present in .deps/venv-torch"
else
  echo "[setup] transformers: installing transformers==$TRANSFORMERS_VERSION into .deps/venv-torch"
  "$TORCH_VENV/bin/python" -m pip install -q --disable-pip-version-check "transformers==$TRANSFORMERS_VERSION"
fi
