#!/usr/bin/env bash
# Device call for issue 20 (2026-12-07, ninth session). Binaries: base (HEAD's kernels, cuda/ =
# c8af6de's) and three variants of the Hopper backward, each built from HEAD plus a patch of this
# folder:
#   bulk     stats-bulk.patch: Δ and lse2 stored [H_kv][rows][group], so a row block's 64 values
#            are contiguous and the Hopper producer loads each with one 256-byte bulk copy;
#   desc     desc.patch: each CTA visits its output row blocks in descending order, so the
#            concurrent CTAs of a head read the same Q/dO row block (and add to the same dq chunk)
#            at about the same time;
#   bulkdesc both;
#   redv4    redv4.patch: the fused dq's consumers add their dQ tile to the float32 accumulator
#            straight from registers (red.global.add.v4.f32, 16 bytes per thread and step) instead
#            of staging it in shared memory for the dq writer's bulk reduction;
#   descredv4 desc and redv4.
# Steps, most important first, each only if the call's budget (BUDGET s, default 560) still holds
# its time limit; STEPS picks them (default "ab vtests table vsan tests san"):
#   ab      backward only, PT/SFT 8K and 32K, median of 9, the default dispatch and the fused dq
#           forced, the six builds interleaved, two rounds;
#   vtests  the variants' backward suites (bulk on the five paths, the others on two), bulk's
#           layer backward and `orthros verify --grad`;
#   table   our backward benchmark for the six builds (median of RUNS, default 15), the backward
#           peers (cuDNN window + causal, FA2), our forward benchmark, the forward peers;
#   vsan    the four sanitizers on the variants' SanitizerSmall;
#   tests   base's GPU tests (run1.sh of 2026-12-06: backward five paths, layer, verify --grad,
#           forward both paths, kernel families, layer forward, verify);
#   san     the four sanitizers on base (backward three loops, forward Hopper path).
# From the repository root, after staging (bench/results/2026-12-07-h200/stage.sh), carry
# build-xz3, .whl and build-py312-carry (ci/gpu_stage_python.sh, without its orthros-cli):
#   bash bench/results/2026-12-07-h200/run.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
# Its own binaries' folder, so that a warm machine's earlier unpacked carry is not used instead.
export ORTHROS_GPU_BIN=build-cuda-carry-0707
if [ ! -x "$ORTHROS_GPU_BIN/bench_attention_backward_gpu_descredv4" ]; then
  rm -rf "$ORTHROS_GPU_BIN" && mkdir -p "$ORTHROS_GPU_BIN" && tar -xJf build-xz3/carry.tar.xz -C "$ORTHROS_GPU_BIN" || exit 1
fi
source ci/gpu_env.sh
source ci/gpu_steps.sh  # BUDGET, L, rc_all, st, pack, step, bwd_suite, gpu_tests, san_bwd, san_fwd
RUNS=${RUNS:-15}
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader
  cat "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
for v in bulk desc bulkdesc redv4 descredv4; do [ -x "$BIN/bench_attention_backward_gpu_$v" ] || { echo "missing the $v build"; exit 1; }; done
source ci/python_package.sh
orthros_carried_wheels python3 'nvidia_cudnn_frontend-*.whl'
want() { [[ " ${STEPS:-ab vtests table vsan tests san} " == *" $1 "* ]]; }
bwd_bin() { [ "$1" = base ] && echo "$BIN/$2" || echo "$BIN/$2_$1"; }
if want ab; then
  for rep in 1 2; do
    for mode in default fused; do
      fz=; [ $mode = fused ] && fz=1
      for v in base bulk desc bulkdesc redv4 descredv4; do
        ORTHROS_BWD_FUSED_DQ=$fz step ab_${v}_${mode}_$rep 60 "$(bwd_bin $v bench_attention_backward_gpu)" --backward-only --runs 9 --seq-lens 8192,32768
        grep -E "_bwd " "$L/ab_${v}_${mode}_$rep.log" | awk -v b=$v -v m=$mode -v r=$rep '{print r, m, b, $1, $(NF-1)}' | tee -a "$OUTDIR/ab.txt"
      done
    done
  done
  pack
