#!/usr/bin/python3
"""Turns the complexity benchmarks' Google Benchmark JSON into PNGs (docs/performance.md).

CPU (bench/cpu, orthros_bench_cpu):
  <cpu-prefix>-latency.png   latency vs T on log-log axes: Orthros prefill / PT / decode pair vs full
                             causal attention of the same shapes, with T^1 and T^2 guide lines
  <cpu-prefix>-streams.png   the two streams and the layer: SWA stream vs T, cross stream vs T_out*T,
                             projections and the whole layer vs T
  <cpu-prefix>-speedup.png   full-attention time / Orthros time for prefill, PT and decode
GPU (bench/gpu_complexity, orthros_bench_gpu), only when --gpu is given and the file exists:
  <gpu-prefix>-latency.png   prefill (and its deterministic mode) vs full causal attention, 8K..1M
  <gpu-prefix>-efficiency.png  achieved fraction of the measured HBM bandwidth (gpu/copy_d2d of the
                             same run) and of the tensor-core rate (gpu/gemm_bf16 of the same run, and
                             the datasheet's dense-bf16 peak, --peak-tflops)
  <gpu-prefix>-speedup.png   the paper's Figure 4 analogue: full causal / Orthros prefill latency vs T
                             (only where both were measured: nothing is extrapolated)

Times: CPU points use the minimum CPU time over repetitions (single thread, see
check_complexity.py); GPU points use the median of the CUDA-event (manual) times.
Needs matplotlib + numpy: run with Debian's /usr/bin/python3.
"""
import argparse
import json
import os
import re
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

UNIT = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def save(fig, prefix, name):
    """Writes `fig` to PREFIX-NAME.png, closes it and returns the path."""
    fig.tight_layout()
    out = f"{prefix}-{name}.png"
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def load(path, field, stat):
    """family -> sorted list of dict(N, args, time[s], counters...) (one per point, aggregated).
    `path` may be a list of JSON files (e.g. a sweep split in two runs): their runs are merged and
    the first file's context is kept."""
    paths = path if isinstance(path, (list, tuple)) else [path]
    data, benchmarks = None, []
    for pth in paths:
        with open(pth) as f:
            d = json.load(f)
        data = data or d
        benchmarks += d["benchmarks"]
    groups = defaultdict(lambda: defaultdict(list))
    for b in benchmarks:
        if b.get("run_type") != "iteration" or b.get("error_occurred"):
            continue
        fam = re.split(r"/[A-Za-z_]+:", b["name"], maxsplit=1)[0]
        groups[fam][b.get("run_name", b["name"])].append(b)
    out = {}
    for fam, runs in groups.items():
        pts = []
        for run, reps in runs.items():
            args = {k: int(v) for k, v in re.findall(r"([A-Za-z_]+):(\d+)", run)}
            t = stat([r[field] * UNIT[r.get("time_unit", "ns")] for r in reps])
            real = float(np.median([r["real_time"] * UNIT[r.get("time_unit", "ns")] for r in reps]))
            p = dict(run=run, args=args, N=int(reps[0].get("complexity_n") or 0) or int(np.prod(list(args.values()))),
                     time=float(t))
            # rates are per real (or manual) second: convert to per-iteration amounts, then to rates of `time`
            for key in ("FLOP/s", "bytes_per_second"):
                if key in reps[0]:
                    p[key + "_amount"] = float(np.median([r[key] for r in reps])) * real
            for key in ("pairs", "T", "T_out", "P", "B"):
                if key in reps[0]:
                    p[key] = reps[0][key]
            pts.append(p)
        pts.sort(key=lambda p: (p["N"], p["run"]))
        out[fam] = pts
    # a family's long tail registered separately (e.g. gpu/full_causal_out_long) joins its family
    for fam in [f for f in out if f.endswith("_long")]:
        base = fam[: -len("_long")]
        out[base] = sorted(out.get(base, []) + out.pop(fam), key=lambda p: (p["N"], p["run"]))
    return data, out


