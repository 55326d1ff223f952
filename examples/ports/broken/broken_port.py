#!/usr/bin/env python3
"""Deliberately broken NumPy ports of Orthros attention: one known convention mistake each.

    python3 broken_port.py --golden GOLDEN_DIR --out RESULTS_DIR --mistake MISTAKE
    orthros check --suite GOLDEN_DIR --actual-dir RESULTS_DIR --diagnose

Each MISTAKE is one that attention ports are known to make (docs/SPEC.md §8, docs/ports.md), and
`orthros check --diagnose` must name it; `--mistake none` is the correct port (it must pass, and
--diagnose finds nothing to diagnose). The mistakes (ids as --diagnose prints them):
  window+1, window-1          the base window holds w+1 / w-1 keys (FlashAttention window_size=(w, 0)
                              where (w-1, 0) was meant; cuDNN window_left off by one)
  lse-log2                    the LSE returned in log2 units (the exp2 domain's, not times ln 2)
  out-top-left                the output stream's causal mask aligned top-left (row i sees keys 1..i+1)
  base-top-left               the base stream aligned top-left (the KV cache ignored in the mask; P > 0)
  scale-1/D, scale-1          softmax scale 1/D or 1 instead of 1/sqrt(D)
  gqa-modulo                  query head h reads KV head h % H_kv (interleaved) instead of h / (H_q/H_kv)
  out-at-t+1                  the output query placed at position t+1 (one key more)
  dkv-without-out             dk/dv from the base stream only
  streams-masks-swapped       base queries full causal, output queries windowed
  streams-outputs-swapped     o/o_out, lse/lse_out, dq/dq_out exchanged (cases with T_out = T only)

Forward in float32 (float64 for an f64 suite), gradients in float64, results in F32 (F64), like
examples/pytorch_port/numpy_port.py, whose masked-softmax forward and backward this generalizes.
"""
import argparse
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, os.pardir, "pytorch_port"))
import st_io  # noqa: E402

MISTAKES = ["none", "window+1", "window-1", "lse-log2", "out-top-left", "base-top-left", "scale-1/D", "scale-1",
            "gqa-modulo", "out-at-t+1", "dkv-without-out", "streams-masks-swapped", "streams-outputs-swapped"]


def masks(T, P, T_out, window, mistake):
    """Boolean [rows, P+T] masks of the keys each base and output row sees, under `mistake`."""
    key = np.arange(P + T)
    lookback = window - 1 + (mistake == "window+1") - (mistake == "window-1")
    base_pos = (0 if mistake == "base-top-left" else P) + np.arange(T)
    out_pos = (0 if mistake == "out-top-left" else P + T - T_out) + np.arange(T_out)
    if mistake == "out-at-t+1":
        out_pos = np.minimum(out_pos + 1, P + T - 1)
    causal = lambda pos: key[None, :] <= pos[:, None]  # noqa: E731
    windowed = lambda pos: causal(pos) & (key[None, :] >= pos[:, None] - lookback)  # noqa: E731
    if mistake == "streams-masks-swapped":
        return causal(base_pos), windowed(out_pos)
    return windowed(base_pos), causal(out_pos)


