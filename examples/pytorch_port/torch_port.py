#!/usr/bin/env python3
"""An Orthros attention port in PyTorch, validated against the golden suite by `orthros check`.

    python3 torch_port.py --golden GOLDEN_DIR --out RESULTS_DIR [--backend sdpa|flex]
                          [--device cuda|cpu] [--bug window-off-by-one]
    orthros check --suite GOLDEN_DIR --actual-dir RESULTS_DIR

Two streams over one KV cache (SPEC §2):
  base queries    q [T, H_q, D] at positions P+1..P+T: sliding window, keys [t-w+1, t] (w keys, itself included)
  output queries  q_out [T_out, H_q, D] at the LAST T_out base positions: full causal, keys [1, t]
Both read the same k, v [P+T, H_kv, D]; output queries never add keys.

Backends:
  sdpa  torch.nn.functional.scaled_dot_product_attention with a boolean window mask; the LSE
        (which SDPA does not return) is a masked logsumexp of the scaled scores in float32.
  flex  FlexAttention (torch >= 2.5) with a sliding-window block mask; LSE from return_lse=True.
Compute dtype = the suite's dtype (bf16, f16, f32; f64 on the sdpa backend). Results are written
in F32 (F64 for an f64 suite); lse in float32.

Gradients (cases of a suite written by `orthros golden --grad`, which hold the upstream gradients
`do` [T, H_q, D] and `do_out` [T_out, H_q, D]): q, k, v, q_out get requires_grad, the loss is
L = sum(o * do) + sum(o_out * do_out) (products and sums in float32; dL/do = do exactly), and
autograd's backward of the chosen backend gives dq, dq_out, dk, dv (the repeat_interleave of the
sdpa backend and FlexAttention's enable_gqa sum each KV head's gradient over its query-head group;
both streams' contributions to dk/dv add). They are written beside o, o_out, lse, lse_out, and
`orthros check` judges all eight. --no-grad skips the backward on such a suite (forward only).
"""
import argparse
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402

