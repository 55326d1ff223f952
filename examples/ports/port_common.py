"""What every library adapter of examples/ports/ shares: reading a golden suite, a dense float64
reference for the self-check, the layer around the library's attention, writing the results.

An adapter supplies one function

    attention(q, k, v, q_out, window, scale, grads=None) -> dict

on torch tensors q [T, H_q, D], k/v [P+T, H_kv, D], q_out [T_out, H_q, D] (the suite's dtype, on the
device), window w (SPEC §2: w keys, the current one included), scale; it returns o, o_out, lse,
lse_out (natural log, [rows, H_q]) computed with the library's own calls and, when `grads` =
(do, do_out) is given, dq, dq_out, dk, dv (dk/dv summing both streams). It raises
`Unsupported(reason)` for a case the library cannot express: the case is skipped (no result file;
`orthros check --skip-missing` reports it) and the reason logged.
"""
import json
import math
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, "pytorch_port"))
import st_io  # noqa: E402  (examples/pytorch_port/st_io.py: safetensors on NumPy)


class Unsupported(Exception):
    """The library cannot express this case (its reason is logged and the case skipped)."""


def torch_dtype(suite_dtype):
    import torch
    return {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "f64": torch.float64}[suite_dtype]


def dense_reference(q, k, v, q_out, window, scale, grads=None):
    """SPEC §2 densely in float64 (torch, any device): the self-check's reference, autograd for the gradients."""
    import torch
    T, Hq, D = q.shape
    N, Hkv, _ = k.shape
    P, T_out = N - T, q_out.shape[0]
    leaves = [x.detach().double().requires_grad_(grads is not None) for x in (q, k, v, q_out)]
    q64, k64, v64, qo64 = leaves
    kk, vv = (x.repeat_interleave(Hq // Hkv, dim=1) for x in (k64, v64))  # query head h reads KV head h // group
    key = torch.arange(N, device=q.device)
    out = {}
    for sfx, qq, pos, win in (("", q64, P + torch.arange(T, device=q.device), window),
                              ("_out", qo64, P + T - T_out + torch.arange(T_out, device=q.device), None)):
        s = torch.einsum("thd,nhd->htn", qq, kk) * scale
        allowed = key[None, :] <= pos[:, None]
        if win is not None:
            allowed &= key[None, :] > pos[:, None] - win
        s = s.masked_fill(~allowed[None], float("-inf"))
        lse = torch.logsumexp(s, dim=-1)                                   # [H, rows]
        out["o" + sfx] = torch.einsum("htn,nhd->thd", torch.softmax(s, dim=-1), vv)
        out["lse" + sfx] = lse.transpose(0, 1)
    if grads is not None:
        do, do_out = grads
        loss = (out["o"] * do.double()).sum() + (out["o_out"] * do_out.double()).sum()
        g = torch.autograd.grad(loss, leaves)
        out.update(dq=g[0], dk=g[1], dv=g[2], dq_out=g[3])
    return {n: t.detach() for n, t in out.items()}


def random_case(device, dtype, T=12, P=3, T_out=4, Hq=4, Hkv=2, D=64, seed=0):
    """A small dense case (never zeros) for the self-check: q, k, v, q_out, do, do_out."""
    import torch
    g = torch.Generator(device="cpu").manual_seed(seed)

    def r(*shape):
        x = (torch.rand(*shape, generator=g) * 0.95 + 0.05) * torch.where(torch.rand(*shape, generator=g) < 0.5, -1, 1)
        return x.to(device=device, dtype=dtype)
    return r(T, Hq, D), r(P + T, Hkv, D), r(P + T, Hkv, D), r(T_out, Hq, D), r(T, Hq, D), r(T_out, Hq, D)


def compare(got, ref, names):
    """Max abs error per tensor (float64) and the largest."""
    err = {n: float((got[n].double() - ref[n]).abs().max()) if ref[n].numel() else 0.0 for n in names}
    return err, max(err.values())


def self_check(name, variants, device, dtype, grad, window=4, tol=None):
    """Runs each candidate convention `variants` {label: attention_fn} on a small dense case against
    dense_reference() and returns the label of the first that matches (max abs error below `tol`:
    5e-2 bf16, 1e-2 f16, 1e-4 f32), printing every candidate's error. Exits with status 3 when none does:
    the adapter would be judged on a convention it does not follow."""
    import torch
    tol = tol or {torch.bfloat16: 5e-2, torch.float16: 1e-2, torch.float32: 1e-4}.get(dtype, 1e-9)
    q, k, v, q_out, do, do_out = random_case(device, dtype)
    scale = 1.0 / math.sqrt(q.shape[-1])
    ref = dense_reference(q, k, v, q_out, window, scale, (do, do_out) if grad else None)
    names = ["o", "o_out", "lse", "lse_out"] + (["dq", "dq_out", "dk", "dv"] if grad else [])
    found = None
    for label, fn in variants.items():
        try:
            got = fn(q, k, v, q_out, window, scale, (do, do_out) if grad else None)
            err, worst = compare(got, ref, names)
            detail = ", ".join(f"{n} {e:.1e}" for n, e in err.items())
        except Exception as e:  # a convention the library rejects
            worst, detail = float("inf"), f"{type(e).__name__}: {e}"
        ok = worst <= tol
        print(f"[{name} self-check] {label}: {'MATCHES' if ok else 'no'} (max abs error {worst:.2e}, tol {tol:.0e}; "
              f"{detail})", flush=True)
        if ok and found is None:
            found = label
    if found is None:
        print(f"[{name} self-check] FAILED: no convention reproduces the dense float64 reference", flush=True)
        sys.exit(3)
    print(f"[{name} self-check] convention found: {found}", flush=True)
    return found


def layer_with(attention, t, meta, device, dtype):
    """One Orthros layer call (examples/pytorch_port/numpy_layer_port.py's math, float32 NumPy for the
    projections, RoPE and norms) with the attention operator replaced by the library's `attention`
    (inputs rounded to the suite dtype on the device). Returns y, y_out, k_cache_after, v_cache_after."""
    import numpy_layer_port as nl
    import torch
    Hq, Hkv, D = int(meta["num_q_heads"]), int(meta["num_kv_heads"]), int(meta["head_dim"])
    window, theta, eps = int(meta["window"]), float(meta["rope_theta"]), float(meta["rms_eps"])
    qk_norm = meta["qk_norm"] == "1"
    g = {n: a.astype(np.float32) for n, a in t.items()}
    x, x_out = g["x"], g["x_out"]
    T, T_out, P = x.shape[0], x_out.shape[0], g["k_cache"].shape[0]

    def norm(a, w):
        return nl.rms_norm_heads(a, w, D, eps) if qk_norm else a

    def queries(h, alpha, beta, p):
        return nl.rope(alpha * norm(h @ g["w_q"], g.get("q_norm")) + beta, p, D, theta)

    q = queries(x, g["alpha"], g["beta"], P + np.arange(T))
    q_out = queries(x_out, g["alpha_out"], g["beta_out"], P + T - T_out + np.arange(T_out))
    k_new = nl.rope(norm(x @ g["w_k"], g.get("k_norm")), P + np.arange(T), D, theta)
    k_all = np.concatenate([g["k_cache"].reshape(P, Hkv * D), k_new])
    v_all = np.concatenate([g["v_cache"].reshape(P, Hkv * D), x @ g["w_v"]])
    dev = lambda a, h: torch.from_numpy(np.ascontiguousarray(a.reshape(a.shape[0], h, D))).to(device, dtype)  # noqa: E731
    r = attention(dev(q, Hq), dev(k_all, Hkv), dev(v_all, Hkv), dev(q_out, Hq), window, 1.0 / math.sqrt(D))
    o = r["o"].float().cpu().numpy().reshape(T, Hq * D)
    o_out = r["o_out"].float().cpu().numpy().reshape(T_out, Hq * D)
    return {"y": o @ g["w_o"], "y_out": o_out @ g["w_o"], "k_cache_after": k_all.reshape(-1, Hkv, D),
            "v_cache_after": v_all.reshape(-1, Hkv, D)}


def run_suite(name, attention, golden, out, device, producer):
    """Runs `attention` (or layer_with(attention) on a layer suite) on every case of the suite and
    writes OUT/NAME.safetensors (F32); cases raising Unsupported (or any other exception: "raised
    ...") are skipped and listed with the reason in OUT/skipped.json. Returns (written, skipped)."""
    import torch
    manifest = st_io.read_manifest(golden)
    dtype = torch_dtype(manifest["dtype"])
    layer = manifest.get("level") == "layer"
    os.makedirs(out, exist_ok=True)
    written, skipped = 0, {}
    t0 = time.time()
    for case in manifest["cases"]:
        t, meta = st_io.read(os.path.join(golden, case["file"]))
        try:
            if layer:
                r = layer_with(attention, t, meta, device, dtype)
            else:
                dev = {n: torch.from_numpy(np.ascontiguousarray(a)).to(device, dtype) for n, a in t.items()}
                D = dev["q"].shape[2]
                scale = float(meta["scale"]) if "scale" in meta else 1.0 / math.sqrt(D)
                grads = (dev["do"], dev["do_out"]) if "do" in dev else None
                r = attention(dev["q"], dev["k"], dev["v"], dev["q_out"], int(meta["window"]), scale, grads)
                r = {n: x.float().cpu().numpy() for n, x in r.items()}
        except Unsupported as e:
            skipped[case["name"]] = str(e)
            print(f"[{name}] skip {case['name']}: {e}", flush=True)
            continue
        except Exception as e:  # the library raised on a valid case: recorded, and the run goes on
            skipped[case["name"]] = f"raised {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            print(f"[{name}] ERROR on {case['name']}: {skipped[case['name']]}", flush=True)
            continue
        st_io.write(os.path.join(out, case["name"] + ".safetensors"), r, {"producer": producer}, "F32")
        written += 1
    with open(os.path.join(out, "skipped.json"), "w") as f:
        json.dump(skipped, f, indent=1)
    print(f"[{name}] {written} results, {len(skipped)} skipped ({time.time() - t0:.1f} s) -> {out}", flush=True)
    return written, skipped


def main(name, variants, doc, producer):
    """The command line shared by the adapters:
        ADAPTER.py --golden DIR --out DIR [--device cuda] [--self-check-only]
    Self-checks (forward, and backward when the suite has gradients), then runs the suite with the
    convention found."""
    import argparse
    import torch
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--golden", help="directory written by `orthros golden`")
    ap.add_argument("--out", help="directory for the results (NAME.safetensors)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default=None, help="self-check dtype when no --golden (bf16, f16, f32)")
    ap.add_argument("--self-check-only", action="store_true")
    a = ap.parse_args()
    manifest = st_io.read_manifest(a.golden) if a.golden else None
    dtype = torch_dtype(manifest["dtype"] if manifest else (a.dtype or "bf16"))
    grad = bool(manifest and manifest.get("grad"))
    print(f"[{name}] torch {torch.__version__}, device {a.device}"
          f"{' (' + torch.cuda.get_device_name() + ')' if a.device.startswith('cuda') else ''}, {dtype}", flush=True)
    found = self_check(name, variants, a.device, dtype, grad)
    if a.self_check_only or not a.golden:
        return
    if not a.out:
        sys.exit(f"{name}: --out is required with --golden")
    run_suite(name, variants[found], a.golden, a.out, a.device, f"{producer} ({found})")
