#!/usr/bin/env python3
"""An Orthros attention port in NumPy (the CPU twin of torch_port.py), validated by `orthros check`.

    python3 numpy_port.py --golden GOLDEN_DIR --out RESULTS_DIR [--bug window-off-by-one]
    orthros check --suite GOLDEN_DIR --actual-dir RESULTS_DIR

For each case of the golden manifest it reads q, k, v, q_out and the window (SPEC §5), computes
o, o_out, lse, lse_out with a masked softmax, and writes RESULTS_DIR/NAME.safetensors.
Compute precision: float64 for an f64 suite, float32 otherwise (bf16/f16 inputs are widened
exactly). Cases of a gradient suite (`orthros golden --grad`) also hold the upstream gradients
`do` [T,H_q,D] and `do_out` [T_out,H_q,D]; for those the port adds dq, dq_out, dk, dv, the
gradients of L = sum(o * do) + sum(o_out * do_out), from a hand-written float64 backward
(attention_backward). Results are written in F64 for an f64 suite, F32 otherwise.
`--bug window-off-by-one` lets every base query see w+1 keys (the `(w, 0)` instead of
`(w-1, 0)` mistake), in the forward and the backward, to show what `orthros check` reports.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402


def _visible(T, P, T_out, window, bug):
    """Boolean masks [rows, P+T] of the keys each query sees (SPEC §2), base and output stream.
    Query rows and keys are indexed by 0-based absolute position; the window includes the query."""
    key_pos = np.arange(P + T)
    lookback = window if bug == "window-off-by-one" else window - 1
    base_pos = P + np.arange(T)                      # base row i is position P+i (0-based)
    out_pos = P + T - T_out + np.arange(T_out)       # output row i: the last T_out base positions
    causal = lambda pos: key_pos[None, :] <= pos[:, None]  # noqa: E731
    base = causal(base_pos) & (key_pos[None, :] >= base_pos[:, None] - lookback)  # the w most recent keys
    return base, causal(out_pos)                     # output stream: full causal


def _softmax(qq, kk, allowed, scale):
    """Masked softmax of the scaled scores: P [H, rows, keys] and the natural-log LSE [H, rows, 1]."""
    s = np.einsum("thd,nhd->htn", qq, kk) * qq.dtype.type(scale)
    s = np.where(allowed[None], s, -np.inf)
    m = s.max(axis=-1, keepdims=True) if s.shape[-1] else np.zeros(s.shape[:-1] + (1,), s.dtype)
    e = np.exp(s - m)
    z = e.sum(axis=-1, keepdims=True)
    return e / z, m + np.log(z)


def attention(q, k, v, q_out, window, scale, bug=None):
    """q [T,Hq,D], k/v [P+T,Hkv,D], q_out [T_out,Hq,D] -> dict o, o_out, lse, lse_out."""
    T, Hq, D = q.shape
    N, Hkv, _ = k.shape
    group = Hq // Hkv
    kk = np.repeat(k, group, axis=1)                 # GQA: query head h reads KV head h // group
    vv = np.repeat(v, group, axis=1)
    masks = _visible(T, N - T, q_out.shape[0], window, bug)
    out = {}
    for suffix, qq, allowed in (("", q, masks[0]), ("_out", q_out, masks[1])):
        p, lse = _softmax(qq, kk, allowed, scale)
        out["o" + suffix] = np.einsum("htn,nhd->thd", p, vv)
        out["lse" + suffix] = lse[..., 0].T          # natural log, [rows, Hq]
    return out


def attention_backward(q, k, v, q_out, do, do_out, window, scale, bug=None, dtype=np.float64):
    """Gradients of L = sum(o * do) + sum(o_out * do_out) in float64 -> dict dq, dq_out, dk, dv.
    (`dtype=np.longdouble` evaluates the same code in extended precision, for tests.)

    Written from the math of the forward, densely, per stream (H heads at once):
        P  = softmax_masked(s Q K^T)               (recomputed; masked entries are exact zeros)
        O  = P V          =>  dV = P^T dO,  dP = dO V^T
        dS = P ⊙ (dP − rowsum(P ⊙ dP))             (softmax vector-Jacobian product)
        S  = s Q K^T      =>  dQ = s dS K,  dK = s dS^T Q
    Both streams read the same k and v, so their dK, dV add; GQA: a KV head's gradient is the sum
    over the query heads of its group (the transpose of np.repeat). Keys no query sees get 0.

    dS is evaluated as P ⊙ ((dP − c) − rowsum(P ⊙ (dP − c))), c = dP at the row's largest score:
    the same value in exact arithmetic (rowsum(P) = 1), but without cancellation. Written directly,
    a row whose softmax is one-hot to double precision (scores ~1e4: edge_large_logits) computes
    dS at its top key as P_m (dP_m − Σ_j P_j dP_j), two equal numbers subtracted, and loses it
    entirely, although it is as large as the other keys' dS together; with the shift, that key's
    term in the sum is exactly 0 and every other term keeps its relative accuracy. (Measured on
    edge_large_logits: this form agrees with the same code in np.longdouble to ~1e-13 relative; the
    direct form is off by up to 0.7 relative in dq_out, by 1e-7 .. 1e-5 in dq.)
    """
    q, k, v, q_out, do, do_out = (np.asarray(a, dtype=dtype) for a in (q, k, v, q_out, do, do_out))
    T, Hq, D = q.shape
    N, Hkv, _ = k.shape
    group = Hq // Hkv
    kk = np.repeat(k, group, axis=1)
    vv = np.repeat(v, group, axis=1)
    dkk = np.zeros_like(kk)                          # [N, Hq, D]: per query head, folded below
    dvv = np.zeros_like(vv)
    g = {}
    for name, qq, dd, allowed in zip(("dq", "dq_out"), (q, q_out), (do, do_out), _visible(T, N - T, q_out.shape[0],
                                                                                          window, bug)):
        p, _ = _softmax(qq, kk, allowed, scale)       # [Hq, rows, N]
        dp = np.einsum("thd,nhd->htn", dd, vv)
        top = np.argmax(p, axis=-1)[..., None]        # the row's most probable key (a visible one)
        dpc = dp - np.take_along_axis(dp, top, axis=-1)  # dP − c
        ds = p * (dpc - (p * dpc).sum(axis=-1, keepdims=True))
        g[name] = q.dtype.type(scale) * np.einsum("htn,nhd->thd", ds, kk)
        dkk += q.dtype.type(scale) * np.einsum("htn,thd->nhd", ds, qq)
        dvv += np.einsum("htn,thd->nhd", p, dd)
    g["dk"] = dkk.reshape(N, Hkv, group, D).sum(axis=2)  # query head h = kv * group + (h % group)
    g["dv"] = dvv.reshape(N, Hkv, group, D).sum(axis=2)
    return g


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--golden", required=True, help="directory written by `orthros golden`")
    ap.add_argument("--out", required=True, help="directory for the results (NAME.safetensors)")
    ap.add_argument("--bug", choices=["window-off-by-one"], help="inject a known porting mistake")
    args = ap.parse_args()
    manifest = st_io.read_manifest(args.golden)
    os.makedirs(args.out, exist_ok=True)
    suite_dtype = manifest["dtype"]
    cdt = np.float64 if suite_dtype == "f64" else np.float32
    out_dtype = "F64" if suite_dtype == "f64" else "F32"
    grads = 0
    for case in manifest["cases"]:
        t, meta = st_io.read(os.path.join(args.golden, case["file"]))
        window = int(meta["window"])
        D = t["q"].shape[2]
        scale = float(meta["scale"]) if "scale" in meta else 1.0 / np.sqrt(D)
        r = attention(*(t[n].astype(cdt) for n in ("q", "k", "v", "q_out")), window, scale, args.bug)
        if "do" in t:  # a gradient suite (`orthros golden --grad`): the backward too, in float64
            r.update(attention_backward(*(t[n] for n in ("q", "k", "v", "q_out", "do", "do_out")), window, scale,
                                        args.bug))
            grads += 1
        st_io.write(os.path.join(args.out, case["name"] + ".safetensors"), r,
                    {"producer": "examples/pytorch_port/numpy_port.py", "bug": args.bug or "none"}, out_dtype)
    print(f"numpy_port: {len(manifest['cases'])} results ({suite_dtype} suite, forward computed in {np.dtype(cdt).name}"
          f"{f', gradients of {grads} cases in float64' if grads else ''}{', bug ' + args.bug if args.bug else ''})"
          f" -> {args.out}")


if __name__ == "__main__":
    main()
