#!/usr/bin/env python3
"""Orthros attention with xformers' memory-efficient attention (xformers 0.0.35, PyPI wheel).

    python3 examples/ports/xformers_port.py --golden GOLDEN_DIR --out RESULTS_DIR
    orthros check --suite GOLDEN_DIR --actual-dir RESULTS_DIR --skip-missing --diagnose

Two calls of `xformers.ops.fmha.memory_efficient_attention_forward_requires_grad` (returns o and
the LSE) in the BMGHK layout ([1, rows, H_kv, H_q/H_kv, D]: GQA by groups, query head h = g·(H_q/H_kv) + j
reading KV head g, k and v broadcast over j — SPEC §2's h // (H_q/H_kv)):
    base:   attn_bias = fmha.attn_bias.LowerTriangularFromBottomRightLocalAttentionMask(W)
    output: attn_bias = fmha.attn_bias.LowerTriangularFromBottomRightMask()
"From bottom-right" puts the last query on the last key (base row i at position P+i, output row i
at P+T-T_out+i). W is xformers' window size: a query X rows from the last cannot see keys X + W or
more from the last key, i.e. W keys including the diagonal; the self-check tries W = w and W = w+1
against a dense float64 reference and prints the convention found. The gradients come from
autograd through `xformers.ops.memory_efficient_attention` with the same biases (dk/dv summed over
both streams). Whether the wheel's compiled ops load beside the installed PyTorch is printed
(`xformers.info`); its FlashAttention op runs on PyTorch's own flash kernels either way.
"""
import port_common
import torch


def make_attention(window_of):
    from xformers.ops import fmha

    def bmghk(x, Hkv, group):
        rows, H, D = x.shape
        if H == Hkv:  # k, v: broadcast each KV head over its group of query heads
            return x.reshape(1, rows, Hkv, 1, D).expand(1, rows, Hkv, group, D)
        return x.reshape(1, rows, Hkv, group, D)

    def stream(q, k, v, scale, bias, need_grad):
        T, Hq, D = q.shape
        Hkv = k.shape[1]
        g = Hq // Hkv
        args = (bmghk(q, Hkv, g), bmghk(k, Hkv, g), bmghk(v, Hkv, g))
        o, lse = fmha.memory_efficient_attention_forward_requires_grad(*args, attn_bias=bias, scale=scale)
        if need_grad:  # the differentiable call (the forward above only gives the LSE)
            o = fmha.memory_efficient_attention(*args, attn_bias=bias, scale=scale)
        lse = lse.reshape(Hq, -1)[:, :T].transpose(0, 1).float()  # [B, G, H, M] (M maybe padded) -> [T, H_q]
        return o.reshape(T, Hq, D), lse

    def attention(q, k, v, q_out, window, scale, grads=None):
        leaves = [x.detach().requires_grad_(grads is not None) for x in (q, k, v, q_out)]
        base_bias = fmha.attn_bias.LowerTriangularFromBottomRightLocalAttentionMask(window_of(window))
        o, lse = stream(leaves[0], leaves[1], leaves[2], scale, base_bias, grads is not None)
        if q_out.shape[0] > 0:
            o_out, lse_out = stream(leaves[3], leaves[1], leaves[2], scale,
                                    fmha.attn_bias.LowerTriangularFromBottomRightMask(), grads is not None)
        else:
            o_out, lse_out = q_out.new_zeros(q_out.shape), q_out.new_zeros(q_out.shape[:2], dtype=torch.float32)
        out = {"o": o, "o_out": o_out, "lse": lse, "lse_out": lse_out}
        if grads is not None:
            do, do_out = grads
            loss = (o * do).sum() + ((o_out * do_out).sum() if q_out.shape[0] else 0)
            gr = torch.autograd.grad(loss, leaves, allow_unused=True)
            z = [x if x is not None else torch.zeros_like(l) for x, l in zip(gr, leaves)]
            out.update(dq=z[0], dk=z[1], dv=z[2], dq_out=z[3])
        return {n: x.detach() for n, x in out.items()}
    return attention


def variants():
    return {"LowerTriangularFromBottomRightLocalAttentionMask(w)": make_attention(lambda w: w),
            "LowerTriangularFromBottomRightLocalAttentionMask(w + 1)": make_attention(lambda w: w + 1)}


if __name__ == "__main__":
    import xformers
    print(f"[xformers] {xformers.__version__}", flush=True)
    try:
        from xformers import _cpp_lib
        print(f"[xformers] compiled ops: {'loaded' if _cpp_lib._cpp_library_load_exception is None else _cpp_lib._cpp_library_load_exception}",
              flush=True)
    except Exception as e:  # the attribute moved: say so, the adapter still runs on what loads
        print(f"[xformers] compiled ops: unknown ({type(e).__name__}: {e})", flush=True)
    port_common.main("xformers", variants(), __doc__, "examples/ports/xformers_port.py")
