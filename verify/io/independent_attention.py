#!/usr/bin/python3
"""Independent float64 checker of `orthros attention` (SPEC §2 and §5).

Written from the SPEC alone, sharing no code with the C++ oracle: its own safetensors
reader/writer (struct + json; no safetensors package) and a masked-softmax NumPy
implementation of the Orthros attention operator:

    o_t  = softmax_{j in [max(1, t-w+1), t]} (q_t . k_j * s) v_j     every base token t
    o'_t = softmax_{j in [1, t]}             (q'_t . k_j * s) v_j     the last T_out base tokens
    lse  = log sum_j exp(q . k_j * s)        (natural log, over the same keys)

with base tokens at positions P+1..P+T, GQA (query head h reads KV head h // (H_q/H_kv)) and
s = 1/sqrt(D) unless the case sets `scale`.

It draws random cases (fixed seed, printed) covering GQA ratios 1/2/3/7, w = 1, w >= T,
T_out = T, T_out = 0, P > 0, a custom scale, large logits and F64/F32/BF16/F16 inputs; writes
each as a case file, runs `orthros attention --in CASE --out RESULT`, reads the result and asserts
relative error ||out - ref||_F / ||ref||_F <= 1e-12 for o, o_out, lse, lse_out (F64 results).
It also runs `--precision f32` and holds it to SPEC §6's fp32 bound, 1e-5.

Usage: independent_attention.py --orthros PATH [--seed N] [--workdir DIR]
Exit status 0 when every case passes.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

# ---------------------------------------------------------------- safetensors, from scratch
NP_DTYPE = {"F64": "<f8", "F32": "<f4", "F16": "<f2"}  # BF16 handled by hand (NumPy has none)
ELEM = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}


def bf16_bits(x32):
    """float32 array -> uint16 bfloat16 bits, round to nearest even (finite inputs)."""
    b = np.ascontiguousarray(x32, dtype="<f4").view("<u4").astype(np.uint64)
    b = b + 0x7FFF + ((b >> 16) & 1)
    return (b >> 16).astype("<u2")


def bf16_value(bits):
    """uint16 bfloat16 bits -> float64 values (exact)."""
    return (bits.astype("<u4") << 16).view("<f4").astype(np.float64)


def encode(values, dtype):
    """float64 array -> (raw little-endian bytes, the exact float64 values those bytes hold)."""
    if dtype == "BF16":
        bits = bf16_bits(values.astype(np.float32))
        return bits.tobytes(), bf16_value(bits).reshape(values.shape)
    arr = values.astype(NP_DTYPE[dtype])
    return arr.tobytes(), arr.astype(np.float64)


def decode(raw, dtype, shape):
    n = int(np.prod(shape)) if shape else 1
    if dtype == "BF16":
        return bf16_value(np.frombuffer(raw, dtype="<u2", count=n)).reshape(shape)
    return np.frombuffer(raw, dtype=NP_DTYPE[dtype], count=n).astype(np.float64).reshape(shape)


def write_safetensors(path, tensors, metadata):
    """tensors: name -> (dtype, shape, raw bytes)."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    """-> (name -> (dtype, float64 array), metadata)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        b, en = e["data_offsets"]
        assert en - b == ELEM[e["dtype"]] * int(np.prod(e["shape"])), f"{path}: bad offsets for {name}"
        out[name] = (e["dtype"], decode(body[b:en], e["dtype"], tuple(e["shape"])))
    return out, meta


