#!/usr/bin/env python3
"""Orthros attention with xformers' fmha (xformers 0.0.35, PyPI wheel), on its FlashAttention op.

    python3 examples/ports/xformers_port.py --golden GOLDEN_DIR --out RESULTS_DIR
    orthros check --suite GOLDEN_DIR --actual-dir RESULTS_DIR --skip-missing --diagnose

Two calls per stream in the BMHK layout ([1, rows, H_q, D]) with the FlashAttention operator
pair `OP = (fmha.flash.FwOp, fmha.flash.BwOp)`:
    lse:  fmha.memory_efficient_attention_forward_requires_grad(q, k, v, attn_bias=BIAS, scale=s, op=OP[0])
    o:    fmha.memory_efficient_attention(q, k, v, attn_bias=BIAS, scale=s, op=OP)   (differentiable)
    base:   BIAS = fmha.attn_bias.LowerTriangularFromBottomRightLocalAttentionMask(W)
    output: BIAS = fmha.attn_bias.LowerTriangularFromBottomRightMask()
"From bottom-right" puts the last query on the last key (base row i at position P+i, output row i
at P+T-T_out+i). W is xformers' window size: a query X rows from the last cannot see keys X + W or
more from the last key, i.e. W keys including the diagonal; the self-check tries W = w and W = w+1
against a dense float64 reference and prints the convention found.
GQA: k and v are float32 leaves repeated to H_q heads (query head h reads KV head h // (H_q/H_kv),
SPEC §2) and cast to the dtype once per stream, so autograd sums the heads of a group and the two
streams in float32. (xformers' own GQA layout BMGHK is accepted by flash.FwOp but not by
flash.BwOp, whose backward would fall to the cutlass op.)
Why the FlashAttention op: the wheel's compiled extension `xformers._C` is built for another
PyTorch and Python (its cpp_lib.json; printed at start) and does not load beside the device's;
`fmha.flash` runs on PyTorch's own `aten._flash_attention_forward/backward` without `_C`.
"""
import port_common
import torch


def make_attention(window_of):
    from xformers.ops import fmha
    op = (fmha.flash.FwOp, fmha.flash.BwOp)

    def stream(q, k, v, scale, bias, need_grad):
        T, Hq, D = q.shape
        args = (q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0))
        o, lse = fmha.memory_efficient_attention_forward_requires_grad(*args, attn_bias=bias, scale=scale, op=op[0])
        if need_grad:  # the differentiable call (the forward above only gives the LSE)
            o = fmha.memory_efficient_attention(*args, attn_bias=bias, scale=scale, op=op)
        lse = lse.reshape(Hq, -1)[:, :T].transpose(0, 1).float()  # [B, H, M] (M maybe padded) -> [T, H_q]
        return o.reshape(T, Hq, D), lse

    def attention(q, k, v, q_out, window, scale, grads=None):
        dt, group = q.dtype, q.shape[1] // k.shape[1]
        leaves = [x.detach().requires_grad_(grads is not None) for x in (q, k.float(), v.float(), q_out)]
        kk, vv = (x.repeat_interleave(group, dim=1) for x in leaves[1:3])  # float32, [P+T, H_q, D]
        base_bias = fmha.attn_bias.LowerTriangularFromBottomRightLocalAttentionMask(window_of(window))
        o, lse = stream(leaves[0], kk.to(dt), vv.to(dt), scale, base_bias, grads is not None)
        if q_out.shape[0] > 0:
            o_out, lse_out = stream(leaves[3], kk.to(dt), vv.to(dt), scale,
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
    import json
    import os
    import xformers
    print(f"[xformers] {xformers.__version__}", flush=True)
    try:
        from xformers import _cpp_lib
        with open(os.path.join(os.path.dirname(xformers.__file__), "cpp_lib.json")) as f:
            print(f"[xformers] _C built for: {json.load(f)['version']}", flush=True)
        err = _cpp_lib._cpp_library_load_exception
        print(f"[xformers] compiled ops (_C): {'loaded' if err is None else 'NOT loaded: ' + ' '.join(str(err).split())}",
              flush=True)
    except Exception as e:  # the attribute moved: say so, the adapter still runs on what loads
        print(f"[xformers] compiled ops: unknown ({type(e).__name__}: {e})", flush=True)
    port_common.main("xformers", variants(), __doc__, "examples/ports/xformers_port.py")
