#!/usr/bin/env bash
# Stages the binaries of run.sh (on the build host, from the repository root, after ci/build.sh):
# base from HEAD (ci/gpu_stage.sh, the build folder build/), then desc, bulkdesc, redv4, descredv4
# and bulk from HEAD plus this folder's patches (cuda/ restored after each), all packed into
# build-xz3/carry.tar.xz.
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=bench/results/2026-12-07-h200
[ -z "$(git status --porcelain -- cuda)" ] || { echo "cuda/ has uncommitted or untracked changes"; exit 1; }
trap 'git checkout -q -- cuda' EXIT  # a failed variant build leaves cuda/ as HEAD has it
ORTHROS_GPU_BUILD_DIR=build bash ci/gpu_stage.sh
C=build-cuda-carry
# Not used by run.sh (and too large for the carry beside the variants).
rm -f $C/bench_context_parallel $C/test_context_parallel_gpu $C/orthros_bench_gpu $C/libbenchmark*
variant() {
  local v=$1; shift
  for patch in "$@"; do git apply "$D/$patch"; done
  local targets=(bench_attention_backward_gpu test_attention_backward_gpu)
  [ "$v" = bulk ] && targets+=(test_layer_backward_gpu orthros)
  cmake --build build -j2 --target "${targets[@]}"
  cp build/bench/gpu/bench_attention_backward_gpu $C/bench_attention_backward_gpu_$v
  cp build/verify/gpu/test_attention_backward_gpu $C/test_attention_backward_gpu_$v
  if [ "$v" = bulk ]; then
    cp build/verify/gpu/test_layer_backward_gpu $C/test_layer_backward_gpu_bulk
    cp build/verify/cli/orthros $C/orthros_bulk
  fi
  strip $C/*_$v
  echo "$v: $* on $(git rev-parse --short HEAD)" >> $C/COMMIT
  git checkout -q -- cuda
}
variant desc desc.patch
variant bulkdesc stats-bulk.patch desc.patch
variant redv4 redv4.patch
variant descredv4 desc.patch redv4.patch
variant bulk stats-bulk.patch
# build/ back to HEAD's kernels.
cmake --build build -j2 --target bench_attention_backward_gpu test_attention_backward_gpu test_layer_backward_gpu orthros
mkdir -p build-xz3
tar -C $C -cf - . | xz -T2 -6 > build-xz3/carry.tar.xz
du -sh $C build-xz3
