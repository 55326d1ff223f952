#!/usr/bin/env python3
"""A port of the whole Orthros attention LAYER in NumPy, validated by the layer golden suite.

    orthros golden --level layer --out GOLDEN_DIR --dtype bf16
    python3 numpy_layer_port.py --golden GOLDEN_DIR --out RESULTS_DIR [--bug VARIANT]
    orthros check --suite GOLDEN_DIR --actual-dir RESULTS_DIR

Written from docs/SPEC.md §2 and docs/conventions.md only (not from the C++ oracle). For each case
of a layer suite it reads x [T,d_model], x_out [T_out,d_model], the weights (w_q, w_k, w_v, w_o,
alpha, beta, alpha_out, beta_out, q_norm/k_norm when qk_norm is "1") and the KV cache before the
call (k_cache, v_cache [P,H_kv,D], post-RoPE keys), and writes RESULTS_DIR/NAME.safetensors with
y [T,d_model], y_out [T_out,d_model], k_cache_after, v_cache_after [P+T,H_kv,D]:

    k_i  = RoPE(norm_k(x_i W_K), i)            v_i = x_i W_V           (base tokens only)
    q_i  = RoPE(alpha  * norm_q(x_i  W_Q) + beta,  i)
    q'_i = RoPE(alpha' * norm_q(x'_i W_Q) + beta', i)                  (the base token's position)
    o_t  = softmax over keys [max(1, t-w+1), t] of q_t.k_j / sqrt(D), times v_j
    o'_t = softmax over keys [1, t]            of q'_t.k_j / sqrt(D), times v_j
    y = o W_O, y' = o' W_O (one W_O); the cache after = cache before + this call's k, v

Positions: base row i of the call is absolute position t = P+i+1, RoPE index t-1 (Hugging Face
position_ids); output row i is the base position P+T-T_out+i+1. RoPE is rotate-half; norm_q/norm_k
are per-head RMSNorm (eps from the metadata) with weight q_norm/k_norm; GQA: query head h reads KV
head h // (H_q/H_kv). Compute precision: float64 for an f64 suite, float32 otherwise (RoPE angles,
cos and sin in float64, then cast). Results in F64 (f64 suite) or F32.

`--bug VARIANT` injects one porting mistake of the layer (docs/porting.md "Layer suite"):
  out-rope-t+1               the output query rotated at position t+1 instead of t
  out-rope-own-counter       the output queries rotated with their own 0-based counter 0..T_out-1
  scale-offset-after-rope    q = alpha * RoPE(norm_q(x W_Q)) + beta (both streams)
  scale-offset-before-qknorm q = RoPE(norm_q(alpha * x W_Q + beta)) (both streams; a no-op without QK-norm)
  swap-alpha-beta-streams    the base query uses alpha', beta' and the output query alpha, beta
  out-appends-cache          the output tokens' keys/values (from x_out) are appended to the cache too,
                             after the base tokens' (a decode loop treating the pair as two tokens)
  separate-wo                the output stream has its own o_proj, loaded from the checkpoint's
                             nn.Linear weight ([d_model, H_q*D], out x in) with .reshape(H_q*D, d_model)
                             instead of .T: the base stream keeps the right W_O
  out-from-base-hidden       the output query is built from the base token's x instead of x_out
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402

BUGS = ["out-rope-t+1", "out-rope-own-counter", "scale-offset-after-rope", "scale-offset-before-qknorm",
        "swap-alpha-beta-streams", "out-appends-cache", "separate-wo", "out-from-base-hidden"]


def rms_norm_heads(x, weight, D, eps):
    """Per-head RMSNorm of x [N, H*D]: each head's D values divided by sqrt(mean(x^2) + eps), times weight [D]."""
    n = x.shape[0]
    h = x.reshape(n, x.shape[1] // D, D)
    inv = 1.0 / np.sqrt((h * h).mean(axis=-1, keepdims=True) + x.dtype.type(eps))
    return (h * inv * weight).reshape(x.shape)


def rope(x, pos, D, theta):
    """Rotate-half RoPE of x [N, H*D] at 0-based positions pos [N]: pairs (i, i + D/2) rotated by
    pos * theta^(-2i/D). Angles, cos and sin in float64, then cast to x's dtype."""
    n = x.shape[0]
    h = x.reshape(n, x.shape[1] // D, D)
    half = D // 2
    inv_freq = theta ** (-2.0 * np.arange(half) / D)
    ang = np.asarray(pos, dtype=np.float64)[:, None] * inv_freq[None, :]  # [N, D/2]
    c = np.cos(ang)[:, None, :].astype(x.dtype)
    s = np.sin(ang)[:, None, :].astype(x.dtype)
    x1, x2 = h[..., :half], h[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).reshape(x.shape)


def attend(q, k, v, q_pos, window, Hq, Hkv, D):
    """o [rows, H_q*D] of queries q [rows, H_q*D] at 0-based positions q_pos over keys/values of
    positions 0..N-1 (k, v [N, H_kv*D]); window=None means full causal attention."""
    rows, N = q.shape[0], k.shape[0]
    group = Hq // Hkv
    qq = q.reshape(rows, Hq, D).transpose(1, 0, 2)                          # [H_q, rows, D]
    kk = np.repeat(k.reshape(N, Hkv, D), group, axis=1).transpose(1, 0, 2)  # query head h reads KV head h // group
    vv = np.repeat(v.reshape(N, Hkv, D), group, axis=1).transpose(1, 0, 2)
    s = (qq @ kk.transpose(0, 2, 1)) * q.dtype.type(1.0 / np.sqrt(D))     # [H_q, rows, N]
    key = np.arange(N)[None, :]
    allowed = key <= q_pos[:, None]
    if window is not None:
        allowed &= key >= q_pos[:, None] - (window - 1)  # w keys, the current one included
    s = np.where(allowed[None], s, -np.inf)
    m = s.max(axis=-1, keepdims=True) if N else np.zeros(s.shape[:-1] + (1,), s.dtype)
    e = np.exp(s - m)
    p = e / e.sum(axis=-1, keepdims=True)
    return (p @ vv).transpose(1, 0, 2).reshape(rows, Hq * D)


def layer(t, meta, cdt, bug=None):
    """One call of the Orthros attention layer on the tensors `t` of a layer case -> dict of results."""
    Hq, Hkv, D = int(meta["num_q_heads"]), int(meta["num_kv_heads"]), int(meta["head_dim"])
    window, theta, eps = int(meta["window"]), float(meta["rope_theta"]), float(meta["rms_eps"])
    qk_norm = meta["qk_norm"] == "1"
    g = {n: a.astype(cdt) for n, a in t.items()}
    x, x_out = g["x"], g["x_out"]
    T, T_out, dm = x.shape[0], x_out.shape[0], x.shape[1]
    P = g["k_cache"].shape[0]
    pos = P + np.arange(T)                   # 0-based RoPE index of base row i: position P+i+1
    pos_out = P + T - T_out + np.arange(T_out)  # output rows: their base tokens' positions
    if bug == "out-rope-t+1":
        pos_out = pos_out + 1
    elif bug == "out-rope-own-counter":
        pos_out = np.arange(T_out)
    if bug == "out-from-base-hidden":
        x_out = x[T - T_out:]

    def norm_q(a):
        return rms_norm_heads(a, g["q_norm"], D, eps) if qk_norm else a

    def queries(h, alpha, beta, p):
        lin = h @ g["w_q"]
        if bug == "scale-offset-after-rope":
            return alpha * rope(norm_q(lin), p, D, theta) + beta
        if bug == "scale-offset-before-qknorm":
            return rope(norm_q(alpha * lin + beta), p, D, theta)
        return rope(alpha * norm_q(lin) + beta, p, D, theta)

    def keys(h, p):
        lin = h @ g["w_k"]
        return rope(rms_norm_heads(lin, g["k_norm"], D, eps) if qk_norm else lin, p, D, theta)

    ab, ab_out = (g["alpha"], g["beta"]), (g["alpha_out"], g["beta_out"])
    if bug == "swap-alpha-beta-streams":
        ab, ab_out = ab_out, ab
    q = queries(x, *ab, pos)
    q_out = queries(x_out, *ab_out, pos_out)
    k_all = np.concatenate([g["k_cache"].reshape(P, Hkv * D), keys(x, pos)])  # cache + this call's keys
    v_all = np.concatenate([g["v_cache"].reshape(P, Hkv * D), x @ g["w_v"]])
    o = attend(q, k_all, v_all, P + np.arange(T), window, Hq, Hkv, D)
    o_out = attend(q_out, k_all, v_all, P + T - T_out + np.arange(T_out), None, Hq, Hkv, D)
    w_o = g["w_o"]
    w_o_out = w_o
    if bug == "separate-wo":
        # The checkpoint stores o_proj as nn.Linear.weight [d_model, H_q*D]; the output stream's copy
        # is loaded with a reshape instead of a transpose.
        w_o_out = np.ascontiguousarray(w_o.T).reshape(Hq * D, dm)
    if bug == "out-appends-cache":
        k_all = np.concatenate([k_all, keys(x_out, P + T - T_out + np.arange(T_out))])
        v_all = np.concatenate([v_all, x_out @ g["w_v"]])
    return {"y": o @ w_o, "y_out": o_out @ w_o_out,
            "k_cache_after": k_all.reshape(k_all.shape[0], Hkv, D), "v_cache_after": v_all.reshape(v_all.shape[0], Hkv, D)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--golden", required=True, help="directory written by `orthros golden --level layer`")
    ap.add_argument("--out", required=True, help="directory for the results (NAME.safetensors)")
    ap.add_argument("--bug", choices=BUGS, help="inject a known porting mistake of the layer")
    args = ap.parse_args()
    manifest = st_io.read_manifest(args.golden)
    if manifest.get("level") != "layer":
        print(f"{os.path.basename(sys.argv[0])}: error: --golden {args.golden} is not a layer suite (manifest "
              "\"level\" is not \"layer\"; write one with `orthros golden --level layer --out DIR`)", file=sys.stderr)
        sys.exit(2)
    os.makedirs(args.out, exist_ok=True)
    suite_dtype = manifest["dtype"]
    cdt = np.float64 if suite_dtype == "f64" else np.float32
    out_dtype = "F64" if suite_dtype == "f64" else "F32"
    for case in manifest["cases"]:
        t, meta = st_io.read(os.path.join(args.golden, case["file"]))
        r = layer(t, meta, cdt, args.bug)
        st_io.write(os.path.join(args.out, case["name"] + ".safetensors"), r,
                    {"producer": "examples/pytorch_port/numpy_layer_port.py", "bug": args.bug or "none"}, out_dtype)
    print(f"numpy_layer_port: {len(manifest['cases'])} results ({suite_dtype} suite, computed in "
          f"{np.dtype(cdt).name}{', bug ' + args.bug if args.bug else ''}) -> {args.out}")


if __name__ == "__main__":
    main()