fi
# The backward suite of build $1 on path $2 (ci/gpu_steps.sh's bwd_suite).
suite() { bwd_suite tests_bwd_$1_$2 "$(bwd_bin $1 test_attention_backward_gpu)" $2; }
if want vtests; then
  for path in automatic fused generic unpiped serial; do suite bulk $path; done
  for v in desc bulkdesc redv4 descredv4; do for path in automatic fused; do suite $v $path; done; done
  for fused in "" 1; do ORTHROS_BWD_FUSED_DQ=$fused step tests_layer_bwd_bulk$fused 60 "$BIN/test_layer_backward_gpu_bulk"; done
  step verify_grad_bulk_qwen3-8b 60 "$BIN/orthros_bulk" verify --grad --device cuda --config qwen3-8b --seq-len 256
  pack
fi
if want table; then
  for v in base bulk desc bulkdesc redv4 descredv4; do
    step bench_bwd_$v 120 "$(bwd_bin $v bench_attention_backward_gpu)" --runs "$RUNS" --json "$L/bench_bwd_$v.json"
  done
  step bench_bwd_peers 150 python3 bench/gpu/peers_backward.py --runs "$RUNS" --json "$L/bench_bwd_peers.json"
  for v in base bulk desc bulkdesc redv4 descredv4; do
    { echo "== backward, $v"; python3 bench/gpu/summarize_backward.py "$L/bench_bwd_$v.json" "$L/bench_bwd_peers.json" 2>&1; } >> "$OUTDIR/tables.md"
  done
  # Ours and cuDNN's two calls in one process, interleaved (base; the Python package of
  # build-py312-carry, when carried).
  if [ -d build-py312-carry ]; then
    PKG=$(orthros_python_package build-py312-carry)
    PYTHONPATH="$PKG${PYTHONPATH:+:$PYTHONPATH}" LD_LIBRARY_PATH="$PWD/build-py312-carry:$LD_LIBRARY_PATH" PYTHONDONTWRITEBYTECODE=1 \
      step bench_bwd_interleaved 150 python3 bench/gpu/peers_backward_interleaved.py --runs "$RUNS" --json "$L/bench_bwd_interleaved.json"
    rm -rf "$PKG"
  fi
  step bench_fwd_ours 90 "$BIN/bench_attention_gpu" --runs "$RUNS" --json "$L/bench_fwd_ours.json"
  step bench_fwd_peers 180 python3 bench/gpu/peers.py --runs "$RUNS" --json "$L/bench_fwd_peers.json"
  { echo "== forward"; python3 bench/gpu/summarize.py "$L/bench_fwd_ours.json" "$L/bench_fwd_peers.json" 2>&1; } >> "$OUTDIR/tables.md"
  pack
fi
# The sanitizers on build $1's SanitizerSmall, variant $2 (ci/gpu_steps.sh's san_bwd).
sanitize() { san_bwd san_bwd_$1 "$(bwd_bin $1 test_attention_backward_gpu)" "$2"; }
if want vsan; then
  for variant in "" fused; do sanitize bulk "$variant"; sanitize bulkdesc "$variant"; done
  for v in desc redv4 descredv4; do sanitize $v fused; done
  pack
fi
want tests && gpu_tests
if want san; then
  for variant in "" fused unpiped; do sanitize base "$variant"; done
  pack
  san_fwd
fi
st "all steps exit $rc_all"
echo "== A/B (rep, mode, build, row, ms)"; cat "$OUTDIR/ab.txt" 2>/dev/null
cat "$OUTDIR/tables.md" 2>/dev/null; sed -n '/^| T/,$p' "$L/bench_bwd_interleaved.log" 2>/dev/null
exit $rc_all
