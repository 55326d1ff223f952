#!/usr/bin/env bash
# Builds the GPU binaries on the build host and stages them (plus libgomp) into build-cuda-carry/,
# the folder ci/gpu.sh runs from on the device machine (carry it with the device call).
# ORTHROS_GPU_BUILD_DIR names the build folder (default build-cuda; ci/build.sh's build/ works too
# when nvcc is on PATH, which saves a second full build).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${ORTHROS_GPU_BUILD_DIR:-build-cuda}
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release >/dev/null  # keeps the folder's other cached options
cmake --build "$B" -j2 --target test_attention_gpu test_attention_kernels_gpu test_layer_gpu test_attention_backward_gpu test_layer_backward_gpu \
  test_context_parallel_gpu bench_attention_gpu \
  bench_attention_backward_gpu orthros_bench_gpu orthros
mkdir -p build-cuda-carry
cp "$B"/verify/gpu/test_attention_gpu "$B"/verify/gpu/test_attention_kernels_gpu "$B"/verify/gpu/test_layer_gpu \
  "$B"/bench/gpu/bench_attention_gpu build-cuda-carry/
# The backward: ci/gpu_backward.sh runs these two
cp "$B"/verify/gpu/test_attention_backward_gpu "$B"/verify/gpu/test_layer_backward_gpu \
  "$B"/bench/gpu/bench_attention_backward_gpu build-cuda-carry/
cp "$B"/verify/cli/orthros build-cuda-carry/
# Context parallelism: ci/gpu_context_parallel.sh runs these (the benchmark needs NCCL)
cp "$B"/verify/gpu/test_context_parallel_gpu build-cuda-carry/
if cmake --build "$B" -j2 --target bench_context_parallel >/dev/null 2>&1; then
  cp "$B"/bench/gpu/bench_context_parallel build-cuda-carry/
fi
# The GPU complexity sweep and the libbenchmark it loads from its own folder ($ORIGIN).
cp "$B"/bench/gpu_complexity/orthros_bench_gpu "$B"/bench/gpu_complexity/libbenchmark.so* build-cuda-carry/
cp "$(g++ -print-file-name=libgomp.so.1)" build-cuda-carry/
# Symbols are not needed on the device (the carry limit is 64 MiB with the working tree).
strip build-cuda-carry/test_* build-cuda-carry/bench_* build-cuda-carry/orthros build-cuda-carry/orthros_bench_gpu
{ git rev-parse HEAD; git status --porcelain -- cuda bench/gpu verify/gpu verify/cli verify/kit | head -20; } > build-cuda-carry/COMMIT
du -sh build-cuda-carry
# The same folder as one archive (about a fifth of the size): carry build-xz instead when the
# working tree plus the folder would pass the device tool's 64 MiB; ci/gpu_env.sh unpacks it.
mkdir -p build-xz
tar -C build-cuda-carry -cf - . | xz -T2 -6 > build-xz/carry.tar.xz
du -sh build-xz