def kv_heads(k, Hq, mistake):
    """k [N, H_kv, D] repeated to [N, H_q, D]: query head h reads KV head h // group (SPEC) or h % H_kv."""
    Hkv = k.shape[1]
    if mistake == "gqa-modulo":
        return k[:, np.arange(Hq) % Hkv]
    return np.repeat(k, Hq // Hkv, axis=1)


def softmax(qq, kk, allowed, scale):
    s = np.einsum("thd,nhd->htn", qq, kk) * qq.dtype.type(scale)
    s = np.where(allowed[None], s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - m)
    z = e.sum(axis=-1, keepdims=True)
    return e / z, m + np.log(z)


def port(t, window, scale, mistake, cdt):
    """The broken port's o, o_out, lse, lse_out (+ dq, dq_out, dk, dv when the case has do/do_out)."""
    q, k, v, q_out = (t[n].astype(cdt) for n in ("q", "k", "v", "q_out"))
    T, Hq, D = q.shape
    N = k.shape[0]
    T_out = q_out.shape[0]
    if mistake == "scale-1/D":
        scale = 1.0 / D
    elif mistake == "scale-1":
        scale = 1.0
    m_base, m_out = masks(T, N - T, T_out, window, mistake)
    out = {}
    for sfx, qq, allowed in (("", q, m_base), ("_out", q_out, m_out)):
        p, lse = softmax(qq, kv_heads(k, Hq, mistake), allowed, scale)
        out["o" + sfx] = np.einsum("htn,nhd->thd", p, kv_heads(v, Hq, mistake))
        out["lse" + sfx] = lse[..., 0].T * (cdt(1.0 / math.log(2.0)) if mistake == "lse-log2" else cdt(1))
    if "do" in t:
        g64 = {n: t[n].astype(np.float64) for n in ("q", "k", "v", "q_out", "do", "do_out")}
        kk, vv = kv_heads(g64["k"], Hq, mistake), kv_heads(g64["v"], Hq, mistake)
        dkk, dvv = np.zeros_like(kk), np.zeros_like(vv)
        for name, qq, dd, allowed in (("dq", g64["q"], g64["do"], m_base), ("dq_out", g64["q_out"], g64["do_out"],
                                                                            m_out)):
            p, _ = softmax(qq, kk, allowed, scale)
            dp = np.einsum("thd,nhd->htn", dd, vv)
            ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
            out[name] = scale * np.einsum("htn,nhd->thd", ds, kk)
            if name == "dq_out" and mistake == "dkv-without-out":
                continue
            dkk += scale * np.einsum("htn,thd->nhd", ds, qq)
            dvv += np.einsum("htn,thd->nhd", p, dd)
        Hkv = k.shape[1]
        if mistake == "gqa-modulo":  # query head h fed KV head h % H_kv: fold the gradients back the same way
            out["dk"] = np.stack([dkk[:, np.arange(Hq) % Hkv == j].sum(axis=1) for j in range(Hkv)], axis=1)
            out["dv"] = np.stack([dvv[:, np.arange(Hq) % Hkv == j].sum(axis=1) for j in range(Hkv)], axis=1)
        else:
            out["dk"] = dkk.reshape(N, Hkv, Hq // Hkv, D).sum(axis=2)
            out["dv"] = dvv.reshape(N, Hkv, Hq // Hkv, D).sum(axis=2)
    if mistake == "streams-outputs-swapped" and T_out == T:
        for a, b in (("o", "o_out"), ("lse", "lse_out"), ("dq", "dq_out")):
            if a in out:
                out[a], out[b] = out[b], out[a]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--golden", required=True, help="directory written by `orthros golden`")
    ap.add_argument("--out", required=True, help="directory for the results (NAME.safetensors)")
    ap.add_argument("--mistake", required=True, choices=MISTAKES, help="the convention mistake to make")
    ap.add_argument("--only", help="run only cases whose name contains one of these (comma-separated)")
    args = ap.parse_args()
    manifest = st_io.read_manifest(args.golden)
    os.makedirs(args.out, exist_ok=True)
    f64 = manifest["dtype"] == "f64"
    n = 0
    for case in manifest["cases"]:
        if args.only and not any(o in case["name"] for o in args.only.split(",")):
            continue
        t, meta = st_io.read(os.path.join(args.golden, case["file"]))
        D = t["q"].shape[2]
        scale = float(meta["scale"]) if "scale" in meta else 1.0 / math.sqrt(D)
        r = port(t, int(meta["window"]), scale, args.mistake, np.float64 if f64 else np.float32)
        st_io.write(os.path.join(args.out, case["name"] + ".safetensors"), r,
                    {"producer": "examples/ports/broken/broken_port.py", "mistake": args.mistake},
                    "F64" if f64 else "F32")
        n += 1
    print(f"broken_port ({args.mistake}): {n} results -> {args.out}")


if __name__ == "__main__":
    main()
