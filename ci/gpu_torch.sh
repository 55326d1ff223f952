#!/usr/bin/env bash
# GPU job of the PyTorch / DLPack entry (orthros._cuda, orthros.torch), run on the device machine
# in ONE call from the repository root; installs nothing; its timeouts sum to 4 minutes:
#   bash ci/gpu_torch.sh
# Expects build-py312-carry/ (ci/gpu_stage_python.sh: _core and _cuda built for the device's
# Python 3.12, the `orthros` command, libgomp) carried along. The package is assembled from the
# working tree's verify/python/orthros/ (.py files, orthros/torch/) plus those modules into a
# temporary folder on PYTHONPATH. Runs:
#   1. verify/cuda_python: the extension's argument tests and its GPU tests (oracle, deterministic
#      regimes bitwise, raw DLPack capsule, CuPy, backward, RoPE append, layer);
#   2. pytest verify/torch -m gpu: orthros.torch on CUDA (opcheck, compile, CUDA graph, the kit's
#      golden suites through the ops and OrthrosAttention);
#   3. bench/gpu/bench_torch_ops.py: the op's time over the C++ call's.
# Writes three files under $OUT (or ./gpu-out): gpu_torch_logs.tar.gz (every log),
# bench_torch_ops.json and gpu_torch_summary.txt (what is printed); the benchmark table comes last.
# Exit status: nonzero if a test failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export ORTHROS_GPU_BIN=${ORTHROS_PY_CARRY:-build-py312-carry}
source ci/gpu_env.sh  # BIN (the carry), OUTDIR, LD_LIBRARY_PATH (the carry's libgomp, cuBLAS, NCCL)
PY=${PYTHON:-python3}
[ -d "$BIN/orthros" ] || { echo "no $BIN/orthros: run ci/gpu_stage_python.sh on the build host and carry $BIN"; exit 2; }
source ci/python_package.sh
TMP=$(mktemp -d)
LOGS="$TMP/logs"
mkdir -p "$LOGS"
PKG=$(orthros_python_package "$BIN")
export PYTHONPATH="$PKG${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1
export ORTHROS="$PWD/$BIN/orthros-cli"  # the command line tool (`orthros golden` makes the suites)
rc=0
main() {
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; cat "$BIN/COMMIT"; date -u
    "$PY" -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
    "$PY" -c "import cupy; print('cupy', cupy.__version__)" 2>&1 | tail -1
    "$PY" -c "import pytest; print('pytest', pytest.__version__)" 2>&1 | tail -1
    "$PY" -c "import orthros._cuda as c; print('orthros._cuda hopper kernels:', c.hopper_kernels_available())"
  } 2>&1 | tee "$LOGS/env.txt"

  echo "== orthros._cuda argument tests"
  (cd verify/cuda_python && timeout 15 "$PY" -m unittest test_cuda_module) > "$LOGS/cuda_module_args.log" 2>&1
  r=$?; tail -3 "$LOGS/cuda_module_args.log"; [ $r -ne 0 ] && rc=$r
  echo "== orthros._cuda GPU tests"
  (cd verify/cuda_python && timeout 75 "$PY" test_cuda_module_gpu.py -v) > "$LOGS/cuda_module_gpu.log" 2>&1
  r=$?; grep -E "^(FAIL|ERROR)|Error:|skipped|^Ran|^OK|FAILED" "$LOGS/cuda_module_gpu.log" | head -30
  [ $r -ne 0 ] && rc=$r

  echo "== orthros.torch GPU tests (pytest verify/torch -m gpu)"
  if "$PY" -c "import pytest" 2>/dev/null; then
    timeout 100 "$PY" -m pytest verify/torch -m gpu -v -p no:cacheprovider > "$LOGS/torch_gpu.log" 2>&1
    r=$?; grep -E "FAILED|ERROR|passed|failed|skipped" "$LOGS/torch_gpu.log" | tail -25; [ $r -ne 0 ] && rc=$r
  else
    echo "SKIPPED: pytest is not importable on this machine (nothing is installed here); verify/torch not run" \
      | tee "$LOGS/torch_gpu.log"
  fi

  echo "== benchmark: torch op vs C++ call"
  timeout 50 "$PY" bench/gpu/bench_torch_ops.py --samples 11 --json "$OUTDIR/bench_torch_ops.json" \
    > "$LOGS/bench_torch_ops.log" 2>&1
  r=$?; [ $r -ne 0 ] && { tail -20 "$LOGS/bench_torch_ops.log"; rc=$r; }
  echo "tests exit status: $rc"
  sed -n '/^| case/,$p' "$LOGS/bench_torch_ops.log"
}
main 2>&1 | tee "$OUTDIR/gpu_torch_summary.txt"
rc=$(sed -n 's/^tests exit status: //p' "$OUTDIR/gpu_torch_summary.txt" | tail -1)
tar -C "$TMP" -czf "$OUTDIR/gpu_torch_logs.tar.gz" logs
rm -rf "$TMP" "$PKG"
exit "${rc:-1}"
