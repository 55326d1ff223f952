#!/usr/bin/env python3
"""What a user would pick instead of the Orthros kernels, timed on the same GPU run.

- cuDNN's sliding-window forward (nvidia-cudnn-frontend 1.32.0, carried as a wheel in .whl/):
  cudnn.sdpa.fwd.torch_op.sdpa(q, k, v, is_causal=True, window_left=128) = the w=128 window
  including the current token, T=8K/32K/128K
- SDPA full causal attention, cuDNN and FlashAttention backends (prefill T=32K/128K, PT T=8K/32K)
- SDPA decode: one query over a 128K cache (batch 1 and 16), FlashAttention and cuDNN backends
- FlexAttention with a sliding-window block mask (w=128), the base stream alone (T=32K/128K, 8K/32K)
- device-to-device copy bandwidth (bytes read + written)
bf16, qwen3-8b attention shape: H_q=32, H_kv=8, D=128. Median of N CUDA-event-timed runs after warm-up.
Usage: peers.py [--runs N] [--json FILE] [--quick]
"""
import json
import sys
import traceback

import torch
import torch.nn.functional as F

from peers_common import HKV, HQ, D, W, Recorder, median_ms, parse_args


def main():
    args = parse_args()
    dev = torch.device("cuda")
    rec = Recorder(args.runs, name_width=34, shape_width=36, error_chars=300, print_chars=200, empty_cache=True)
    rows, record = rec.rows, rec.record

    n = 4 << 30
    a = torch.empty(n, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    copy_ms = median_ms(lambda: b.copy_(a), args.runs)
    copy_gbps = 2 * n / (copy_ms * 1e-3) / 1e9
    print(f"d2d copy: {copy_ms:.4f} ms, {copy_gbps:.1f} GB/s (read+write)", flush=True)
    del a, b
    torch.cuda.empty_cache()

    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}

    def sdpa_fn(backend, q, k, v, causal):
        def fn():
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        return fn

    def sdpa_fn_rep(backend, q, k, v, causal):
        # Fallback when a backend does not take GQA: K/V repeated once, outside the timing.
        kr = k.repeat_interleave(HQ // HKV, dim=1)
        vr = v.repeat_interleave(HQ // HKV, dim=1)
        def fn():
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, kr, vr, is_causal=causal)
        return fn

    def bench_sdpa(name, shape, bk, q, k, v, causal, runs):
        try:
            sdpa_fn(backends[bk], q, k, v, causal)()
            record(name, shape, sdpa_fn(backends[bk], q, k, v, causal), runs)
        except Exception:
            record(name + "_repkv", shape, sdpa_fn_rep(backends[bk], q, k, v, causal), runs)

    t_list = [32768] if args.quick else [32768, 131072]
    pt_list = [8192] if args.quick else [8192, 32768]
    for T in sorted(set(t_list + pt_list)):
        q = torch.randn(1, HQ, T, D, device=dev, dtype=torch.bfloat16)
        k = torch.randn(1, HKV, T, D, device=dev, dtype=torch.bfloat16)
        v = torch.randn(1, HKV, T, D, device=dev, dtype=torch.bfloat16)
        runs = args.runs if T <= 32768 else max(20, args.runs // 2)
        for bk in ("cudnn", "flash"):
            bench_sdpa(f"sdpa_causal_{bk}", f"T={T}", bk, q, k, v, True, runs)
        del q, k, v
        torch.cuda.empty_cache()

    # cuDNN's own sliding-window kernel: what a user composes with cuDNN causal for Orthros.
    try:
        from cudnn.sdpa.fwd.torch_op import sdpa as cudnn_sdpa

        for T in sorted(set(t_list + pt_list)):
            q = torch.randn(1, HQ, T, D, device=dev, dtype=torch.bfloat16)
            k = torch.randn(1, HKV, T, D, device=dev, dtype=torch.bfloat16)
            v = torch.randn(1, HKV, T, D, device=dev, dtype=torch.bfloat16)
            runs = args.runs if T <= 32768 else max(20, args.runs // 2)
            record("cudnn_window_w128", f"T={T}",
                   lambda: cudnn_sdpa(q, k, v, is_causal=True, window_left=W, return_lse=True), runs)
            record("cudnn_window_w128_nolse", f"T={T}",
                   lambda: cudnn_sdpa(q, k, v, is_causal=True, window_left=W, return_lse=False), runs)
            del q, k, v
            torch.cuda.empty_cache()
    except Exception:
        traceback.print_exc()
        rows.append({"name": "cudnn_window_w128", "shape": "-", "median_ms": None,
                     "error": "cudnn.sdpa.fwd.torch_op unavailable (carry the nvidia-cudnn-frontend wheel in .whl/)"})

    L = 131072
    for B in (1, 16):
        q = torch.randn(B, HQ, 1, D, device=dev, dtype=torch.bfloat16)
        k = torch.randn(B, HKV, L, D, device=dev, dtype=torch.bfloat16)
        v = torch.randn(B, HKV, L, D, device=dev, dtype=torch.bfloat16)
        for bk in ("flash", "cudnn"):
            bench_sdpa(f"sdpa_decode_{bk}", f"B={B} L={L}", bk, q, k, v, False, args.runs)
        del q, k, v
        torch.cuda.empty_cache()

    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention, dynamic=False)

        def swa(b, h, qi, ki):
            return (qi >= ki) & (qi - ki < W)

        for T in sorted(set(t_list + pt_list)):
            q = torch.randn(1, HQ, T, D, device=dev, dtype=torch.bfloat16)
            k = torch.randn(1, HKV, T, D, device=dev, dtype=torch.bfloat16)
            v = torch.randn(1, HKV, T, D, device=dev, dtype=torch.bfloat16)
            try:  # compiled mask construction: no dense T x T mask (which OOMs at 128K)
                bm = create_block_mask(swa, None, None, T, T, device=dev, _compile=True)
            except TypeError:
                bm = create_block_mask(swa, None, None, T, T, device=dev)
            record("flex_swa_w128", f"T={T}", lambda: flex(q, k, v, block_mask=bm, enable_gqa=True))
            del q, k, v, bm
            torch.cuda.empty_cache()
    except Exception:
        traceback.print_exc()
        rows.append({"name": "flex_swa_w128", "shape": "-", "median_ms": None, "error": "FlexAttention unavailable"})

    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "runs": args.runs,
           "copy_GBps": copy_gbps, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
