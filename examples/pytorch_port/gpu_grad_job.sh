#!/usr/bin/env bash
# The device job behind results-2026-12-01-h200-grad/: writes the gradient suites on the GPU
# machine with a carried `orthros` and runs the PyTorch port's forward + autograd backward on
# them (run_on_gpu.sh), checking all eight tensors there.
#
#   bash examples/pytorch_port/gpu_grad_job.sh CARRY_DIR OUT_DIR
#
# CARRY_DIR holds an x86-64 `orthros` built here and its libgomp.so.1 (stage with:
#   mkdir -p build-port-carry && cp build-port/verify/cli/orthros build-port-carry/ &&
#   cp "$(g++ -print-file-name=libgomp.so.1)" build-port-carry/
# and carry build-port-carry with the device call). Suites (default seed 20261013, identical bytes
# to the same command here; their manifest hashes are logged to compare):
#   grad-tiny-{bf16,f32,f16}  config tiny      variants sdpa, flex, sdpa-bug, flex-bug
#   grad-q3-{bf16,f32}        config qwen3-8b  variants sdpa, flex, sdpa-bug
# The two groups run at once (one GPU, 16 cores: the ports are small, the checks CPU-bound and
# spread over the cores by check_parallel.py). Only the bf16 tiny results come back (all of them
# would exceed the device tool's 16 MiB per file); every check runs there and its text and JSON
# reports come back: OUT_DIR gets job.log, tiny/{torch_port.log,checks.txt,checks.jsonl,
# torch_results.tar.gz} and q3/{torch_port.log,checks.txt,checks.jsonl}: 8 files, the tool's limit.
set -uo pipefail
carry=$(cd "${1:?usage: gpu_grad_job.sh CARRY_DIR OUT_DIR}" && pwd)
out=${2:?usage: gpu_grad_job.sh CARRY_DIR OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
log="$out/job.log"
export LD_LIBRARY_PATH="$carry${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1
O="$carry/orthros"
s=$(mktemp -d)
rc=0
{
  date -u +"%Y-%m-%d %H:%M:%S UTC"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  cat "$carry/COMMIT" 2>/dev/null
  t0=$(date +%s)
  for dt in bf16 f32 f16; do "$O" golden --grad --out "$s/grad-tiny-$dt" --dtype "$dt" || rc=1; done
  for dt in bf16 f32; do "$O" golden --grad --config qwen3-8b --out "$s/grad-q3-$dt" --dtype "$dt" || rc=1; done
  echo "suites written in $(( $(date +%s) - t0 )) s"
  (cd "$s" && sha256sum */manifest.json && du -sh ./*)
} >"$log" 2>&1
t0=$(date +%s)
ORTHROS="$O" VARIANTS="sdpa flex sdpa-bug flex-bug" ARCHIVE_SUITES=grad-tiny-bf16 CHECK_JOBS=6 \
  bash "$here/run_on_gpu.sh" "$out/tiny" "$s/grad-tiny-bf16" "$s/grad-tiny-f32" "$s/grad-tiny-f16" \
  >"$s/tiny.out" 2>&1 &
p1=$!
ORTHROS="$O" RESULTS_ARCHIVE=0 CHECK_JOBS=12 bash "$here/run_on_gpu.sh" "$out/q3" "$s/grad-q3-bf16" "$s/grad-q3-f32" \
  >"$s/q3.out" 2>&1 &
p2=$!
wait $p1 || rc=1
echo "tiny suites done: $(( $(date +%s) - t0 )) s" >>"$log"
wait $p2 || rc=1
echo "qwen3-8b suites done: $(( $(date +%s) - t0 )) s" >>"$log"
{ echo "===== tiny"; cat "$s/tiny.out"; echo "===== qwen3-8b"; cat "$s/q3.out"; } >>"$log"
rm -rf "$s"
echo "gpu_grad_job.sh: exit $rc" >>"$log"
grep -E "^(torch |check |FAILED|run_on_gpu|tiny|qwen3|suites|gpu_grad|=====)|passed" "$log"
exit $rc
