#!/usr/bin/env python3
"""Combines bench_attention_gpu's and peers.py's JSON into the issue-4 target table (markdown)."""
import json
import sys


def main(ours_path, peers_path):
    ours = json.load(open(ours_path))
    try:
        peers = json.load(open(peers_path))
    except Exception:
        peers = {"rows": [], "copy_GBps": None}
    o = {(r["name"], "det" in r["shape"].split()): r for r in ours["rows"]}
    p = {(r["name"], r["shape"]): r.get("median_ms") for r in peers["rows"]}

    def pk(name, shape):
        for key in (name, name + "_repkv"):
            if p.get((key, shape)) is not None:
                return p[(key, shape)]
        return None

    bw = ours["copy_GBps"]
    print(f"device: {ours['device']}; copy bandwidth (read+write): ours {bw:.0f} GB/s, "
          f"torch {peers.get('copy_GBps') or float('nan'):.0f} GB/s; median of {ours['runs']} runs\n")
    print("| case | ours fast ms | ours det ms | det cost | % copy BW | peer ms | target | met |")
    print("|---|---|---|---|---|---|---|---|")

    def f(x):
        return "n/a" if x is None else f"{x:.4f}"

    for T, tag in ((32768, "32K"), (131072, "128K")):
        a, d = o.get((f"prefill_T{tag}", False)), o.get((f"prefill_T{tag}", True))
        if not a:
            continue
        ams = a["median_ms"]
        pct = 100 * a["bytes"] / (a["median_ms"] * 1e-3) / 1e9 / bw
        flex, cud = pk("flex_swa_w128", f"T={T}"), pk("sdpa_causal_cudnn", f"T={T}")
        print(f"| prefill T={tag} (T_out=1) | {f(a['median_ms'])} | {f(d and d['median_ms'])} | "
              f"{(d['median_ms'] / a['median_ms']) if d else float('nan'):.2f}x | {pct:.0f}% | flex {f(flex)} / cudnn {f(cud)} | "
              f">=70% BW, >=3x flex, >=100x cudnn | {'yes' if pct >= 70 else 'no'} / "
              f"{'n/a' if flex is None else ('yes' if flex / a['median_ms'] >= 3 else 'no')} ({'' if flex is None else f'{flex / ams:.1f}x'}) / "
              f"{'n/a' if cud is None else ('yes' if cud / a['median_ms'] >= 100 else 'no')} ({'' if cud is None else f'{cud / ams:.0f}x'}) |")
    for B in (1, 16):
        a, d = o.get((f"decode_pair_128K_B{B}", False)), o.get((f"decode_pair_128K_B{B}", True))
        full = o.get((f"decode_fullonly_128K_B{B}", False))
        if not a:
            continue
        ams = a["median_ms"]
        pct = 100 * a["bytes"] / (a["median_ms"] * 1e-3) / 1e9 / bw
        fl = pk("sdpa_decode_flash", f"B={B} L=131072")
        ratio = a["median_ms"] / full["median_ms"] if full else float("nan")
        print(f"| decode pair 128K B={B} | {f(a['median_ms'])} | {f(d and d['median_ms'])} | "
              f"{(d['median_ms'] / a['median_ms']) if d else float('nan'):.2f}x | {pct:.0f}% | sdpa-flash 1 query {f(fl)}; "
              f"ours full-only {f(full and full['median_ms'])} | >=70% BW (K/V), pair <=1.1x full | "
              f"{'yes' if pct >= 70 else 'no'} / {'yes' if ratio <= 1.1 else 'no'} ({ratio:.2f}x ours-full"
              f"{'' if fl is None else f', {ams / fl:.2f}x sdpa'}) |")
    for T, tag in ((8192, "8K"), (32768, "32K")):
        a, d = o.get((f"pt_T{tag}", False)), o.get((f"pt_T{tag}", True))
        if not a:
            continue
        cud = pk("sdpa_causal_cudnn", f"T={T}")
        tf = a["flops"] / (a["median_ms"] * 1e-3) / 1e12
        r = a["median_ms"] / cud if cud else float("nan")
        print(f"| PT forward T={tag} ({tf:.0f} TFLOP/s) | {f(a['median_ms'])} | {f(d and d['median_ms'])} | "
              f"{(d['median_ms'] / a['median_ms']) if d else float('nan'):.2f}x | - | cudnn causal {f(cud)} | <=1.5x cudnn | "
              f"{'yes' if r <= 1.5 else 'no'} ({r:.2f}x) |")
    print("\nall peer rows:")
    for r in peers["rows"]:
        print(f"  {r['name']:28s} {r['shape']:20s} {f(r.get('median_ms'))} {r.get('error', '')}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
