source ci/gpu_env.sh
rep=$OUTDIR/fused32k
timeout 300 ncu --clock-control none --kernel-name "regex:hopper_bwd_kernel" --launch-skip 1 --launch-count 1 --section SourceCounters --section WarpStateStats --import-source no -o $rep -f $BIN/bench_attention_backward_gpu --backward-only --runs 1 --seq-lens 32768 > $OUTDIR/ncu_run.log 2>&1
echo "ncu exit $?"
ncu --import $rep.ncu-rep --page source --csv --print-source sass > $OUTDIR/src.csv 2>$OUTDIR/src.err
echo "export exit $? lines $(wc -l < $OUTDIR/src.csv)"
head -2 $OUTDIR/src.csv | cut -c1-1500
python3 - $OUTDIR/src.csv <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = rows[0]
print(len(hdr), "columns")
def col(name):
    for i, h in enumerate(hdr):
        if h == name: return i
    return None
cands = [h for h in hdr if "Sampl" in h or "stall" in h.lower()]
print("sample columns:", cands[:40])
si = col("Warp Stall Sampling (All Samples)")
src = col("Source")
if si is not None:
    data = []
    for r in rows[1:]:
        try: data.append((float(r[si].replace(",", "")), r))
        except: pass
    tot = sum(d[0] for d in data)
    data.sort(key=lambda x: -x[0])
    print("total samples", tot)
    for v, r in data[:40]:
        extra = {h: r[i] for i, h in enumerate(hdr) if ("stall_long" in h.lower() or "Long Scoreboard" in h) and r[i] not in ("0", "")}
        print(f"{v / tot * 100:5.1f}%  {r[0][:8]}  {r[src][:90] if src is not None else ''}  {extra}")
PY