# ---------------------------------------------------------------- SPEC §2 in float64
def reference(q, k, v, q_out, window, scale):
    """q [T,Hq,D], k/v [P+T,Hkv,D], q_out [T_out,Hq,D] -> o, o_out, lse, lse_out (float64)."""
    T, Hq, D = q.shape
    N, Hkv, _ = k.shape
    P, T_out = N - T, q_out.shape[0]
    s = 1.0 / np.sqrt(D) if scale is None else scale
    pos_q = P + 1 + np.arange(T)                 # absolute positions of base tokens (1-based)
    pos_k = 1 + np.arange(N)                     # absolute positions of keys
    swa = (pos_k[None, :] <= pos_q[:, None]) & (pos_k[None, :] >= pos_q[:, None] - window + 1)
    causal = pos_k[None, :] <= pos_q[T - T_out:, None]

    def attend(qq, mask):
        o = np.zeros(qq.shape)
        lse = np.zeros(qq.shape[:2])
        for h in range(Hq):
            g = h // (Hq // Hkv)
            scores = (qq[:, h, :] @ k[:, g, :].T) * s
            scores = np.where(mask, scores, -np.inf)
            m = scores.max(axis=1, keepdims=True)
            e = np.exp(scores - m)
            l = e.sum(axis=1, keepdims=True)
            o[:, h, :] = (e / l) @ v[:, g, :]
            lse[:, h] = (m + np.log(l))[:, 0]
        return o, lse

    o, lse = attend(q, swa)
    o_out, lse_out = attend(q_out, causal)
    return o, o_out, lse, lse_out


# ---------------------------------------------------------------- cases
# (name, T, P, T_out, Hq, Hkv, D, window, input dtype, scale or None, magnitude)
CASES = [
    ("gqa2_prefill_f64", 12, 0, 1, 4, 2, 16, 8, "F64", None, 1.0),
    ("mha_pt_f64", 9, 0, 9, 3, 3, 8, 4, "F64", None, 1.0),
    ("gqa3_sft_f32", 10, 0, 4, 6, 2, 8, 3, "F32", None, 1.0),
    ("gqa7_f32", 7, 0, 2, 7, 1, 4, 5, "F32", None, 1.0),
    ("w1_f64", 8, 0, 3, 4, 2, 8, 1, "F64", None, 1.0),
    ("w1_bf16_cache", 6, 5, 2, 4, 1, 8, 1, "BF16", None, 1.0),
    ("w_ge_T_f16", 9, 0, 9, 2, 1, 16, 50, "F16", None, 1.0),
    ("w_eq_T_bf16", 8, 0, 8, 4, 2, 8, 8, "BF16", None, 1.0),
    ("decode_P_gt0_f64", 1, 20, 1, 4, 2, 16, 8, "F64", None, 1.0),
    ("chunk_P_gt0_Tout0_f32", 6, 11, 0, 4, 2, 8, 4, "F32", None, 1.0),
    ("chunk_P_gt0_f16", 5, 13, 5, 8, 2, 16, 7, "F16", None, 1.0),
    ("custom_scale_bf16", 7, 3, 2, 4, 4, 8, 3, "BF16", 0.3125, 1.0),
    ("large_logits_f64", 6, 2, 6, 2, 1, 8, 4, "F64", 1.0, 40.0),
    ("qwen_shape_f32", 5, 3, 2, 32, 8, 128, 4, "F32", None, 1.0),
]


def nonzero_normal(rng, shape, mag):
    x = rng.standard_normal(shape) * mag
    x[np.abs(x) < 1e-3 * mag] = 0.5 * mag  # never zeros
    return x


def rel_err(out, ref):
    den = np.linalg.norm(ref)
    return np.linalg.norm(out - ref) / den if den > 0 else np.linalg.norm(out)


