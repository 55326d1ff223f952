#!/usr/bin/env python3
"""Orthros attention with cuDNN through the cuDNN frontend's PyTorch op (nvidia-cudnn-frontend 1.32).

    python3 examples/ports/cudnn_port.py --golden GOLDEN_DIR --out RESULTS_DIR
    orthros check --suite GOLDEN_DIR --actual-dir RESULTS_DIR --skip-missing --diagnose

Two calls of `cudnn.sdpa.fwd.torch_op.sdpa` (BHSD layout: [1, H, S, D]; GQA by H_kv < H_q):
    base:   sdpa(q, k, v, scale=s, is_causal=True, causal_bottom_right=True, window_left=WL, return_lse=True)
    output: sdpa(q_out, k, v, scale=s, is_causal=True, causal_bottom_right=True, return_lse=True)
Bottom-right alignment puts the last query row on the last key (base row i at position P+i,
output row i at P+T-T_out+i: SPEC §2). WL is cuDNN's diagonal_band_left_bound, which the frontend
documents as the window length (offset length-1): the self-check tries WL = w (w keys including
the diagonal) and WL = w+1 against a dense float64 reference and keeps the one that matches;
it prints the convention found. The op is differentiable (the frontend registers autograd on
the dense path with return_lse=True): one backward of (o·do + o_out·do_out) gives dk/dv summed
over both streams. cuDNN serves f16/bf16 only; a stream with no queries (T_out = 0) is not called;
a call cuDNN rejects (e.g. s_q = s_kv = 1) is reported as a skipped case with cuDNN's message.
"""
import port_common
import torch


def make_attention(window_left_of):
    from cudnn.sdpa.fwd.torch_op import sdpa

    def stream(q, k, v, scale, window_left):
        kw = dict(scale=scale, is_causal=True, causal_bottom_right=True, return_lse=True)
        if window_left is not None:
            kw["window_left"] = window_left
        try:
            o, lse = sdpa(q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
                          v.transpose(0, 1).unsqueeze(0), **kw)
        except Exception as e:  # cuDNN's graph errors (e.g. cudnnGraphNotSupportedError) say "not supported"
            if "support" in str(e).lower():
                raise port_common.Unsupported(f"cuDNN: {str(e).splitlines()[0][:300]}") from e
            raise
        return o[0].transpose(0, 1), lse.reshape(lse.shape[1], lse.shape[2]).transpose(0, 1).float()

    def attention(q, k, v, q_out, window, scale, grads=None):
        # k and v are float32 leaves cast to the dtype once per stream, so autograd sums the two
        # streams' dk/dv in float32 (bf16 leaves would add them in bf16: one more rounding than
        # SPEC §6's bound allows at the rows both streams see).
        dt = q.dtype
        leaves = [x.detach().requires_grad_(grads is not None) for x in (q, k.float(), v.float(), q_out)]
        o, lse = stream(leaves[0], leaves[1].to(dt), leaves[2].to(dt), scale, window_left_of(window))
        if q_out.shape[0] > 0:
            o_out, lse_out = stream(leaves[3], leaves[1].to(dt), leaves[2].to(dt), scale, None)
        else:  # no output queries (a prefill chunk): nothing to call
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


def variants():
    return {"window_left = w (w keys incl. the diagonal), bottom-right": make_attention(lambda w: w),
            "window_left = w - 1, bottom-right": make_attention(lambda w: w - 1 if w > 1 else None),
            "window_left = w + 1, bottom-right": make_attention(lambda w: w + 1)}


if __name__ == "__main__":
    import cudnn
    print(f"[cudnn] frontend {getattr(cudnn, '__version__', '?')}, backend "
          f"{cudnn.backend_version() if hasattr(cudnn, 'backend_version') else '?'}", flush=True)
    port_common.main("cudnn", variants(), __doc__, "examples/ports/cudnn_port.py")
