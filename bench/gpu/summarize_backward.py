#!/usr/bin/env python3
"""Markdown table of the backward benchmark: ours vs the peers of the same run.
Usage: summarize_backward.py OURS.json PEERS.json"""
import json
import sys


def main():
    ours = {(r["name"]): r for r in json.load(open(sys.argv[1]))["rows"]}
    try:
        peers = {(r["name"], r["shape"]): r for r in json.load(open(sys.argv[2]))["rows"]}
    except Exception as e:  # peers may have failed entirely
        print(f"(peers unavailable: {e})")
        peers = {}

    def peer(name, T):
        for n in (name, name.replace("_bwd", "_repkv_bwd"), name.replace("_fwd", "_repkv_fwd")):
            r = peers.get((n, f"T={T}"))
            if r and r.get("median_ms"):
                return r["median_ms"], n
        return None, name

    print("| T | ours PT bwd (ms) | det (ms) | det cost | cuDNN window bwd | cuDNN causal bwd | sum | ours / sum | "
          "target 1.0x | first step 1.3x | FA2 causal bwd | ours / FA2 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for T in (8192, 32768):
        tag = f"pt_T{T // 1024}K"
        if tag + "_bwd" not in ours:
            continue
        ms = ours[tag + "_bwd"]["median_ms"]
        det = ours[tag + "_bwd_det"]["median_ms"]
        w, _ = peer("cudnn_window_bwd", T)
        c, _ = peer("sdpa_causal_cudnn_bwd", T)
        fa, _ = peer("sdpa_causal_flash_bwd", T)
        s = (w or 0) + (c or 0) if (w and c) else None
        f = lambda x: f"{x:.3f}" if x else "n/a"
        ratio = ms / s if s else None
        print(f"| {T // 1024}K | {ms:.3f} | {det:.3f} | {det / ms:.2f}x | {f(w)} | {f(c)} | {f(s)} | "
              f"{(f'{ratio:.2f}x' if ratio else 'n/a')} | {('met' if ratio and ratio <= 1.0 else 'missed' if ratio else 'n/a')} | "
              f"{('met' if ratio and ratio <= 1.3 else 'missed' if ratio else 'n/a')} | {f(fa)} | "
              f"{(f'{ms / fa:.2f}x' if fa else 'n/a')} |")


if __name__ == "__main__":
    main()
