#!/usr/bin/env python3
"""Summarizes `orthros check --suite ... --json` reports per tensor (standard library only).

    summarize_checks.py REPORT.json [--label NAME] [--bug] [--append FILE.jsonl]
    summarize_checks.py --table FILE.jsonl        # one Markdown row per (suite, variant)

For one report it prints, per tensor (o, o_out, lse, lse_out and, for a gradient suite, dq,
dq_out, dk, dv): in how many cases it failed, the worst rel_err and max_abs over the cases, and
the worst ratio of each to its bound (a ratio > 1 fails). --append adds the report to a JSON-lines
file as {"label": NAME, "report": ...}; --table prints such a file as a Markdown table.

Exit status: 0, or 1 with --bug (a deliberately broken port) when the report has gradient tensors
and none of them fails: the broken port must be caught in its gradients too.
"""
import argparse
import json
import sys

GRADS = ("dq", "dq_out", "dk", "dv")


def _num(x):
    return float(x) if isinstance(x, (int, float)) else float("inf")  # "nan"/"inf" strings count as worst


def per_tensor(report):
    """dict tensor -> {cases, failed, rel, rel_ratio, abs, abs_ratio, failed_cases}, in report order."""
    out = {}
    for c in report["cases"]:
        for t in c.get("tensors", []):
            s = out.setdefault(t["name"], {"cases": 0, "failed": 0, "rel": 0.0, "rel_ratio": 0.0, "abs": 0.0,
                                           "abs_ratio": 0.0, "failed_cases": []})
            s["cases"] += 1
            if not t["pass"]:
                s["failed"] += 1
                s["failed_cases"].append(c["name"])
            rel, ab = _num(t["rel_err"]), _num(t["max_abs"])
            s["rel"] = max(s["rel"], rel)
            s["abs"] = max(s["abs"], ab)
            s["rel_ratio"] = max(s["rel_ratio"], rel / t["rel_tol"] if t["rel_tol"] else float("inf"))
            if t.get("abs_tol"):
                s["abs_ratio"] = max(s["abs_ratio"], ab / t["abs_tol"])
    return out


def summary_lines(report, label):
    pt = per_tensor(report)
    head = f"{label}: {report['passed']} passed, {report['failed']} failed"
    if report.get("skipped"):
        head += f", {report['skipped']} skipped"
    failing = [n for n, s in pt.items() if s["failed"]]
    head += "; failing tensors: " + (", ".join(f"{n} ({pt[n]['failed']})" for n in failing) if failing else "none")
    lines = [head, f"    {'tensor':8} {'failed':>8} {'worst rel_err':>14} {'/ tol':>8} {'worst max_abs':>14} {'/ tol':>8}"]
    for n, s in pt.items():
        lines.append(f"    {n:8} {s['failed']:>3} / {s['cases']:<3} {s['rel']:14.2e} {s['rel_ratio']:8.3f} "
                     f"{s['abs']:14.2e} {s['abs_ratio']:8.3f}")
    errors = [c["name"] + ": " + c["error"] for c in report["cases"] if c.get("error")]
    lines += ["    error: " + e for e in errors[:5]]
    return lines


def table(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    names = []
    for r in rows:
        for n in per_tensor(r["report"]):
            if n not in names:
                names.append(n)
    print("| suite.variant | result | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for r in rows:
        pt = per_tensor(r["report"])
        cells = []
        for n in names:
            s = pt.get(n)
            if s is None:
                cells.append("")
            elif s["failed"]:
                cells.append(f"**{s['failed']} failed** {s['rel']:.1e} / {s['abs']:.1e}")
            else:
                cells.append(f"{s['rel']:.1e} / {s['abs']:.1e}")
        rep = r["report"]
        print(f"| {r['label']} | {rep['passed']} passed, {rep['failed']} failed | " + " | ".join(cells) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report", nargs="?", help="JSON written by `orthros check --json`")
    ap.add_argument("--label", default=None)
    ap.add_argument("--bug", action="store_true", help="the port is deliberately broken: gradients must fail too")
    ap.add_argument("--append", help="JSON-lines file to add the report to")
    ap.add_argument("--table", help="print a JSON-lines file of reports as a Markdown table")
    a = ap.parse_args()
    if a.table:
        table(a.table)
        return 0
    if not a.report:
        ap.error("give a report (or --table FILE)")
    with open(a.report) as f:
        report = json.load(f)
    label = a.label or a.report
    print("\n".join(summary_lines(report, label)))
    if a.append:
        with open(a.append, "a") as f:
            f.write(json.dumps({"label": label, "report": report}, separators=(",", ":")) + "\n")
    pt = per_tensor(report)
    if a.bug and any(n in pt for n in GRADS) and not any(pt[n]["failed"] for n in GRADS if n in pt):
        print(f"{label}: the broken port passes every gradient tensor: not caught in the gradients", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
