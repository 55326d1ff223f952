#!/usr/bin/env python3
"""Orthros attention with PyTorch's FlashAttention-2 kernels: torch.nn.attention.varlen.varlen_attn.

    python3 examples/ports/flash_port.py --golden GOLDEN_DIR --out RESULTS_DIR
    orthros check --suite GOLDEN_DIR --actual-dir RESULTS_DIR --skip-missing --diagnose

Two varlen calls (packed [tokens, H, D] layout, one sequence: cu_seq = [0, rows]; GQA by
H_kv < H_q, query head h reading KV head h // (H_q/H_kv) as FlashAttention does):
    base:   varlen_attn(q, k, v, [0, T], [0, P+T], T, P+T, window_size=(w-1, 0), return_aux=AuxRequest(lse=True))
    output: varlen_attn(q_out, k, v, [0, T_out], [0, P+T], T_out, P+T, window_size=(-1, 0), ...)
FlashAttention aligns the causal diagonal bottom-right when there are fewer queries than keys
(the last query row on the last key), so base row i sits at position P+i and output row i at
P+T-T_out+i, as SPEC §2 needs; window_size=(left, right) admits keys p-left .. p+right, so
(w-1, 0) is the w-key window. The self-check also tries (w, 0) — the classic mistake — to show
that it fails. The LSE comes as [H, rows] in natural log. Autograd through both calls gives
dk/dv summed over the streams in float32 (k, v are float32 leaves). f16/bf16 only (FlashAttention); a stream with no queries
(T_out = 0) is not called.
"""
import port_common
import torch


def make_attention(left_of):
    from torch.nn.attention.varlen import AuxRequest, varlen_attn

    def stream(q, k, v, scale, window_size):
        dev = q.device
        cu_q = torch.tensor([0, q.shape[0]], dtype=torch.int32, device=dev)
        cu_k = torch.tensor([0, k.shape[0]], dtype=torch.int32, device=dev)
        o, lse = varlen_attn(q, k, v, cu_q, cu_k, q.shape[0], k.shape[0], return_aux=AuxRequest(lse=True),
                             scale=scale, window_size=window_size)
        return o, lse.transpose(0, 1).float()  # lse [H, rows] -> [rows, H]

    def attention(q, k, v, q_out, window, scale, grads=None):
        # k and v are float32 leaves cast to the dtype once per stream, so autograd sums the two
        # streams' dk/dv in float32 (bf16 leaves would add them in bf16: one more rounding than
        # SPEC §6's bound allows at the rows both streams see).
        dt = q.dtype
        leaves = [x.detach().requires_grad_(grads is not None) for x in (q, k.float(), v.float(), q_out)]
        o, lse = stream(leaves[0], leaves[1].to(dt), leaves[2].to(dt), scale, (left_of(window), 0))
        if q_out.shape[0] > 0:
            o_out, lse_out = stream(leaves[3], leaves[1].to(dt), leaves[2].to(dt), scale, (-1, 0))
        else:
            o_out, lse_out = q_out.new_zeros(q_out.shape), q_out.new_zeros(q_out.shape[:2], dtype=torch.float32)
        out = {"o": o, "o_out": o_out, "lse": lse, "lse_out": lse_out}
        if grads is not None:
            do, do_out = grads
            loss = (o * do).sum() + ((o_out * do_out).sum() if q_out.shape[0] else 0)
            g = torch.autograd.grad(loss, leaves, allow_unused=True)
            z = [x if x is not None else torch.zeros_like(l) for x, l in zip(g, leaves)]
            out.update(dq=z[0], dk=z[1], dv=z[2], dq_out=z[3])
        return {n: x.detach() for n, x in out.items()}
    return attention


VARIANTS = {"varlen_attn window_size=(w-1, 0), bottom-right causal": make_attention(lambda w: w - 1),
            "varlen_attn window_size=(w, 0) (the off-by-one)": make_attention(lambda w: w)}

if __name__ == "__main__":
    port_common.main("flash", VARIANTS, __doc__, "examples/ports/flash_port.py")