DTYPES = {"f64": torch.float64, "f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def allowed_keys(q_pos, n_keys, window, lookback_bug=False):
    """Boolean [len(q_pos), n_keys]: key j (0-based position) is visible to a query at q_pos.
    window=None: full causal. The window includes the query itself: j in [pos-w+1, pos]."""
    j = torch.arange(n_keys, device=q_pos.device)
    ok = j[None, :] <= q_pos[:, None]
    if window is not None:
        lookback = window if lookback_bug else window - 1
        ok &= j[None, :] >= q_pos[:, None] - lookback
    return ok


def sdpa_stream(q, k, v, q_pos, window, scale, bug):
    """q [Tq,Hq,D], k/v [N,Hkv,D] -> o [Tq,Hq,D], lse [Tq,Hq] (natural log)."""
    Tq, Hq, D = q.shape
    N, Hkv, _ = k.shape
    if Tq == 0:
        return q.new_zeros((0, Hq, D)), torch.zeros((0, Hq), dtype=torch.float32, device=q.device)
    group = Hq // Hkv
    qh = q.permute(1, 0, 2).unsqueeze(0)                                  # [1, Hq, Tq, D]
    kh = k.permute(1, 0, 2).repeat_interleave(group, dim=0).unsqueeze(0)  # GQA: head h reads KV head h // group
    vh = v.permute(1, 0, 2).repeat_interleave(group, dim=0).unsqueeze(0)
    mask = allowed_keys(q_pos, N, window, bug)                            # [Tq, N], True = attend
    o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
    with torch.no_grad():                                                  # the LSE is not part of the loss
        s = (qh.float() @ kh.float().transpose(-1, -2)) * scale           # LSE in float32
        lse = torch.logsumexp(s.masked_fill(~mask, float("-inf")), dim=-1)  # base e, [1, Hq, Tq]
    return o[0].permute(1, 0, 2), lse[0].transpose(0, 1)


def flex_stream(q, k, v, q_pos, window, scale, bug):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    Tq, Hq, D = q.shape
    N, Hkv, _ = k.shape
    if Tq == 0:
        return q.new_zeros((0, Hq, D)), torch.zeros((0, Hq), dtype=torch.float32, device=q.device)
    offset = int(q_pos[0])                       # q_pos is contiguous: offset + q_idx
    lookback = window if bug else (window - 1 if window is not None else None)

    def mask_mod(b, h, q_idx, kv_idx):
        pos = q_idx + offset
        ok = kv_idx <= pos
        if lookback is not None:
            ok = ok & (kv_idx >= pos - lookback)
        return ok

    bm = create_block_mask(mask_mod, B=None, H=None, Q_LEN=Tq, KV_LEN=N, device=q.device)
    qh, kh, vh = (x.permute(1, 0, 2).unsqueeze(0) for x in (q, k, v))
    o, lse = flex_attention(qh, kh, vh, block_mask=bm, scale=scale, enable_gqa=(Hq != Hkv), return_lse=True)
    return o[0].permute(1, 0, 2), lse[0].detach().float().transpose(0, 1)


def orthros_attention(q, k, v, q_out, window, scale, backend="sdpa", bug=None, kv_out=None):
    """The port: returns dict o, o_out, lse, lse_out (torch tensors). kv_out: other tensors holding
    the same keys/values for the output stream (default k, v)."""
    T, T_out, N = q.shape[0], q_out.shape[0], k.shape[0]
    P = N - T
    dev = q.device
    stream = flex_stream if backend == "flex" else sdpa_stream
    base_pos = P + torch.arange(T, device=dev)                  # 0-based absolute positions
    out_pos = P + T - T_out + torch.arange(T_out, device=dev)   # an output token takes its base token's position
    o, lse = stream(q, k, v, base_pos, window, scale, bug == "window-off-by-one")
    o_out, lse_out = stream(q_out, *(kv_out or (k, v)), out_pos, None, scale, False)
    return {"o": o, "o_out": o_out, "lse": lse, "lse_out": lse_out}


def orthros_attention_with_grads(q, k, v, q_out, do, do_out, window, scale, backend="sdpa", bug=None,
                                 accum="dtype"):
    """The port's forward and its backward through autograd: returns dict o, o_out, lse, lse_out,
    dq, dq_out, dk, dv, the gradients of L = sum(o * do) + sum(o_out * do_out).

    accum="dtype": the leaves are in the compute dtype, so autograd adds the two streams' dk/dv
    and (sdpa: the repeat_interleave backward) the GQA group's heads in that dtype.
    accum="fp32": the leaves are float32 (exact copies) and each stream reads them through a cast
    to the compute dtype, with the KV heads repeated to H_q before the cast; attention still runs
    in the compute dtype, but every gradient sum across streams and query heads is float32 (the
    fp32 master-gradient layout of mixed-precision training)."""
    if accum == "fp32":
        dt, group = q.dtype, q.shape[1] // k.shape[1]
        leaves = {n: x.detach().float().requires_grad_(True) for n, x in (("q", q), ("k", k), ("v", v),
                                                                          ("q_out", q_out))}
        def kv():  # one cast per stream, so the streams' gradients meet in float32 at the leaf
            return tuple(leaves[n].repeat_interleave(group, dim=1).to(dt) for n in ("k", "v"))
        r = orthros_attention(leaves["q"].to(dt), *kv(), leaves["q_out"].to(dt), window, scale, backend, bug,
                              kv_out=kv())
    else:
        leaves = {n: x.detach().clone().requires_grad_(True) for n, x in (("q", q), ("k", k), ("v", v),
                                                                          ("q_out", q_out))}
        r = orthros_attention(leaves["q"], leaves["k"], leaves["v"], leaves["q_out"], window, scale, backend, bug)
    loss = (r["o"].float() * do.float()).sum() + (r["o_out"].float() * do_out.float()).sum()
    loss.backward()
    out = {n: a.detach() for n, a in r.items()}
    for n, x in leaves.items():  # a stream with no rows (T_out = 0) leaves its query without a gradient
        out["d" + n] = x.grad if x.grad is not None else torch.zeros_like(x)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--golden", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", choices=["sdpa", "flex"], default="sdpa")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--bug", choices=["window-off-by-one"])
    ap.add_argument("--no-grad", action="store_true", help="forward only, even on a gradient suite")
    ap.add_argument("--grad-accum", choices=["dtype", "fp32"], default="dtype",
                    help="where autograd sums dk/dv over the two streams and the GQA group (default: the "
                         "compute dtype; fp32: float32 leaves, see orthros_attention_with_grads)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # TF32 would fail the f32 criterion (1e-5)
    torch.backends.cudnn.allow_tf32 = False
    manifest = st_io.read_manifest(args.golden)
    os.makedirs(args.out, exist_ok=True)
    dt = DTYPES[manifest["dtype"]]
    out_dtype = "F64" if manifest["dtype"] == "f64" else "F32"
    done, failed, grads = 0, [], 0
    for case in manifest["cases"]:
        t, meta = st_io.read(os.path.join(args.golden, case["file"]))
        window = int(meta["window"])
        D = t["q"].shape[2]
        scale = float(meta["scale"]) if "scale" in meta else 1.0 / math.sqrt(D)
        want_grad = "do" in t and not args.no_grad
        names = ("q", "k", "v", "q_out") + (("do", "do_out") if want_grad else ())
        x = {n: torch.from_numpy(np.ascontiguousarray(t[n])).to(args.device).to(dt) for n in names}
        try:
            if want_grad:
                r = orthros_attention_with_grads(x["q"], x["k"], x["v"], x["q_out"], x["do"], x["do_out"], window,
                                                 scale, args.backend, args.bug, args.grad_accum)
            else:
                with torch.no_grad():
                    r = orthros_attention(x["q"], x["k"], x["v"], x["q_out"], window, scale, args.backend, args.bug)
        except Exception as e:  # noqa: BLE001 -- report and go on; `orthros check` reports the missing file
            failed.append(f"{case['name']}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            continue
        res = {n: a.detach().to("cpu", torch.float64 if out_dtype == "F64" else torch.float32).numpy()
               for n, a in r.items()}
        st_io.write(os.path.join(args.out, case["name"] + ".safetensors"), res,
                    {"producer": f"examples/pytorch_port/torch_port.py --backend {args.backend}"
                                 f" --grad-accum {args.grad_accum}",
                     "torch": torch.__version__, "device": str(args.device), "bug": args.bug or "none"}, out_dtype)
        done += 1
        grads += want_grad
    print(f"torch_port[{args.backend}, {manifest['dtype']}, grad-accum {args.grad_accum}, {args.device}, "
          f"torch {torch.__version__}]: "
          f"{done} results ({grads} with gradients), {len(failed)} errors -> {args.out}")
    for f_ in failed:
        print("  error:", f_)
    if failed:
        sys.exit(1)  # some cases have no result: the run failed (run_on_gpu.sh relies on this)


if __name__ == "__main__":
    main()
