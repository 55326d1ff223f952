#!/usr/bin/env python3
"""Peers of the Orthros attention backward, timed on the same GPU run.

bf16, qwen3-8b attention shape (H_q=32, H_kv=8, D=128), B=1, T = 8K and 32K:
- cudnn_window: cuDNN's sliding-window attention through nvidia-cudnn-frontend 1.32.0,
  cudnn.sdpa.fwd.torch_op.sdpa(q, k, v, is_causal=True, window_left=128, return_lse=True)
  (differentiable through autograd; window_left=128 as the issue states it: 129 keys incl. the
  diagonal vs Orthros' w=128, a 0.8 % difference in work)
- sdpa_causal_cudnn: PyTorch SDPA, cuDNN backend, full causal
- sdpa_causal_flash: PyTorch SDPA, FlashAttention-2 backend, full causal
Each: forward alone, backward alone (torch.autograd.grad on a retained graph: only the backward
kernels run) and forward + backward. Median of N CUDA-event-timed runs after 3 warm-ups.
Usage: peers_backward.py [--runs N] [--json FILE] [--quick]
"""
import json
import sys
import traceback

import torch
import torch.nn.functional as F

from peers_common import HKV, HQ, D, W, Recorder, parse_args


def main():
    args = parse_args()
    dev = torch.device("cuda")
    rec = Recorder(args.runs, name_width=40, shape_width=10, error_chars=400, print_chars=300, empty_cache=False)
    rows, record = rec.rows, rec.record

    from torch.nn.attention import SDPBackend, sdpa_kernel

    def peer_fns():
        fns = {}
        try:
            from cudnn.sdpa.fwd.torch_op import sdpa as cudnn_sdpa

            def cudnn_window(q, k, v):
                o, _ = cudnn_sdpa(q, k, v, is_causal=True, window_left=W, return_lse=True)
                return o
            fns["cudnn_window"] = cudnn_window
        except Exception:
            traceback.print_exc()
            rows.append({"name": "cudnn_window", "shape": "-", "median_ms": None,
                         "error": "import cudnn.sdpa.fwd.torch_op failed (see log)"})

        def sdpa_with(backend):
            def fn(q, k, v):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return fn
        fns["sdpa_causal_cudnn"] = sdpa_with(SDPBackend.CUDNN_ATTENTION)
        fns["sdpa_causal_flash"] = sdpa_with(SDPBackend.FLASH_ATTENTION)
        return fns

    fns = peer_fns()
    for T in ([8192] if args.quick else [8192, 32768]):
        shape = f"T={T}"
        torch.manual_seed(T)
        q0 = torch.randn(1, HQ, T, D, device=dev, dtype=torch.bfloat16)
        k0 = torch.randn(1, HKV, T, D, device=dev, dtype=torch.bfloat16)
        v0 = torch.randn(1, HKV, T, D, device=dev, dtype=torch.bfloat16)
        g = torch.randn(1, HQ, T, D, device=dev, dtype=torch.bfloat16)
        for name, f in fns.items():
            for rep in (False, True):  # GQA directly, else K/V repeated (outside the timing)
                try:
                    if rep:
                        kk = k0.repeat_interleave(HQ // HKV, dim=1)
                        vv = v0.repeat_interleave(HQ // HKV, dim=1)
                    else:
                        kk, vv = k0, v0
                    q = q0.clone().requires_grad_(True)
                    k = kk.clone().requires_grad_(True)
                    v = vv.clone().requires_grad_(True)
                    out = f(q, k, v)
                    torch.autograd.grad(out, (q, k, v), g, retain_graph=True)
                    torch.cuda.synchronize()
                except Exception as e:
                    print(f"{name} {shape} rep={rep}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                    if rep:
                        rows.append({"name": name, "shape": shape, "median_ms": None,
                                     "error": f"{type(e).__name__}: {e}"[:400]})
                    continue
                nm = name + ("_repkv" if rep else "")
                with torch.no_grad():
                    record(nm + "_fwd", shape, lambda: f(q, k, v))
                record(nm + "_bwd", shape, lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True))
                record(nm + "_fwdbwd", shape, lambda: torch.autograd.grad(f(q, k, v), (q, k, v), g))
                del out, q, k, v
                torch.cuda.empty_cache()
                break
        del q0, k0, v0, g
        torch.cuda.empty_cache()

    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "runs": args.runs, "rows": rows}
    try:
        import cudnn
        out["cudnn_frontend"] = getattr(cudnn, "__version__", "?")
        out["cudnn_backend"] = cudnn.backend_version() if hasattr(cudnn, "backend_version") else "?"
    except Exception:
        pass
    out["torch_cudnn"] = torch.backends.cudnn.version()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
