"""Helpers of the tests of the `orthros` Python module (test_python*.py): seeded inputs (never
zero), dense NumPy transcriptions of SPEC §2 and of its backward, and a minimal safetensors
reader/writer.
"""
import json
import struct

import numpy as np


def nonzero(rng, shape, amp=1.0):
    """Uniform in [-amp, -0.05 amp] U [0.05 amp, amp]: never zero, never tiny."""
    mag = rng.uniform(0.05, 1.0, size=shape) * amp
    return np.where(rng.random(shape) < 0.5, -mag, mag)


def transcription(q, k, v, q_out, window, scale=None):
    """SPEC §2 as a dense masked softmax in float64 (deliberately unlike the C++ row loop)."""
    T, Hq, D = q.shape
    N, Hkv, _ = k.shape
    P, T_out = N - T, q_out.shape[0]
    s = 1.0 / np.sqrt(D) if scale is None else scale
    group = Hq // Hkv
    pos_b = P + np.arange(T) + 1                      # 1-based absolute positions
    pos_o = P + (T - T_out) + np.arange(T_out) + 1
    j = np.arange(N) + 1
    mask_b = (j[None, :] <= pos_b[:, None]) & (j[None, :] >= pos_b[:, None] - window + 1)
    mask_o = j[None, :] <= pos_o[:, None]
    out = {}
    for name, qq, mask in (("", q, mask_b), ("_out", q_out, mask_o)):
        kk = np.repeat(k, group, axis=1)              # GQA: query head h reads KV head h // group
        vv = np.repeat(v, group, axis=1)
        sc = np.einsum("thd,nhd->htn", qq, kk) * s
        sc = np.where(mask[None], sc, -np.inf)
        m = sc.max(axis=-1, keepdims=True)
        e = np.exp(sc - m)
        z = e.sum(axis=-1, keepdims=True)
        out["o" + name] = np.einsum("htn,nhd->thd", e / z, vv)
        out["lse" + name] = (m + np.log(z))[..., 0].T
    return out


def case(seed, T=9, P=3, T_out=2, Hq=4, Hkv=2, D=8, amp=1.0):
    rng = np.random.default_rng(seed)
    return (nonzero(rng, (T, Hq, D), amp), nonzero(rng, (P + T, Hkv, D), amp),
            nonzero(rng, (P + T, Hkv, D), amp), nonzero(rng, (T_out, Hq, D), amp))


def transcription_backward(q, k, v, q_out, do, do_out, window, scale=None):
    """The operator's gradients from dense float64 matrices (deliberately unlike the C++ row
    loops): per stream P = masked softmax, dP = dO V^T, dS = P * (dP - rowsum(P * dP)) (the
    softmax Jacobian, not FlashAttention's rowsum(dO * O)), dq = s dS K, dk = s dS^T Q,
    dv = P^T dO, then dk/dv summed over the query heads of each GQA group and both streams."""
    T, Hq, D = q.shape
    N, Hkv, _ = k.shape
    P, T_out = N - T, q_out.shape[0]
    s = 1.0 / np.sqrt(D) if scale is None else scale
    group = Hq // Hkv
    pos_b = P + np.arange(T) + 1
    pos_o = P + (T - T_out) + np.arange(T_out) + 1
    j = np.arange(N) + 1
    mask_b = (j[None, :] <= pos_b[:, None]) & (j[None, :] >= pos_b[:, None] - window + 1)
    mask_o = j[None, :] <= pos_o[:, None]
    kk, vv = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    dk_h, dv_h, out = np.zeros((N, Hq, D)), np.zeros((N, Hq, D)), {}
    for name, qq, dd, mask in (("dq", q, do, mask_b), ("dq_out", q_out, do_out, mask_o)):
        sc = np.where(mask[None], np.einsum("thd,nhd->htn", qq, kk) * s, -np.inf)
        e = np.exp(sc - sc.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)                       # [H, T, N]
        dp = np.einsum("thd,nhd->htn", dd, vv)
        ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
        out[name] = s * np.einsum("htn,nhd->thd", ds, kk)
        dk_h += s * np.einsum("htn,thd->nhd", ds, qq)
        dv_h += np.einsum("htn,thd->nhd", p, dd)
    out["dk"] = dk_h.reshape(N, Hkv, group, D).sum(axis=2)
    out["dv"] = dv_h.reshape(N, Hkv, group, D).sum(axis=2)
    return out


def grad_case(seed, T=9, P=3, T_out=4, Hq=4, Hkv=2, D=8, amp=1.0):
    """q, k, v, q_out, do, do_out: seeded, never zero."""
    rng = np.random.default_rng(seed)
    return (nonzero(rng, (T, Hq, D), amp), nonzero(rng, (P + T, Hkv, D), amp), nonzero(rng, (P + T, Hkv, D), amp),
            nonzero(rng, (T_out, Hq, D), amp), nonzero(rng, (T, Hq, D)), nonzero(rng, (T_out, Hq, D)))


GRADS = ("dq", "dq_out", "dk", "dv")


def st_read(path):
    """Minimal safetensors reader (F64, F32, F16, BF16 -> float64 arrays), and the metadata."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data, out = raw[8 + n:], {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        if t["dtype"] == "BF16":
            a = (np.frombuffer(data[b:e], "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(data[b:e], {"F64": "<f8", "F32": "<f4", "F16": "<f2"}[t["dtype"]])
        out[name] = a.astype(np.float64).reshape(t["shape"])
    return out, meta


def st_write(path, tensors):
    """Minimal safetensors writer, every tensor as F64."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        blob = np.ascontiguousarray(tensors[name], dtype="<f8").tobytes()
        header[name] = {"dtype": "F64", "shape": list(np.shape(tensors[name])), "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    h = json.dumps(header).encode()
    h += b" " * (-(8 + len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
