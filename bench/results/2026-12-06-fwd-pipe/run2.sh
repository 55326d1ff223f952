#!/usr/bin/env bash
# Device call 2 (2026-12-06, third session): two experiments on top of the pipelined fast mode,
# switched by ORTHROS_FWD_EXP (bit 0: the deterministic mode's turn ring in the fast mode too;
# bit 1: the softmax scaling folded into the exponent's FMA). Kernel-family suite with EXP 0 and 1
# (the ring must keep the bits); A/B of base (23b1719), EXP 0..3, interleaved, three times; Nsight
# Compute on one PT 32K fast-mode launch. From the repository root, after
# cp <old bench_attention_gpu> build-cuda-carry/bench_attention_gpu_base and
# ORTHROS_GPU_BUILD_DIR=build bash ci/gpu_stage.sh:
#   bash bench/results/2026-12-06-fwd-pipe/run2.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
RUNS=${RUNS:-9}
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; cat "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
t0=$SECONDS
st() { echo "[$((SECONDS - t0)) s] $*"; }
for e in 0 1; do
  st "kernel-family suite, ORTHROS_FWD_EXP=$e"
  ORTHROS_FWD_EXP=$e timeout 100 "$BIN/test_attention_kernels_gpu" > "$OUTDIR/kernels_exp$e.log" 2>&1
  echo "exit $?"; grep -E "FAILED|PASSED|Failure" "$OUTDIR/kernels_exp$e.log" | head -6
done
st "A/B"
: > "$OUTDIR/ab.txt"
for rep in 1 2 3; do
  for cfg in base 0 1 2 3; do
    bin=bench_attention_gpu; [ $cfg = base ] && bin=bench_attention_gpu_base
    for only in prefill_T pt_T; do
      ORTHROS_FWD_EXP=$cfg timeout 60 "$BIN/$bin" --runs "$RUNS" --only $only > "$OUTDIR/b.log" 2>&1 || echo "bench exit $?"
      grep -E "^(prefill|pt)_T[0-9]+K +B" "$OUTDIR/b.log" | grep -v generic \
        | awk -v c=$cfg -v r=$rep '{print "rep", r, "cfg", c, $1, $(NF-4), $(NF-3)}' >> "$OUTDIR/ab.txt"
    done
  done
done
python3 - "$OUTDIR/ab.txt" <<'PY'
import sys, collections
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    d[(f[4], f[5], f[3])].append(float(f[6]))
cfgs = ["base", "0", "1", "2", "3"]
print("case mode | " + " | ".join(f"cfg {c}" for c in cfgs) + "   (min of 3 medians, ms)")
for case in sorted({(k[0], k[1]) for k in d}):
    print(case[0], case[1], "|", " | ".join(f"{min(d[(case[0], case[1], c)]):.4f}" if d[(case[0], case[1], c)] else "-" for c in cfgs))
PY
st "Nsight Compute, PT 32K fast mode"
log="$OUTDIR/ncu_fwd.txt"
timeout 200 ncu --clock-control none --kernel-name "regex:hopper_attn_kernel" --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
  --section LaunchStats --section ComputeWorkloadAnalysis \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active" \
  "$BIN/bench_attention_gpu" --runs 1 --only pt_T32K > "$log" 2>&1
echo "ncu exit $?"
grep -E "issue_stalled" "$log" | awk '$NF+0 >= 0.05' | sed 's/  */ /g'
grep -E "gmma|pipe_shared|inst_executed|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Issue Slots Busy|No Eligible|Eligible Warps|Registers Per Thread|Shared Memory Configuration Size|Block Size|Grid Size" "$log" \
  | sed 's/  */ /g' | head -30
st done
