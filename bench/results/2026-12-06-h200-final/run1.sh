#!/usr/bin/env bash
# Device call for issue 20's "Done when" on the H200 (2026-12-06, eighth session): the final
# commit's kernels (cuda/ = c8af6de), all in one call, most important first, each step only if the
# call's time budget (BUDGET seconds, default 560) still holds its time limit:
#   1. the table: our backward benchmark, the backward peers (two processes), ours and cuDNN in one
#      process, our forward benchmark, the forward peers (median of RUNS, default 15);
#   1b. an A/B of the fused dq's Q/dO ring, 2 against 3 stages, and of an L2 prefetch of Q/dO
#       (variants.patch; binaries *_dq2, *_dq3, *_pf1, *_pf2, *_dq3pf1, *_nolse), then the backward
#       suite and the four sanitizers (SanitizerSmall) of dq3 and pf1 with the fused dq forced;
#   2. the GPU tests: backward on five paths, layer backward, verify --grad; forward on both paths,
#      the kernel-family tests, the layer forward, verify --device cuda;
#   3. compute-sanitizer (memcheck, racecheck, initcheck, synccheck): backward SanitizerSmall on three
#      loops, then the forward suite (few draws) on the Hopper path.
# (After the two calls that ran it: the `pack` behind the A/B's sanitizers and the PYTHONPATH
# without a trailing colon were added; call 1's sanitizer logs were therefore not returned, only
# their summary lines in call1/summary.txt.)
# Logs are packed after each step (the device returns 8 files). From the repository root after
# ORTHROS_GPU_BUILD_DIR=build bash ci/gpu_stage.sh and bash ci/gpu_stage_python.sh
# (carry build-xz, build-py312-carry, .whl):   bash bench/results/2026-12-06-h200-final/run1.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
source ci/gpu_steps.sh  # BUDGET, L, rc_all, st, pack, step, gpu_tests, san_bwd, san_fwd
RUNS=${RUNS:-15}
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader
  head -1 "$BIN/COMMIT"; head -1 build-py312-carry/COMMIT; date -u; } | tee "$OUTDIR/env.txt"
source ci/python_package.sh  # orthros_carried_wheels, orthros_python_package
orthros_carried_wheels python3 'nvidia_cudnn_frontend-*.whl'
# STEPS (default "table ab tests san") picks the parts below; "ab" is the A/B with dq3's suite
# and sanitizers.
want() { [[ " ${STEPS:-table ab tests san} " == *" $1 "* ]]; }
# 1. The table.
if want table; then
step bench_bwd_ours 120 "$BIN/bench_attention_backward_gpu" --runs "$RUNS" --json "$L/bench_bwd_ours.json"
step bench_bwd_peers 150 python3 bench/gpu/peers_backward.py --runs "$RUNS" --json "$L/bench_bwd_peers.json"
python3 bench/gpu/summarize_backward.py "$L/bench_bwd_ours.json" "$L/bench_bwd_peers.json" > "$OUTDIR/summary_bwd.md" 2>&1
pack
PKG=$(orthros_python_package build-py312-carry)
PYTHONPATH="$PKG${PYTHONPATH:+:$PYTHONPATH}" LD_LIBRARY_PATH="$PWD/build-py312-carry:$LD_LIBRARY_PATH" PYTHONDONTWRITEBYTECODE=1 \
  step bench_bwd_interleaved 150 python3 bench/gpu/peers_backward_interleaved.py --runs "$RUNS" --json "$L/bench_bwd_interleaved.json"
step bench_fwd_ours 90 "$BIN/bench_attention_gpu" --runs "$RUNS" --json "$L/bench_fwd_ours.json"
step bench_fwd_peers 180 python3 bench/gpu/peers.py --runs "$RUNS" --json "$L/bench_fwd_peers.json"
python3 bench/gpu/summarize.py "$L/bench_fwd_ours.json" "$L/bench_fwd_peers.json" > "$OUTDIR/summary_fwd.md" 2>&1
pack
fi
# 1b. A/B of the fused dq's Q/dO ring and an L2 prefetch (variants.patch): base (2 stages), dq2
# (the patch's shared-memory layout, 2 stages), dq3 (3 stages), pf1 / pf2 (the producer prefetches
# the Q/dO of the row block 1 / 2 ahead into L2), dq3pf1, nolse (diagnostic, wrong gradients: the
# producer loads no lse2/Δ, to time its part); backward only, the fused dq forced,
# PT/SFT 8K and 32K, median of 9, interleaved twice.
want ab && for rep in 1 2; do
  for v in base dq2 dq3 pf1 pf2 dq3pf1 nolse; do
    bin=$BIN/bench_attention_backward_gpu; [ $v != base ] && bin=${bin}_$v
    ORTHROS_BWD_FUSED_DQ=1 step ab_${v}_$rep 60 "$bin" --backward-only --runs 9 --seq-lens 8192,32768
    grep -E "_bwd " "$L/ab_${v}_$rep.log" | awk -v b=$v -v r=$rep '{print r, b, $1, $(NF-1)}' | tee -a "$OUTDIR/ab.txt"
  done
done
pack
# 2. The GPU tests on both paths.
want tests && gpu_tests
if want ab; then
  for v in dq3 pf1; do
    ORTHROS_BWD_FUSED_DQ=1 step tests_bwd_${v}_fused 60 "$BIN/test_attention_backward_gpu_$v"
  done
fi
# 3. The sanitizers.
want san && for variant in "" fused unpiped; do san_bwd san_bwd "$BIN/test_attention_backward_gpu" "$variant"; done
pack
want ab && for v in dq3 pf1; do
  for tool in memcheck racecheck initcheck synccheck; do
    ORTHROS_BWD_FUSED_DQ=1 step san_bwd_${v}_$tool 60 compute-sanitizer --tool $tool --error-exitcode 3 \
      "$BIN/test_attention_backward_gpu_$v" --gtest_filter='*SanitizerSmall*'
  done
done
want ab && pack
want san && san_fwd
rm -rf "${PKG:-}"
st "all steps exit $rc_all"
echo "== A/B (rep, build, row, ms)"; cat "$OUTDIR/ab.txt" 2>/dev/null
cat "$OUTDIR/summary_bwd.md" "$OUTDIR/summary_fwd.md" 2>/dev/null; sed -n '/^| T/,$p' "$L/bench_bwd_interleaved.log" 2>/dev/null
exit $rc_all
