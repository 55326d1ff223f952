#!/usr/bin/env bash
# Device call 2 (2026-12-06, fifth session). fe589b8's kernels (bench_attention_backward_gpu_base):
# the SM clock and board power while our PT 32K backward runs back to back (--backward-only) and
# while cuDNN's causal backward does (clock_probe.py), from nvidia-smi samples every 20 ms; the
# per-SASS stall table of the fused kernel at PT 32K (Nsight Compute source view). The new build
# (lse2 and Δ in per-thread order, lse2 read in pairs): the backward suite on five paths, then A/B
# against the base binary, interleaved, PT/SFT 8K and 32K, twice.
#   bash bench/results/2026-12-06-bwd-profile/run2.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
source ci/gpu_env.sh
here=bench/results/2026-12-06-bwd-profile
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader; head -1 "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,noheader -lms 20 \
  > /tmp/clk.csv 2>&1 &
smi=$!
sleep 1
a=$(date +%s.%N)
timeout 120 "$BIN/bench_attention_backward_gpu_base" --backward-only --runs 40 --seq-lens 32768 2>&1 | grep -E "_bwd " | tee "$OUTDIR/ours.txt"
b=$(date +%s.%N)
sleep 1
timeout 200 python3 $here/clock_probe.py 40 2>&1 | grep -v Warn | tee "$OUTDIR/cudnn.txt"
c=$(date +%s.%N)
sleep 0.5; kill $smi
python3 - "$a" "$b" "$(grep -o 'window [0-9.]* [0-9.]*' "$OUTDIR/cudnn.txt")" <<'PY' | tee "$OUTDIR/clocks.txt"
import sys, datetime, statistics
a, b = float(sys.argv[1]), float(sys.argv[2])
_, c0, c1 = sys.argv[3].split()
c0, c1 = float(c0), float(c1)
rows = []
for line in open("/tmp/clk.csv"):
    f = [x.strip() for x in line.split(",")]
    try:
        t = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc).timestamp()
        rows.append((t, float(f[1].split()[0]), float(f[2].split()[0]), f[3], f[4]))
    except Exception:
        pass
def summ(name, t0, t1):
    s = [r for r in rows if t0 <= r[0] <= t1 and r[2] > 200]
    if not s:
        print(name, "no busy samples", len(rows)); return
    print(f"{name}: {len(s)} samples, SM clock median {statistics.median(r[1] for r in s):.0f} MHz "
          f"(min {min(r[1] for r in s):.0f}), power median {statistics.median(r[2] for r in s):.0f} W, "
          f"temp {s[-1][3]} C, reasons {sorted(set(r[4] for r in s))}")
summ("ours (bench, PT then SFT 32K)", a, b)
summ("cuDNN causal bwd 32K", c0, c1)
PY
rep=/tmp/fused32k
timeout 120 ncu --clock-control none --kernel-name "regex:hopper_bwd_kernel" --launch-skip 1 --launch-count 1 \
  --section WarpStateStats --section SourceCounters --import-source no -o $rep -f \
  "$BIN/bench_attention_backward_gpu_base" --backward-only --runs 1 --seq-lens 32768 > /tmp/ncu_run.log 2>&1
echo "ncu exit $?"
ncu --import $rep.ncu-rep --page source --csv --print-source sass > /tmp/src.csv 2>/dev/null
python3 $here/stall_table.py /tmp/src.csv > "$OUTDIR/ncu_source_top.txt" 2>&1
head -60 "$OUTDIR/ncu_source_top.txt" | cut -c1-160
t0=$SECONDS
st() { echo "[$((SECONDS - t0)) s] $*"; }
for path in automatic generic fused unpiped serial; do
  kernel=automatic fused= pipe= concurrent=
  case $path in generic) kernel=generic ;; fused) fused=1 ;; unpiped) pipe=0 ;; serial) concurrent=0 ;; esac
  ORTHROS_TEST_KERNEL=$kernel ORTHROS_BWD_FUSED_DQ=$fused ORTHROS_BWD_PIPE=$pipe ORTHROS_BWD_CONCURRENT=$concurrent \
    timeout 100 "$BIN/test_attention_backward_gpu" > /tmp/t_$path.log 2>&1
  st "backward tests ($path) exit $?: $(grep -E '^\[  (PASSED|FAILED)' /tmp/t_$path.log | tr '\n' ' ')" | tee -a "$OUTDIR/tests_summary.txt"
  grep -E -A4 "Failure" /tmp/t_$path.log | head -12 | tee -a "$OUTDIR/tests_summary.txt"
done
: > "$OUTDIR/ab.txt"
for rep in 1 2; do
  for bin in bench_attention_backward_gpu_base bench_attention_backward_gpu; do
    timeout 100 "$BIN/$bin" --backward-only --runs 15 --seq-lens 8192,32768 2>&1 | grep -E "_bwd " \
      | awk -v b=$bin -v r=$rep '{print "rep", r, b, $1, $(NF-1)}' | tee -a "$OUTDIR/ab.txt"
  done
done
st done
