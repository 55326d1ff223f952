"""Summarizes Nsight Compute's SASS source view (ncu --page source --csv --print-source sass):
the share of warp stall samples by opcode, by execution count (which code path) and the top
instructions with their main stall reason.  python3 stall_table.py src.csv"""
import collections
import csv
import sys

rows = list(csv.reader(open(sys.argv[1])))
# The export starts with the kernel's name row(s); the header is the first row naming "Source".
start = next(i for i, r in enumerate(rows) if "Source" in r)
rows = rows[start:]
hdr = rows[0]
col = {h: i for i, h in enumerate(hdr)}
total_col = next((i for i, h in enumerate(hdr) if h.startswith("Warp Stall Sampling (All")), None)
exec_col = next((i for i, h in enumerate(hdr) if h.startswith("Instructions Executed")), None)
src_col = col.get("Source")
addr_col = next((i for i, h in enumerate(hdr) if "Address" in h), 0)
# Per-reason columns of all samples ("stall_x"); "stall_x (Not Issued)" counts a subset of them.
reason_cols = [i for i, h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]
if total_col is None or src_col is None:
    print("columns:", hdr)
    sys.exit(1)


def num(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0


data = [r for r in rows[1:] if len(r) == len(hdr)]
tot = sum(num(r[total_col]) for r in data) or 1.0
print(f"total stall samples {tot:.0f}; reason columns: {len(reason_cols)}")
by_op = collections.Counter()
by_exec = collections.Counter()
by_reason = collections.Counter()
for r in data:
    v = num(r[total_col])
    op = r[src_col].split()
    op = [t for t in op if not t.startswith("@")]
    by_op[op[0] if op else "?"] += v
    by_exec[int(num(r[exec_col])) if exec_col is not None else 0] += v
    for i in reason_cols:
        by_reason[hdr[i]] += num(r[i])
print("share of stall samples by opcode:")
for k, v in by_op.most_common(18):
    print(f"  {k:32s} {v / tot * 100:5.1f}%")
print("by stall reason:")
rt = sum(by_reason.values()) or 1.0
for k, v in by_reason.most_common(14):
    print(f"  {k:40s} {v / rt * 100:5.1f}%")
print("by executions per instruction (code path):")
for k, v in by_exec.most_common(6):
    print(f"  {k:>12d} {v / tot * 100:5.1f}%")
print("top instructions:")
data.sort(key=lambda r: -num(r[total_col]))
for r in data[:30]:
    main = max(reason_cols, key=lambda i: num(r[i])) if reason_cols else None
    why = hdr[main] if main is not None else ""
    ex = int(num(r[exec_col])) if exec_col is not None else 0
    print(f"{num(r[total_col]) / tot * 100:5.1f}% {r[addr_col][-5:]} {r[src_col][:70]:70s} {why} execs={ex}")
