#!/usr/bin/env python3
"""An Orthros attention port in NumPy (the CPU twin of torch_port.py), validated by `orthros check`.

    python3 numpy_port.py --golden GOLDEN_DIR --out RESULTS_DIR [--bug window-off-by-one]
    orthros check --suite GOLDEN_DIR --actual-dir RESULTS_DIR

For each case of the golden manifest it reads q, k, v, q_out and the window (SPEC §5), computes
o, o_out, lse, lse_out with a masked softmax, and writes RESULTS_DIR/NAME.safetensors.
Compute precision: float64 for an f64 suite, float32 otherwise (bf16/f16 inputs are widened
exactly). `--bug window-off-by-one` lets every base query see w+1 keys (the `(w, 0)` instead of
`(w-1, 0)` mistake) to show what `orthros check` reports.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402


def attention(q, k, v, q_out, window, scale, bug=None):
    """q [T,Hq,D], k/v [P+T,Hkv,D], q_out [T_out,Hq,D] -> dict o, o_out, lse, lse_out."""
    T, Hq, D = q.shape
    N, Hkv, _ = k.shape
    P, T_out = N - T, q_out.shape[0]
    group = Hq // Hkv
    kk = np.repeat(k, group, axis=1)                 # GQA: query head h reads KV head h // group
    vv = np.repeat(v, group, axis=1)
    key_pos = np.arange(N)                           # 0-based absolute positions of the keys
    lookback = window if bug == "window-off-by-one" else window - 1
    out = {}
    for suffix, qq, pos, windowed in (("", q, P + np.arange(T), True),
                                      ("_out", q_out, P + T - T_out + np.arange(T_out), False)):
        allowed = key_pos[None, :] <= pos[:, None]   # causal: keys up to the query's own position
        if windowed:                                 # sliding window: the w most recent keys
            allowed &= key_pos[None, :] >= pos[:, None] - lookback
        s = np.einsum("thd,nhd->htn", qq, kk) * qq.dtype.type(scale)
        s = np.where(allowed[None], s, -np.inf)
        m = s.max(axis=-1, keepdims=True) if s.shape[-1] else np.zeros(s.shape[:-1] + (1,), s.dtype)
        e = np.exp(s - m)
        z = e.sum(axis=-1, keepdims=True)
        out["o" + suffix] = np.einsum("htn,nhd->thd", e / z, vv)
        out["lse" + suffix] = (m + np.log(z))[..., 0].T  # natural log, [rows, Hq]
    return out


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
    for case in manifest["cases"]:
        t, meta = st_io.read(os.path.join(args.golden, case["file"]))
        window = int(meta["window"])
        D = t["q"].shape[2]
        scale = float(meta["scale"]) if "scale" in meta else 1.0 / np.sqrt(D)
        r = attention(*(t[n].astype(cdt) for n in ("q", "k", "v", "q_out")), window, scale, args.bug)
        st_io.write(os.path.join(args.out, case["name"] + ".safetensors"), r,
                    {"producer": "examples/pytorch_port/numpy_port.py", "bug": args.bug or "none"}, out_dtype)
    print(f"numpy_port: {len(manifest['cases'])} results ({suite_dtype} suite, computed in {np.dtype(cdt).name}"
          f"{', bug ' + args.bug if args.bug else ''}) -> {args.out}")


if __name__ == "__main__":
    main()
