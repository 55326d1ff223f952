#!/usr/bin/env bash
# Device call 7 (2026-12-06, third session): the suites the softmax change touches that calls 1-6
# did not run: the forward suite on the generic kernels (ORTHROS_TEST_KERNEL=generic: the mma.sync
# kernel shares online_softmax_scores), the backward suite on the generic path and with the fused
# dq, the layer backward, context parallelism on one GPU, and orthros verify --grad. From the
# repository root, after ORTHROS_GPU_BUILD_DIR=build bash ci/gpu_stage.sh:
#   bash bench/results/2026-12-06-fwd-pipe/run7.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; cat "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
t0=$SECONDS
st() { echo "[$((SECONDS - t0)) s] $*"; }
run() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" > "$OUTDIR/$name.log" 2>&1
  echo "$name exit $?: $(grep -E 'PASSED|FAILED|PASS:|FAIL' "$OUTDIR/$name.log" | head -4 | tr '\n' ' ')"
}
st "forward suite, generic kernels"
ORTHROS_TEST_KERNEL=generic RC_PARAMS=max_success=40 run fwd_generic 150 "$BIN/test_attention_gpu"
st "backward suite: generic path; fused dq"
ORTHROS_TEST_KERNEL=generic run bwd_generic 150 "$BIN/test_attention_backward_gpu"
ORTHROS_BWD_FUSED_DQ=1 run bwd_fused 150 "$BIN/test_attention_backward_gpu"
st "layer backward, context parallelism (one GPU), orthros verify --grad"
run layer_bwd 150 "$BIN/test_layer_backward_gpu"
run cp 150 "$BIN/test_context_parallel_gpu"
run verify_grad 150 "$BIN/orthros" verify --grad --device cuda --config qwen3-8b --seq-len 600
st done
