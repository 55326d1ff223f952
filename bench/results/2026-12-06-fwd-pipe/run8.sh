#!/usr/bin/env bash
# Device call 8 (2026-12-06, third session): orthros verify --grad after its op part fixed the
# forward's split count (call 7: at T = 600 the automatic count differs between the batch and the
# single calls, so the bitwise column failed on forward bits, not on the backward). The CI
# script's three configurations and T = 600. From the repository root, after
# ORTHROS_GPU_BUILD_DIR=build bash ci/gpu_stage.sh:
#   bash bench/results/2026-12-06-fwd-pipe/run8.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; cat "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
for cfg in "qwen3-8b 600" "qwen3-8b 256" "llama3.1-8b 200" "tiny 40"; do
  set -- $cfg
  timeout 120 "$BIN/orthros" verify --grad --device cuda --config $1 --seq-len $2 > "$OUTDIR/verify_grad_$1_$2.log" 2>&1
  echo "$1 $2 exit $?: $(grep -E 'ragged|PASS|FAIL' "$OUTDIR/verify_grad_$1_$2.log" | tr -s ' ' | tr '\n' ' ' | cut -c1-300)"
done
