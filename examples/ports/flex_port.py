#!/usr/bin/env python3
"""Orthros attention with PyTorch FlexAttention: both streams in ONE call with one block mask.

    python3 examples/ports/flex_port.py --golden GOLDEN_DIR --out RESULTS_DIR [--device cuda|cpu]
    orthros check --suite GOLDEN_DIR --actual-dir RESULTS_DIR --diagnose

The base queries q [T, H_q, D] and the output queries q_out [T_out, H_q, D] are stacked into one
query sequence of T + T_out rows over the same keys k, v [P+T, H_kv, D]; the block mask gives row
r its own position and stream:
    base row i   (r = i < T):        position p = P + i,          keys p-w+1 .. p  (w keys)
    output row i (r = T + i):        position p = P + T - T_out + i, keys 0 .. p    (full causal)
(0-based positions). `flex_attention(..., enable_gqa=True)` maps query head h to KV head
h // (H_q / H_kv) (SPEC §2); `return_aux=AuxRequest(lse=True)` gives the LSE. One autograd
backward through the one call gives dq, dq_out and dk/dv summed over both streams.
The self-check (a small dense case against float64) runs first and states the LSE unit found
(natural log, or log2 converted by x ln 2). Runs on CUDA (compiled kernel) and on CPU (eager).
"""
import math

import torch
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

import port_common

_compiled = {}


def _flex(device):
    """flex_attention compiled on CUDA (its fused kernel); eager elsewhere (the unfused reference path)."""
    if str(device).startswith("cuda"):
        if "fn" not in _compiled:
            # one compiled kernel per case shape: raise dynamo's recompile limit (default 8), past
            # which it would fall back to the unfused eager path without an error
            for knob in ("recompile_limit", "cache_size_limit"):
                if hasattr(torch._dynamo.config, knob):
                    setattr(torch._dynamo.config, knob, 1024)
            _compiled["fn"] = torch.compile(flex_attention, dynamic=False)
        return _compiled["fn"]
    return flex_attention


def make_attention(lse_log2=False):
    """The adapter; lse_log2=True converts an LSE the library returned in log2 units."""
    def attention(q, k, v, q_out, window, scale, grads=None):
        T, Hq, D = q.shape
        N, Hkv, _ = k.shape
        P, T_out = N - T, q_out.shape[0]
        dev = q.device
        pos = torch.cat([P + torch.arange(T, device=dev), P + T - T_out + torch.arange(T_out, device=dev)])
        is_base = torch.arange(T + T_out, device=dev) < T

        def mask_mod(b, h, q_idx, kv_idx):
            p = pos[q_idx]
            return (kv_idx <= p) & ((kv_idx > p - window) | ~is_base[q_idx])

        block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=T + T_out, KV_LEN=N, device=dev)
        leaves = [x.detach().requires_grad_(grads is not None) for x in (q, k, v, q_out)]
        qq = torch.cat([leaves[0], leaves[3]]).transpose(0, 1).unsqueeze(0)  # [1, H_q, T+T_out, D]
        kk, vv = (x.transpose(0, 1).unsqueeze(0) for x in leaves[1:3])    # [1, H_kv, P+T, D]
        o, aux = _flex(dev)(qq, kk, vv, block_mask=block_mask, scale=scale, enable_gqa=Hq != Hkv,
                            return_aux=AuxRequest(lse=True))
        o = o[0].transpose(0, 1)                   # [T+T_out, H_q, D]
        lse = aux.lse[0].transpose(0, 1).float()   # [T+T_out, H_q]
        if lse_log2:
            lse = lse * math.log(2.0)
        out = {"o": o[:T], "o_out": o[T:], "lse": lse[:T], "lse_out": lse[T:]}
        if grads is not None:
            do, do_out = grads
            g = torch.autograd.grad((o * torch.cat([do, do_out]).to(o.dtype)).sum(), leaves)
            out.update(dq=g[0], dk=g[1], dv=g[2], dq_out=g[3])
        return {n: x.detach() for n, x in out.items()}
    return attention


VARIANTS = {"one block mask, natural-log LSE": make_attention(False),
            "one block mask, LSE in log2 (converted)": make_attention(True)}

if __name__ == "__main__":
    port_common.main("flex", VARIANTS, __doc__, "examples/ports/flex_port.py")
