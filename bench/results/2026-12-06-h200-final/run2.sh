#!/usr/bin/env bash
# Device call 2 (2026-12-06, eighth session): output row blocks visited in descending order
# (variants.patch, ORTHROS_BWD_OUT_DESC=1: the concurrent CTAs of a head meet on the same Q/dO
# row block) against base; backward only, PT/SFT 8K and 32K, median of 9, the fused dq forced
# ("fused") and the default dispatch, interleaved twice; then desc's backward suite (fused dq
# forced, and default). Carry build-xz2 (base and desc binaries only).
set -uo pipefail
cd "$(dirname "$0")/../../.."
# Its own binaries' folder, so that a warm machine's earlier unpacked carry is not used instead.
export ORTHROS_GPU_BIN=build-cuda-carry-desc
rm -rf "$ORTHROS_GPU_BIN" && mkdir -p "$ORTHROS_GPU_BIN" && tar -xJf build-xz2/carry.tar.xz -C "$ORTHROS_GPU_BIN" || exit 1
source ci/gpu_env.sh
for b in bench_attention_backward_gpu bench_attention_backward_gpu_desc test_attention_backward_gpu_desc; do
  [ -x "$BIN/$b" ] || { echo "missing $BIN/$b"; exit 1; }
done
rc_all=0
L=$OUTDIR/logs; mkdir -p "$L"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat "$BIN/COMMIT"; date -u; } | tee "$OUTDIR/env.txt"
for rep in 1 2; do
  for mode in fused default; do
    for v in base desc; do
      bin=$BIN/bench_attention_backward_gpu; [ $v != base ] && bin=${bin}_$v
      fz=; [ $mode = fused ] && fz=1
      ORTHROS_BWD_FUSED_DQ=$fz timeout 60 "$bin" --backward-only --runs 9 --seq-lens 8192,32768 > "$L/ab_${v}_${mode}_$rep.log" 2>&1
      rc=$?; [ $rc -ne 0 ] && { echo "$v $mode round $rep exit $rc" | tee -a "$OUTDIR/ab.txt"; rc_all=$rc; }
      grep -E "_bwd " "$L/ab_${v}_${mode}_$rep.log" | awk -v b=$v -v m=$mode -v r=$rep '{print r, m, b, $1, $(NF-1)}' | tee -a "$OUTDIR/ab.txt"
    done
  done
done
for fz in 1 ""; do
  ORTHROS_BWD_FUSED_DQ=$fz timeout 60 "$BIN/test_attention_backward_gpu_desc" > "$L/tests_desc$fz.log" 2>&1
  rc=$?; [ $rc -ne 0 ] && rc_all=$rc
  echo "desc suite${fz:+ (fused dq forced)} exit $rc: $(grep -E '^\[  (PASSED|FAILED)' "$L/tests_desc$fz.log" | tr '\n' ' ')" | tee -a "$OUTDIR/ab.txt"
done
tar -C "$OUTDIR" -cJf "$OUTDIR/logs.tar.xz" logs && rm -rf "$L"
exit $rc_all