def xy(pts, key="N"):
    return np.array([p[key] if key in p else p["args"][key] for p in pts], float), np.array([p["time"] for p in pts])


def slope(x, y):
    if len(x) < 2:
        return float("nan")
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def guide(ax, x, y0, x0, power, label):
    xs = np.array([x.min(), x.max()], float)
    ax.plot(xs, y0 * (xs / x0) ** power, ":", color="gray", lw=1)
    ax.annotate(label, (xs[-1], y0 * (xs[-1] / x0) ** power), color="gray", fontsize=8)


def loglog_panel(ax, fams, series, xlabel, title, guides=True):
    plotted = []
    for fam, label, style in series:
        pts = fams.get(fam)
        if not pts:
            continue
        x, y = xy(pts)
        ax.loglog(x, y * 1e3, style, label=f"{label} (slope {slope(x, y):.2f})", base=2)
        plotted.append((x, y))
    if guides and plotted:
        x, y = plotted[0]
        guide(ax, x, y[0] * 1e3, x[0], 1, "∝ N")
        guide(ax, x, y[0] * 1e3, x[0], 2, "∝ N²")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("time per call (ms)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def machine_line(data, gpu=False):
    c = data.get("context", {})
    if gpu:
        return (f"{c.get('gpu', '?')} ({c.get('gpu_sms', '?')} SMs), CUDA runtime {c.get('cuda_runtime', '?')}, "
                f"{c.get('date', '')[:10]}; {c.get('shape', '')}")
    return (f"{c.get('host_name', '?')}: {c.get('num_cpus', '?')} CPUs @ {c.get('mhz_per_cpu', '?')} MHz, "
            f"OMP threads {c.get('omp_max_threads', '?')}, {c.get('date', '')[:10]}; {c.get('shape', '')}")


def plot_cpu(path, prefix):
    data, f = load(path, "cpu_time", np.min)
    made = []
    fig, axs = plt.subplots(1, 3, figsize=(15, 4.6))
    loglog_panel(axs[0], f, [("op/prefill", "Orthros prefill (T_out=1)", "o-"),
                             ("full/prefill", "full causal, same shape (w ≥ T)", "s--")], "T", "Prefill")
    loglog_panel(axs[1], f, [("op/pt", "Orthros PT (T_out=T)", "o-"),
                             ("full/pt", "full causal attention", "s--")], "T", "Pre-training forward")
    loglog_panel(axs[2], f, [("op/decode", "Orthros decode pair", "o-"),
                             ("full/decode", "full-attention decode query", "s--")], "cache length N",
                 "Decode step")
    fig.suptitle("CPU oracle, operator level: latency vs length\n" + machine_line(data), fontsize=9)
    made.append(save(fig, prefix, "latency"))

    fig, axs = plt.subplots(1, 3, figsize=(15, 4.6))
    loglog_panel(axs[0], f, [("op/swa_stream", "SWA stream (T_out=0, w=128)", "o-"),
                             ("op/sft_tout64", "SFT, T_out=64", "^-")], "T", "Base stream and SFT")
    pts = f.get("op/cross_stream", [])
    if pts:
        ax = axs[1]
        by_tout = defaultdict(list)
        for p in pts:
            by_tout[p["args"]["T_out"]].append(p)
        for tout, ps in sorted(by_tout.items()):
            x = np.array([p["N"] for p in ps], float)
            y = np.array([p["time"] for p in ps])
            ax.loglog(x, y * 1e3, "o-", base=2, label=f"T_out={tout} (slope {slope(x, y):.2f})")
        x, y = xy(pts)
        ax.set_xlabel("N = T_out · T")
        ax.set_ylabel("time per call (ms)")
        ax.set_title(f"Cross (output) stream, all points slope {slope(x, y):.2f}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    loglog_panel(axs[2], f, [("layer/projection", "one projection x·W (d=256)", "o-"),
                             ("layer/prefill", "layer prefill", "^-"),
                             ("layer/pt", "layer PT", "s--"),
                             ("layer/decode", "layer decode step (x: N)", "d-")], "T (or N)", "Layer level")
    fig.suptitle("CPU oracle: streams and layer\n" + machine_line(data), fontsize=9)
    made.append(save(fig, prefix, "streams"))

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for o, full, label in (("op/prefill", "full/prefill", "prefill"), ("op/pt", "full/pt", "PT"),
                           ("op/decode", "full/decode", "decode step")):
        a = {p["N"]: p["time"] for p in f.get(o, [])}
        b = {p["N"]: p["time"] for p in f.get(full, [])}
        ns = sorted(set(a) & set(b))
        if ns:
            ax.semilogx(ns, [b[n] / a[n] for n in ns], "o-", base=2, label=label)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xlabel("T (decode: cache length N)")
    ax.set_ylabel("full causal time / Orthros time")
    ax.set_title("CPU oracle: speedup of Orthros over full attention\n" + machine_line(data), fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    made.append(save(fig, prefix, "speedup"))
    return made


def plot_gpu(path, prefix, peak_tflops):
    data, f = load(path, "real_time", np.median)  # manual time is reported as real_time
    made = []
    fig, axs = plt.subplots(1, 2, figsize=(14, 5.2))
    loglog_panel(axs[0], f, [("gpu/prefill", "Orthros prefill", "o-"),
                             ("gpu/prefill_det", "Orthros prefill, deterministic", "x-"),
                             ("gpu/swa_stream", "SWA stream alone", "^-"),
                             ("gpu/full_prefill", "full causal, w ≥ T mode", "s--"),
                             ("gpu/full_causal_out", "full causal, output stream T_out=T", "d--"),
                             ("gpu/pt", "Orthros PT", "v-")], "T", "Prefill / PT vs full causal (slope: all points)")
    loglog_panel(axs[1], f, [("gpu/decode_pair_b1", "decode pair, B=1", "o-"),
                             ("gpu/decode_pair_det_b1", "decode pair, B=1, deterministic", "x-"),
                             ("gpu/full_decode_b1", "full-attention decode query, B=1", "s--"),
                             ("gpu/decode_pair_b16", "decode pair, B=16", "^-"),
                             ("gpu/full_decode_b16", "full-attention decode query, B=16", "d--")], "cache length N",
                 "Decode step (slope: all points; B=1 is launch/latency-bound below ~128K)")
    fig.suptitle("GPU latency vs length, median of repetitions\n" + machine_line(data, True), fontsize=9)
    made.append(save(fig, prefix, "latency"))

    copy = f.get("gpu/copy_d2d", [])
    gemm = f.get("gpu/gemm_bf16", [])
    bw = copy[0]["bytes_per_second_amount"] / copy[0]["time"] if copy else None
    tc = gemm[0]["FLOP/s_amount"] / gemm[0]["time"] if gemm else None
    fig, axs = plt.subplots(1, 2, figsize=(13, 4.8))
    for fam, label in (("gpu/prefill", "prefill"), ("gpu/prefill_det", "prefill (det.)"),
                       ("gpu/swa_stream", "SWA stream"), ("gpu/decode_pair_b1", "decode pair B=1"),
                       ("gpu/decode_pair_b16", "decode pair B=16"), ("gpu/full_decode_b1", "full decode B=1"),
                       ("gpu/pt", "PT"), ("gpu/full_causal_out", "full causal")):
        pts = f.get(fam, [])
        if not pts:
            continue
        x = np.array([p["N"] for p in pts], float)
        if bw and all("bytes_per_second_amount" in p for p in pts):
            axs[0].semilogx(x, [p.get("bytes_per_second_amount", 0) / p["time"] / bw for p in pts], "o-", base=2,
                            label=label)
        fl = np.array([p.get("FLOP/s_amount", 0) / p["time"] for p in pts])
        if fam.startswith("gpu/decode") or fam.startswith("gpu/full_decode"):
            continue  # memory-bound: its tensor-core fraction is ~1-2 %, shown in the bandwidth panel only
        line, = axs[1].semilogx(x, 100 * fl / (peak_tflops * 1e12), "o-", base=2, label=label + " / datasheet")
        if tc:
            axs[1].semilogx(x, 100 * fl / tc, "x:", base=2, color=line.get_color(), label=label + " / measured GEMM")
    axs[0].set_title(f"fraction of measured HBM bandwidth ({bw / 1e12:.2f} TB/s d2d copy)" if bw else
                     "no gpu/copy_d2d in this run", fontsize=9)
    axs[0].set_ylabel("compulsory bytes/s ÷ copy bytes/s")
    axs[0].set_ylim(bottom=0)
    axs[1].set_title(f"fraction of tensor-core rate (datasheet {peak_tflops:.0f} TFLOP/s"
                     + (f", measured GEMM {tc / 1e12:.0f} TFLOP/s)" if tc else ")"), fontsize=9)
    axs[1].set_ylabel("% of peak: FLOP/s (4·D per pair per head) ÷ peak")
    axs[1].set_ylim(bottom=0)
    for ax in axs:
        ax.set_xlabel("T (decode: cache length N)")
        ax.grid(True, which="both", alpha=0.3)
    axs[0].legend(fontsize=7)
    axs[1].legend(fontsize=6, ncol=2, loc="lower right")
    fig.suptitle(machine_line(data, True), fontsize=8)
    made.append(save(fig, prefix, "efficiency"))

    fig, ax = plt.subplots(figsize=(7, 4.6))
    a = {p["N"]: p["time"] for p in f.get("gpu/prefill", [])}
    for i, (full, label) in enumerate((("gpu/full_causal_out", "vs full causal (output stream, T_out=T)"),
                                       ("gpu/full_prefill", "vs full causal (w ≥ T mode)"))):
        b = {p["N"]: p["time"] for p in f.get(full, [])}
        ns = sorted(set(a) & set(b))
        if ns:
            ax.loglog(ns, [b[n] / a[n] for n in ns], "o-" if i == 0 else "s--", base=2, label=label)
            for n in ns if i == 0 else []:
                ax.annotate(f"{b[n] / a[n]:.1f}×", (n, b[n] / a[n]), fontsize=7, textcoords="offset points",
                            xytext=(0, 5))
    ax.set_xlabel("prompt length T")
    ax.set_ylabel("full attention latency / Orthros prefill latency")
    ax.set_title("Prefill attention speedup on one GPU (paper Figure 4 analogue)\n"
                 + machine_line(data, True).replace("; ", "\n"), fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    made.append(save(fig, prefix, "speedup"))
    return made


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", help="orthros_bench_cpu JSON")
    ap.add_argument("--gpu", nargs="+", help="orthros_bench_gpu JSON file(s), merged (missing ones are skipped "
                    "with a note; no GPU plots when none exists)")
    ap.add_argument("--cpu-prefix", help="output path prefix for CPU PNGs (default: the JSON path without .json)")
    ap.add_argument("--gpu-prefix", help="output path prefix for GPU PNGs (default: the JSON path without .json)")
    ap.add_argument("--peak-tflops", type=float, default=989.0,
                    help="datasheet dense bf16 tensor-core peak, TFLOP/s (H100/H200 SXM: about 989)")
    a = ap.parse_args()
    made = []
    if a.cpu:
        made += plot_cpu(a.cpu, a.cpu_prefix or os.path.splitext(a.cpu)[0])
    if a.gpu:
        found = [g for g in a.gpu if os.path.exists(g)]
        for g in a.gpu:
            if g not in found:
                print(f"[plot] no GPU JSON at {g}: skipped")
        if found:
            made += plot_gpu(found, a.gpu_prefix or os.path.splitext(found[0])[0], a.peak_tflops)
        else:
            print("[plot] no GPU JSON: GPU plots skipped (run bench/scripts/gpu_complexity.sh on the device first)")
    if not made and not a.gpu:
        ap.error("give --cpu and/or --gpu")
    for m in made:
        print("[plot] wrote", m)
    return 0


if __name__ == "__main__":
    sys.exit(main())
