#!/usr/bin/env python3
"""The table of ci/gpu_ports.sh: library x suite -> cases passed, and every failure with its tensor,
its error against the SPEC §6 bound and the cause `orthros check --diagnose` names.

    python3 summarize_ports.py PORTS_DIR --libs cudnn flash flex xformers --suites op-tiny-bf16 ...

Reads PORTS_DIR/env.txt, PORTS_DIR/LIB/SUITE.json (check --json), .log (the adapter's self-check
and skips) and .results/skipped.json; prints Markdown.
"""
import argparse
import json
import os
import re


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def convention(log_path):
    try:
        with open(log_path) as f:
            text = f.read()
    except OSError:
        return "-"
    m = re.findall(r"convention found: (.*)", text)
    if m:
        return m[-1].strip()
    return "self-check FAILED" if "self-check] FAILED" in text else "did not run"


def fmt(x):
    return "n/a" if x is None else (f"{x:.2e}" if isinstance(x, (int, float)) else str(x))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--libs", nargs="+", required=True)
    ap.add_argument("--suites", nargs="+", required=True)
    a = ap.parse_args()
    env = open(os.path.join(a.dir, "env.txt")).read().strip() if os.path.exists(os.path.join(a.dir, "env.txt")) else ""
    print("## Measured: library x suite\n")
    if env:
        print("```\n" + env + "\n```\n")
    print("| library | suite | passed | failed | skipped | convention found by the self-check |")
    print("|---|---|---|---|---|---|")
    failures, skips = [], []
    for lib in a.libs:
        for s in a.suites:
            base = os.path.join(a.dir, lib, s)
            rep = load(base + ".json")
            conv = convention(base + ".log")
            if rep is None or "cases" not in rep:
                why = f"adapter exit {rep['adapter_exit']}" if rep and "adapter_exit" in rep else "no report"
                print(f"| {lib} | {s} | - | - | - | {conv} ({why}) |")
                continue
            skipped = load(os.path.join(base + ".results", "skipped.json")) or {}
            print(f"| {lib} | {s} | {rep['passed']} | {rep['failed']} | {rep['skipped']} | {conv} |")
            for name, why in skipped.items():
                skips.append(f"- {lib} / {s} / `{name}`: {why}")
            for c in rep["cases"]:
                if c["status"] != "fail":
                    continue
                if c.get("error"):
                    failures.append(f"- {lib} / {s} / `{c['name']}`: {c['error']}")
                    continue
                bad = [t for t in c["tensors"] if not t["pass"]]
                parts = []
                for t in bad:
                    parts.append(f"`{t['name']}` max_abs {fmt(t['max_abs'])} vs bound {fmt(t['abs_tol'])}"
                                 f" (rel {fmt(t['rel_err'])} vs {fmt(t['rel_tol'])}; rows t = "
                                 f"{', '.join(str(p) for p in t['bad_positions'][:8])}"
                                 f"{', ...' if t['bad_row_count'] > 8 else ''})")
                d = c.get("diagnosis") or {}
                cause = d.get("cause")
                if cause:
                    diag = f"cause: **{cause}**" + (f" (also {', '.join(m for m in d['matches'] if m != cause)})"
                                                     if len(d.get("matches", [])) > 1 else "")
                elif d.get("fits"):
                    f0 = d["fits"][0]
                    diag = f"no known mistake matches (closest {f0['id']}, {f0['worst_ratio']:.3g}x its bound)"
                else:
                    diag = d.get("note", "not diagnosed")
                failures.append(f"- {lib} / {s} / `{c['name']}`: {'; '.join(parts)}; {diag}")
    print("\n### Failures\n")
    print("\n".join(failures) if failures else "none")
    print("\n### Cases skipped (what the library said, or raised)\n")
    print("\n".join(skips) if skips else "none")


if __name__ == "__main__":
    main()
