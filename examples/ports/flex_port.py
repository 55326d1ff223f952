#!/usr/bin/env python3
"""Orthros attention with PyTorch FlexAttention: both streams in ONE call with one block mask.

    python3 examples/ports/flex_port.py --golden GOLDEN_DIR --out RESULTS_DIR [--device cuda|cpu]
    orthros check --suite GOLDEN_DIR --actual-dir RESULTS_DIR --skip-missing --diagnose

The base queries q [T, H_q, D] and the output queries q_out [T_out, H_q, D] are stacked into one
query sequence of T + T_out rows over the same keys k, v [P+T, H_kv, D]; the block mask gives
query row r the key range lo[r] .. hi[r] (0-based, inclusive):
    base row i   (r = i < T):        position p = P + i,            keys p-w+1 .. p  (w keys)
    output row i (r = T + i):        position p = P + T - T_out + i, keys 0 .. p      (full causal)
`return_aux=AuxRequest(lse=True)` gives the natural-log LSE. One autograd backward through the one
call gives dq, dq_out and dk/dv summed over both streams inside the library's kernel.

GQA: `enable_gqa=True`, which maps query head h to KV head h // (H_q / H_kv) (SPEC §2). To reach
every case with one compiled kernel, each call is padded to one canonical shape (`_canonical`):
  - heads: KV head g keeps its G_real = H_q / H_kv query heads at padded query heads g·G .. g·G+G_real-1
    (G = 8, or the next power of two above H_q / H_kv), the others zero; KV heads are padded with
    zero heads to a multiple of 8;
  - head dim: zero-padded to 128 (or 256): zeros add nothing to q·k, the padded output columns are
    dropped; the scale is passed explicitly;
  - rows: queries padded to a multiple of 1024, keys to a multiple of 512; a padded query row sees
    key 0 only and gets zero upstream gradient, a padded key is outside every row's range.
The padded heads and rows carry zero queries and zero upstream gradients, so they add exactly
zero to dk/dv; their outputs are dropped. The softmax scale s enters as `score_mod = score * s`
with s a float32 tensor and `scale=1.0`: the kernel computes (q·k)·1·s in float32, the same value
as `scale=s`, but a float argument would be compiled in as a constant. So the kernel is compiled
once per dtype and gradient mode (lo, hi and s are inputs), instead of once per case shape.
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
            # every case runs at one canonical shape; the limit is raised only so that an unusual
            # shape (more heads per group, a longer sequence) recompiles instead of falling back to
            # the unfused eager path without an error
            for knob in ("recompile_limit", "cache_size_limit"):
                if hasattr(torch._dynamo.config, knob):
                    setattr(torch._dynamo.config, knob, 64)
            _compiled["fn"] = torch.compile(flex_attention, dynamic=False)
        return _compiled["fn"]
    return flex_attention


def _round_up(n, m):
    return max(m, -(-n // m) * m)


def _canonical(Hq, Hkv, D, rows, keys):
    """The padded shape (heads per KV head G, KV heads, head dim, query rows, keys) of a call."""
    g = Hq // Hkv
    G = 8 if g <= 8 else 1 << (g - 1).bit_length()
    return G, _round_up(Hkv, 8), 128 if D <= 128 else _round_up(D, 128), _round_up(rows, 1024), _round_up(keys, 512)


def make_attention(lse_log2=False):
    """The adapter; lse_log2=True converts an LSE the library returned in log2 units."""
    def attention(q, k, v, q_out, window, scale, grads=None):
        T, Hq, D = q.shape
        N, Hkv, _ = k.shape
        P, T_out = N - T, q_out.shape[0]
        R, g, dev, dt = T + T_out, Hq // Hkv, q.device, q.dtype
        G, Hkv_p, D_p, R_p, N_p = _canonical(Hq, Hkv, D, R, N)
        # per query row: the first and last key it sees (SPEC §2); padded rows see key 0 only
        pos = torch.cat([P + torch.arange(T, device=dev), P + T - T_out + torch.arange(T_out, device=dev)])
        lo = torch.zeros(R_p, dtype=torch.int32, device=dev)
        hi = torch.zeros(R_p, dtype=torch.int32, device=dev)
        lo[:T] = (pos[:T] - window + 1).clamp(min=0).to(torch.int32)
        hi[:R] = pos.to(torch.int32)

        def mask_mod(b, h, q_idx, kv_idx):
            return (kv_idx >= lo[q_idx]) & (kv_idx <= hi[q_idx])

        block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=R_p, KV_LEN=N_p, device=dev)
        leaves = [x.detach().requires_grad_(grads is not None) for x in (q, k, v, q_out)]
        # query head h = g_kv * g + j  ->  padded head g_kv * G + j
        head = (torch.arange(Hq, device=dev) // g) * G + torch.arange(Hq, device=dev) % g

        def pad_q(x):  # [R, H_q, D] -> [1, Hkv_p * G, R_p, D_p]
            z = x.new_zeros(R_p, Hkv_p * G, D_p)
            z = z.index_copy(1, head, torch.nn.functional.pad(x, (0, D_p - D, 0, 0, 0, R_p - R)))
            return z.transpose(0, 1).unsqueeze(0)

        def pad_kv(x):  # [N, H_kv, D] -> [1, Hkv_p, N_p, D_p]
            return torch.nn.functional.pad(x, (0, D_p - D, 0, Hkv_p - Hkv, 0, N_p - N)).transpose(0, 1).unsqueeze(0)

        s = torch.tensor(scale, dtype=torch.float32, device=dev)

        def score_mod(score, b, h, q_idx, kv_idx):  # the softmax scale as a tensor: no recompile per scale
            return score * s

        qq = pad_q(torch.cat([leaves[0], leaves[3]]))
        o, aux = _flex(dev)(qq, pad_kv(leaves[1]), pad_kv(leaves[2]), score_mod=score_mod, block_mask=block_mask,
                            scale=1.0, enable_gqa=True, return_aux=AuxRequest(lse=True))
        o = o[0].transpose(0, 1)[:R, head, :D]                     # [T+T_out, H_q, D]
        lse = aux.lse[0].transpose(0, 1)[:R, head].float()         # [T+T_out, H_q]
        if lse_log2:
            lse = lse * math.log(2.0)
        out = {"o": o[:T], "o_out": o[T:], "lse": lse[:T], "lse_out": lse[T:]}
        if grads is not None:
            do, do_out = grads
            g_ = torch.autograd.grad((o * torch.cat([do, do_out]).to(dt)).sum(), leaves)
            out.update(dq=g_[0], dk=g_[1], dv=g_[2], dq_out=g_[3])
        return {n: x.detach() for n, x in out.items()}
    return attention


VARIANTS = {"one block mask, natural-log LSE": make_attention(False),
            "one block mask, LSE in log2 (converted)": make_attention(True)}

if __name__ == "__main__":
    port_common.main("flex", VARIANTS, __doc__, "examples/ports/flex_port.py")
