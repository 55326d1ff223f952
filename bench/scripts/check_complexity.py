#!/usr/bin/python3
"""Fits the complexity of the Orthros benchmarks and fails when a fit contradicts the paper.

Runs bench/cpu's `orthros_bench_cpu` (or reads its Google Benchmark JSON) and, per benchmark
family, fits the exponent e of  time ~ N^e  by least squares on log-log axes (over the minimum, or
median, of the repetitions at each N). Google Benchmark's own discrete choice (BigO, RMS) is reported beside
it. The paper's analysis (§3.3; SPEC §2/§4) says:

  op/swa_stream   O(T*w)          -> exponent 1 in T
  op/cross_stream O(T_out*T)      -> exponent 1 in N = T_out*T, and 1 in each of T_out and T
  op/pt           O(T^2)          -> exponent 2        full/pt, full/prefill: 2 (the baseline)
  op/prefill      O(T*w + T)      -> exponent 1        op/sft_tout64 (T_out = 64 fixed): 1
  op/decode       O(w + P)        -> exponent 1        full/decode: 1
  layer/projection, layer/prefill, layer/decode: 1 (projections O(T*d^2) dominate or are linear)

Operator families (op/*, full/*) pass when the fitted exponent rounds to the expected class AND
lies within --tol-model of the exponent predicted by the exact (query, key) pair count over the
same points (PT over T = 256..2048 is not yet asymptotic: its pair count T*w + T^2/2 has a local
exponent of about 1.8, so the measured fit is compared with that, not with a bare 2). Layer
families pass when |fit - expected| <= --tol-layer. layer/pt (projections + quadratic attention)
is reported only.

Times: the fit uses each point's CPU time by default (--time cpu). The programs run one thread
(OMP_NUM_THREADS=1), so CPU time is the work done; wall time on a shared 2-core machine also
counts the time the process waited for a core. --time real fits wall time instead.

Exit status: 0 when every check passes, 1 when one fails, 2 on a usage/run error.
Needs numpy: run it with Debian's /usr/bin/python3.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
from collections import defaultdict

import numpy as np

# family -> (expected exponent class, kind); kind "op" = checked against the pair-count model too
EXPECT = {
    "op/swa_stream": (1, "op"),
    "op/cross_stream": (1, "op"),
    "op/pt": (2, "op"),
    "op/sft_tout64": (1, "op"),
    "op/prefill": (1, "op"),
    "op/decode": (1, "op"),
    "full/pt": (2, "op"),
    "full/prefill": (2, "op"),
    "full/decode": (1, "op"),
    "layer/projection": (1, "layer"),
    "layer/prefill": (1, "layer"),
    "layer/decode": (1, "layer"),
    "layer/pt": (None, "info"),
    # GPU families (bench/gpu_complexity; refit with --json gpu_complexity.json --time real):
    # reported with their expected class, not judged (small T can be launch-bound on a GPU).
    "gpu/prefill": (1, "info"), "gpu/prefill_det": (1, "info"), "gpu/swa_stream": (1, "info"),
    "gpu/full_prefill": (2, "info"), "gpu/full_causal_out": (2, "info"), "gpu/full_causal_out_long": (2, "info"),
    "gpu/pt": (2, "info"), "gpu/decode_pair_b1": (1, "info"), "gpu/decode_pair_det_b1": (1, "info"),
    "gpu/decode_pair_b16": (1, "info"), "gpu/full_decode_b1": (1, "info"), "gpu/full_decode_b16": (1, "info"),
}


def run_binary(binary, out, scale, min_time, reps, filt):
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["ORTHROS_BENCH_SCALE"] = str(scale)
    cmd = [binary, f"--benchmark_out={out}", "--benchmark_out_format=json",
           f"--benchmark_min_time={min_time}", f"--benchmark_repetitions={reps}",
           "--benchmark_report_aggregates_only=false"]
    if filt:
        cmd.append(f"--benchmark_filter={filt}")
    print("[check] running:", " ".join(cmd), f"(OMP_NUM_THREADS={env['OMP_NUM_THREADS']}, "
          f"ORTHROS_BENCH_SCALE={scale})", flush=True)
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL)
    if r.returncode != 0:
        print(f"[check] benchmark binary failed with status {r.returncode}", file=sys.stderr)
        sys.exit(2)


def family_of(name):
    """'op/pt/T:256/real_time' -> 'op/pt'; BigO rows keep their own names."""
    return re.split(r"/[A-Za-z_]+:", name, maxsplit=1)[0]


def args_of(name):
    return {k: int(v) for k, v in re.findall(r"([A-Za-z_]+):(\d+)", name)}


def ls_slopes(logx, logy):
    """Least squares logy = c + sum_i e_i logx_i; returns (e, r2)."""
    A = np.column_stack([np.ones(len(logy))] + list(logx))
    coef, *_ = np.linalg.lstsq(A, logy, rcond=None)
    pred = A @ coef
    ss_res = float(np.sum((logy - pred) ** 2))
    ss_tot = float(np.sum((logy - logy.mean()) ** 2)) or 1e-300
    return coef[1:], 1.0 - ss_res / ss_tot


def load(json_paths):
    """Reads one or more Google Benchmark JSON files (runs merged, first file's context kept). A family
    registered separately for its long tail (e.g. gpu/full_causal_out_long) joins its base family."""
    data, benchmarks = None, []
    for pth in (json_paths if isinstance(json_paths, (list, tuple)) else [json_paths]):
        with open(pth) as f:
            d = json.load(f)
        data = data or d
        benchmarks += d["benchmarks"]
    points = defaultdict(lambda: defaultdict(list))  # family -> run_name -> [rows]
    bigo = {}
    for b in benchmarks:
        name = b["name"]
        if b.get("run_type") == "aggregate":
            agg = b.get("aggregate_name")
            if agg in ("BigO", "RMS"):
                fam = re.split(r"/(?:real|manual)_time", name)[0] if re.search(r"/(?:real|manual)_time", name) \
                    else name.rsplit("_", 1)[0]
                fam = re.sub(r"/iterations:\d+/repeats:\d+$", "", fam)
                fam = re.sub(r"_(BigO|RMS)$", "", fam)
                bigo.setdefault(fam, {})[agg] = b
            continue
        points[family_of(name)][b.get("run_name", name)].append(b)
    for fam in [f for f in points if f.endswith("_long") and f[: -len("_long")] in points]:
        points[fam[: -len("_long")]].update(points.pop(fam))
    return data, points, bigo


TIME_FIELD = "cpu_time"  # set from --time
STAT = np.min  # set from --stat


def to_seconds(b, field=None):
    unit = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b.get("time_unit", "ns")]
    return b[field or TIME_FIELD] * unit


def fit_family(fam, runs):
    """Per point: median real time over repetitions, N, args, work (pairs or FLOPs)."""
    rows = []
    for run_name, reps in runs.items():
        t = float(STAT([to_seconds(r) for r in reps]))
        a = args_of(run_name)
        r0 = reps[0]
        flops = float(np.median([r.get("FLOP/s", 0.0) * to_seconds(r, "real_time") for r in reps]))
        n = int(r0.get("complexity_n", 0)) or math.prod(a.values())
        wall = float(np.median([to_seconds(r, "real_time") for r in reps]))
        rows.append(dict(run=run_name, args=a, N=n, time=t, wall=wall, pairs=float(r0.get("pairs", 0.0)), flops=flops,
                         reps=len(reps)))
    rows.sort(key=lambda r: (r["N"], r["run"]))
    logt = np.log([r["time"] for r in rows])
    res = dict(family=fam, points=rows)
    (e,), r2 = ls_slopes([np.log([r["N"] for r in rows])], logt)
    res["exponent"], res["r2"] = float(e), r2
    work = [r["pairs"] if r["pairs"] > 0 else r["flops"] for r in rows]
    if all(w > 0 for w in work):
        (m,), _ = ls_slopes([np.log([r["N"] for r in rows])], np.log(work))
        res["model_exponent"] = float(m)
    if fam == "op/cross_stream":  # separate exponents in T_out and T
        (a1, a2), r2b = ls_slopes([np.log([r["args"]["T_out"] for r in rows]),
                                   np.log([r["args"]["T"] for r in rows])], logt)
        (m1, m2), _ = ls_slopes([np.log([r["args"]["T_out"] for r in rows]),
                                 np.log([r["args"]["T"] for r in rows])], np.log(work))
        res["exponent_T_out"], res["exponent_T"], res["r2_2d"] = float(a1), float(a2), r2b
        res["model_exponent_T_out"], res["model_exponent_T"] = float(m1), float(m2)
    return res


def judge(res, tol_model, tol_layer):
    exp, kind = EXPECT.get(res["family"], (None, "info"))
    res["expected"] = exp
    reasons = []
    if kind == "info" or exp is None:
        res["verdict"] = "info (not judged)"
        return True
    e = res["exponent"]
    if kind == "op":
        checks = [("N", e, res.get("model_exponent"))]
        if "exponent_T_out" in res:
            checks += [("T_out", res["exponent_T_out"], res["model_exponent_T_out"]),
                       ("T", res["exponent_T"], res["model_exponent_T"])]
        for label, val, model in checks:
            if round(val) != exp:
                reasons.append(f"exponent in {label} {val:.3f} does not round to {exp}")
            if model is not None and abs(val - model) > tol_model:
                reasons.append(f"exponent in {label} {val:.3f} is more than {tol_model} from the pair-count "
                               f"model's {model:.3f}")
    else:
        if abs(e - exp) > tol_layer:
            reasons.append(f"exponent {e:.3f} is more than {tol_layer} from {exp}")
    res["verdict"] = "FAIL: " + "; ".join(reasons) if reasons else "pass"
    return not reasons


def fmt_bigo(b):
    if not b or "BigO" not in b:
        return "-"
    big = b["BigO"]
    rms = b.get("RMS", {})
    c = big.get("big_o", "?")
    rms_v = rms.get("rms", None)
    return f"{c}" + (f" (RMS {100 * rms_v:.0f}%)" if rms_v is not None else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--binary", help="orthros_bench_cpu to run")
    src.add_argument("--json", nargs="+", help="read this Google Benchmark JSON (several: merged) instead of running")
    ap.add_argument("--out", default="check_complexity.json", help="where the binary writes its JSON (with --binary)")
    ap.add_argument("--scale", type=float, default=1.0, help="ORTHROS_BENCH_SCALE for the sweep (smaller = shorter)")
    ap.add_argument("--min-time", type=float, default=0.05, help="--benchmark_min_time per point, seconds")
    ap.add_argument("--repetitions", type=int, default=3, help="repetitions per point (the fit uses the median)")
    ap.add_argument("--filter", default="", help="--benchmark_filter regex")
    ap.add_argument("--tol-model", type=float, default=0.15)
    ap.add_argument("--tol-layer", type=float, default=0.25)
    ap.add_argument("--time", choices=["cpu", "real"], default="cpu",
                    help="which time to fit (default cpu: with OMP_NUM_THREADS=1 the process's CPU time is "
                         "insensitive to being descheduled on a shared machine; real time is printed too)")
    ap.add_argument("--stat", choices=["min", "median"], default="min",
                    help="statistic over the repetitions of a point (default min: interference from other "
                         "processes only ever adds time)")
    ap.add_argument("--range", action="append", default=[], metavar="FAMILY=LO:HI",
                    help="fit FAMILY only over LO <= N <= HI (either bound may be empty); repeatable. For GPU "
                         "families: the range where the GPU is saturated (small N can be launch/latency-bound)")
    ap.add_argument("--judge-gpu", action="store_true",
                    help="judge gpu/* families like operator families (rounds to the class, within --tol-model "
                         "of the pair-count model) instead of reporting them only")
    ap.add_argument("--md", help="also write the fit table as markdown here")
    ap.add_argument("--fits-json", help="also write the fits as JSON here")
    a = ap.parse_args()

    global TIME_FIELD, STAT
    TIME_FIELD = a.time + "_time"
    STAT = np.min if a.stat == "min" else np.median
    path = a.json
    if a.judge_gpu:
        for fam, (exp, kind) in list(EXPECT.items()):
            if fam.startswith("gpu/"):
                EXPECT[fam] = (exp, "op")
    ranges = {}
    for r in a.range:
        fam, _, lohi = r.partition("=")
        lo, _, hi = lohi.partition(":")
        ranges[fam] = (int(lo) if lo else 0, int(hi) if hi else 1 << 62)
    if a.binary:
        run_binary(a.binary, a.out, a.scale, a.min_time, a.repetitions, a.filter)
        path = a.out
    data, points, bigo = load(path)
    if not points:
        print(f"[check] no benchmark runs in {path}", file=sys.stderr)
        return 2

    ok = True
    results = []
    for fam in sorted(points, key=lambda f: (list(EXPECT).index(f) if f in EXPECT else 99, f)):
        runs = points[fam]
        if fam in ranges:
            lo, hi = ranges[fam]
            runs = {k: v for k, v in runs.items()
                    if lo <= (int(v[0].get("complexity_n", 0)) or math.prod(args_of(k).values())) <= hi}
        if len(runs) < 2:  # a single point (e.g. gpu/copy_d2d) has no exponent
            continue
        res = fit_family(fam, runs)
        ok &= judge(res, a.tol_model, a.tol_layer)
        res["gbench_bigo"] = fmt_bigo(bigo.get(fam))
        results.append(res)

    ctx = data.get("context", {})
    lines = []
    try:
        commit = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse", "--short",
                                 "HEAD"], capture_output=True, text=True).stdout.strip() or "?"
    except OSError:
        commit = "?"
    load_avg = ", ".join(f"{x:.1f}" for x in ctx.get("load_avg", []))
    how = "swept" if a.binary else "fits recomputed from " + ", ".join(os.path.basename(p) for p in path)
    lines.append(f"Run {ctx.get('date', '?')}; {how} at commit {commit}.  ")
    lines.append(f"Machine: `{ctx.get('host_name', '?')}`, {ctx.get('num_cpus', '?')} vCPUs @ "
                 f"{ctx.get('mhz_per_cpu', '?')} MHz, caches "
                 + ", ".join(f"L{c['level']} {c['size'] // 1024} KiB" for c in ctx.get("caches", [])
                             if c.get("type") in ("Data", "Unified"))
                 + f"; load average at start {load_avg} (shared with other jobs); OMP max threads "
                 f"{ctx.get('omp_max_threads', '?')}; Google Benchmark library build: "
                 f"{ctx.get('library_build_type', '?')} (Debian's package; the benchmarks are -O3 Release).  ")
    lines.append(f"Shape: {ctx.get('shape', '?')}; FLOPs: {ctx.get('flop_count', '?')}.  ")
    lines.append(f"Fitted time: {TIME_FIELD}, {a.stat} of {max(p['reps'] for r in results for p in r['points'])} "
                 f"repetitions per point.")
    lines.append("")
    lines.append("| family | points (N range) | expected | fitted exponent (LS, log-log) | pair-count model | R² | "
                 "Google Benchmark BigO | verdict |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for r in results:
        ns = [p["N"] for p in r["points"]]
        fitted = f"{r['exponent']:.3f}"
        model = f"{r['model_exponent']:.3f}" if "model_exponent" in r else "-"
        if "exponent_T_out" in r:
            fitted += f" (T_out: {r['exponent_T_out']:.3f}, T: {r['exponent_T']:.3f})"
            model += f" (T_out: {r['model_exponent_T_out']:.3f}, T: {r['model_exponent_T']:.3f})"
        exp = "-" if r["expected"] is None else ("N" if r["expected"] == 1 else f"N^{r['expected']}")
        lines.append(f"| {r['family']} | {len(ns)} ({min(ns)}..{max(ns)}) | {exp} | {fitted} | {model} | "
                     f"{r['r2']:.4f} | {r['gbench_bigo']} | {r['verdict']} |")
    lines.append("")
    lines.append(f"Per point ({TIME_FIELD} = {a.stat} over repetitions; wall = median real time; GFLOP/s per "
                 f"{TIME_FIELD}):")
    lines.append("")
    lines.append("| family | point | N | time (ms) | wall (ms) | GFLOP/s | pairs |")
    lines.append("|---|---|---|---|---|---|---|")
    for r in results:
        for p in r["points"]:
            args = ",".join(f"{k}={v}" for k, v in p["args"].items())
            gf = p["flops"] / p["time"] / 1e9 if p["time"] > 0 else 0.0
            lines.append(f"| {r['family']} | {args} | {p['N']} | {1e3 * p['time']:.3f} | {1e3 * p['wall']:.3f} | "
                         f"{gf:.2f} | {p['pairs']:.0f} |")
    table = "\n".join(lines)
    print(table.split("\n\nPer point")[0])
    if a.md:
        with open(a.md, "w") as f:
            f.write(table + "\n")
    if a.fits_json:
        with open(a.fits_json, "w") as f:
            json.dump({"source": path, "context": ctx, "ok": ok, "fits": results}, f, indent=1)
    print("[check] all fits match the paper's analysis" if ok else "[check] FAILED: a fit contradicts the analysis")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