def run_case(args, rng, case):
    name, T, P, T_out, Hq, Hkv, D, w, dtype, scale, mag = case
    raw, exact = {}, {}
    for tname, shape in (("q", (T, Hq, D)), ("k", (P + T, Hkv, D)), ("v", (P + T, Hkv, D)),
                         ("q_out", (T_out, Hq, D))):
        b, x = encode(nonzero_normal(rng, shape, mag), dtype)
        raw[tname] = (dtype, shape, b)
        exact[tname] = x
    meta = {"window": str(w)}
    if scale is not None:
        meta["scale"] = repr(scale)
    case_path = os.path.join(args.workdir, name + ".safetensors")
    write_safetensors(case_path, raw, meta)
    ref = reference(exact["q"], exact["k"], exact["v"], exact["q_out"], w, scale)
    ok = True
    for precision, want_dtype, tol in (("f64", "F64", 1e-12), ("f32", "F32", 1e-5)):
        out_path = os.path.join(args.workdir, f"{name}.{precision}.result.safetensors")
        p = subprocess.run([args.orthros, "attention", "--in", case_path, "--out", out_path,
                            "--precision", precision], capture_output=True, text=True)
        if p.returncode != 0:
            print(f"FAIL {name} [{precision}]: orthros exited {p.returncode}: {p.stderr.strip()}")
            ok = False
            continue
        got, _ = read_safetensors(out_path)
        errs = []
        for rname, r in zip(("o", "o_out", "lse", "lse_out"), ref):
            if rname not in got:
                print(f"FAIL {name} [{precision}]: result lacks {rname}")
                ok = False
                continue
            gd, g = got[rname]
            if gd != want_dtype or g.shape != r.shape:
                print(f"FAIL {name} [{precision}]: {rname} is {gd} {g.shape}, expected {want_dtype} {r.shape}")
                ok = False
                continue
            if r.size == 0:
                errs.append(f"{rname}=empty")
                continue
            if not np.all(np.isfinite(g)):
                print(f"FAIL {name} [{precision}]: {rname} has non-finite values")
                ok = False
                continue
            e = rel_err(g, r)
            errs.append(f"{rname}={e:.2e}")
            if not e <= tol:
                print(f"FAIL {name} [{precision}]: {rname} relative error {e:.3e} > {tol:g}")
                ok = False
        print(f"{'ok  ' if ok else 'FAIL'} {name:24s} [{precision}] T={T} P={P} T_out={T_out} Hq={Hq} "
              f"Hkv={Hkv} D={D} w={w} in={dtype}: " + " ".join(errs))
    # The check can fail: a window off by one (SPEC §8) must be visible at this tolerance.
    if w < P + T and mag == 1.0:  # (large logits: softmax is near one-hot, an extra key may weigh ~0)
        got, _ = read_safetensors(os.path.join(args.workdir, f"{name}.f64.result.safetensors"))
        wrong = reference(exact["q"], exact["k"], exact["v"], exact["q_out"], w + 1, scale)[0]
        if not rel_err(got["o"][1], wrong) > 1e-6:
            print(f"FAIL {name}: result also matches window {w + 1}; the check cannot see an off-by-one")
            ok = False
    # w = 1 needs no oracle: o_t = v_t exactly (SPEC §4.4).
    if w == 1:
        got, _ = read_safetensors(os.path.join(args.workdir, f"{name}.f64.result.safetensors"))
        group = Hq // Hkv
        v_rows = exact["v"][P:][:, np.arange(Hq) // group, :]
        if not np.array_equal(got["o"][1], v_rows):
            print(f"FAIL {name}: w = 1 but o != v of the same token")
            ok = False
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--orthros", required=True, help="path of the orthros binary")
    ap.add_argument("--seed", type=int, default=20261013)
    ap.add_argument("--workdir", default=None, help="where case/result files go (default: a temp dir)")
    args = ap.parse_args()
    tmp = None
    if args.workdir is None:
        tmp = tempfile.TemporaryDirectory()
        args.workdir = tmp.name
    os.makedirs(args.workdir, exist_ok=True)
    print(f"independent_attention.py: seed {args.seed} (rerun with --seed {args.seed}), numpy {np.__version__}")
    rng = np.random.default_rng(args.seed)
    failures = [c[0] for c in CASES if not run_case(args, rng, c)]
    if failures:
        print(f"{len(failures)} of {len(CASES)} cases FAILED (seed {args.seed}): {', '.join(failures)}")
        return 1
    print(f"all {len(CASES)} cases passed (seed {args.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
