#!/usr/bin/env python3
"""The Orthros PT backward and its peers timed in ONE process, sample by sample in turn, so that a
drift of the GPU's clock (power, temperature) over the run reaches every row alike.

ci/gpu_backward.sh times ours (bench_attention_backward_gpu, C++) and the peers
(peers_backward.py) in two processes, one after the other; this script is the check of the
ratio those two give. Rows, bf16, qwen3-8b attention shape (H_q 32, H_kv 8, D 128), w = 128,
B = 1, PT (T_out = T):
- ours_bwd, ours_bwd_det: orthros._cuda.attention_backward (the C++ library call, preallocated
  outputs and workspace), the fast and the deterministic mode;
- cudnn_window_bwd: cuDNN's sliding-window backward (nvidia-cudnn-frontend,
  window_left = 128 with is_causal, as peers_backward.py), torch.autograd.grad on a retained graph;
- cudnn_causal_bwd: PyTorch SDPA's cuDNN backend, full causal, the same way.
One sample of a row: an L2 flush, a synchronization, then --b2b calls (default 1) between two
CUDA events (peers_common.sample_ms, as peers_backward.py times). Round r times every row once, in
a rotated order (round r starts at row r mod 4). The ratio is median(ours) / (median(window) +
median(causal)), as summarize_backward.py's. Short rows read longer here than in
peers_backward.py: at 8K cuDNN's window backward 1.18 against 0.68 ms on an H100
(bench/results/2026-12-06-bwd-clocks.md; why is not measured), so the table marks rows under 5 ms
when one call makes a sample; --b2b > 1 is the untried remedy.
Needs orthros._cuda on PYTHONPATH: ci/gpu_backward.sh runs it when ci/gpu_stage_python.sh's carry
came along. Usage: peers_backward_interleaved.py [--runs N] [--json FILE] [--quick] [--b2b N]
"""
import json
import statistics
import sys

import torch
import torch.nn.functional as F

import orthros._cuda as C
from bench_torch_ops import Case
from peers_common import CALLS_PER_SAMPLE, HKV, HQ, D, W, parse_args, sample_ms

BF16 = torch.bfloat16


def ours_calls(T):
    """The fast and deterministic backward of one PT sequence of T tokens through the extension
    (bench_torch_ops.Case: packed [T, H, D] inputs, o and lse from our forward)."""
    case = Case(f"PT {T}", 1, 0, T, T, grad=True)
    case.ext()
    return (lambda: case.backward(False)), (lambda: case.backward(True))


def peer_calls(T, seed):
    """cuDNN window and cuDNN causal backward on [1, H, T, D] inputs, GQA without repeating K/V.
    Raises ImportError without nvidia-cudnn-frontend (the window peer)."""
    from cudnn.sdpa.fwd.torch_op import sdpa as cudnn_sdpa
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.manual_seed(seed)
    q = torch.randn(1, HQ, T, D, device="cuda", dtype=BF16).requires_grad_(True)
    k = torch.randn(1, HKV, T, D, device="cuda", dtype=BF16).requires_grad_(True)
    v = torch.randn(1, HKV, T, D, device="cuda", dtype=BF16).requires_grad_(True)
    g = torch.randn(1, HQ, T, D, device="cuda", dtype=BF16)
    out_w, _ = cudnn_sdpa(q, k, v, is_causal=True, window_left=W, return_lse=True)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out_c = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return (lambda: torch.autograd.grad(out_w, (q, k, v), g, retain_graph=True),
            lambda: torch.autograd.grad(out_c, (q, k, v), g, retain_graph=True))


def main():
    args = parse_args()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"hopper kernels: {C.hopper_kernels_available()}, {args.runs} rounds, {CALLS_PER_SAMPLE[0]} call(s) per sample",
          flush=True)
    out = {"device": torch.cuda.get_device_name(), "runs": args.runs, "calls_per_sample": CALLS_PER_SAMPLE[0], "rows": []}
    for T in ([8192] if args.quick else [8192, 32768]):
        ours_fast, ours_det = ours_calls(T)
        try:
            window, causal = peer_calls(T, T)
        except ImportError as e:
            print(f"cuDNN peers unavailable ({e}): nvidia-cudnn-frontend is needed (carried as a wheel in .whl/)")
            return 1
        fns = {"ours_bwd": ours_fast, "ours_bwd_det": ours_det, "cudnn_window_bwd": window, "cudnn_causal_bwd": causal}
        names = list(fns)
        for name in names:  # warm-up (first-use setup, autotuning)
            for _ in range(3):
                fns[name]()
        torch.cuda.synchronize()
        times = {n: [] for n in names}
        for r in range(args.runs):
            for i in range(len(names)):
                n = names[(r + i) % len(names)]
                times[n].append(sample_ms(fns[n]))
        med = {n: statistics.median(t) for n, t in times.items()}
        peers = med["cudnn_window_bwd"] + med["cudnn_causal_bwd"]
        row = {"T": T, "median_ms": med, "min_ms": {n: min(t) for n, t in times.items()},
               "max_ms": {n: max(t) for n, t in times.items()}, "ours_over_peers": med["ours_bwd"] / peers,
               "det_over_fast": med["ours_bwd_det"] / med["ours_bwd"]}
        out["rows"].append(row)
        print(f"PT T={T}: " + ", ".join(f"{n} {med[n]:.4f} ms [{min(times[n]):.4f}, {max(times[n]):.4f}]"
                                        for n in names)
              + f"; ours / (window + causal) = {row['ours_over_peers']:.3f}; det / fast = {row['det_over_fast']:.3f}",
              flush=True)
        del fns, ours_fast, ours_det, window, causal
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    print("\n| T | ours PT bwd (ms) | det (ms) | cuDNN window bwd | cuDNN causal bwd | sum | ours / sum | det / fast |")
    print("|---|---|---|---|---|---|---|---|")
    for r in out["rows"]:
        m = r["median_ms"]
        s = m["cudnn_window_bwd"] + m["cudnn_causal_bwd"]
        # One call per sample and a row under 5 ms: the short rows' reading is in doubt (docstring).
        short = CALLS_PER_SAMPLE[0] == 1 and min(m.values()) < 5.0
        print(f"| {r['T'] // 1024}K | {m['ours_bwd']:.3f} | {m['ours_bwd_det']:.3f} | {m['cudnn_window_bwd']:.3f} | "
              f"{m['cudnn_causal_bwd']:.3f} | {s:.3f} | {r['ours_over_peers']:.2f}x"
              f"{' (rows under 5 ms in doubt: see --b2b)' if short else ''} | {r['det_over_fast']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
