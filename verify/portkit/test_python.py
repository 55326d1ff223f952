"""Tests of the `orthros` Python module (verify/python): the operator against an independent
NumPy transcription of SPEC §2, the SPEC §6 checker, the regime entry points, and the errors;
the backward (issue 8): attention_backward against a dense NumPy transcription and bitwise against
`orthros golden --grad`, check_attention_backward, and `orthros check` on gradient results.

Run by ctest (label unit) with Debian's /usr/bin/python3, PYTHONPATH=<build>/python and
ORTHROS=<the orthros binary> (the golden/check tests skip, saying so, when ORTHROS is not set).
Every random input is seeded; the seed is in each assertion message.
"""
import json
import os
import shutil
import struct
import subprocess
import tempfile
import unittest

import numpy as np

import orthros


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


class AttentionTest(unittest.TestCase):
    def test_matches_transcription(self):
        for seed, (T, P, T_out, Hq, Hkv, D, w) in enumerate([
                (9, 3, 2, 4, 2, 8, 3), (5, 0, 5, 8, 8, 4, 1), (7, 4, 1, 6, 2, 16, 100),
                (12, 0, 0, 7, 1, 8, 4), (1, 20, 1, 4, 4, 8, 5)]):
            q, k, v, qo = case(seed, T, P, T_out, Hq, Hkv, D)
            got = orthros.attention(q, k, v, qo, window=w)
            ref = transcription(q, k, v, qo, w)
            for name in ("o", "o_out", "lse", "lse_out"):
                self.assertEqual(got[name].shape, ref[name].shape, f"seed={seed} {name}")
                err = np.abs(got[name] - ref[name]).max() if ref[name].size else 0.0
                self.assertLessEqual(err, 1e-12, f"seed={seed} {name} max abs err {err}")

    def test_window_one_returns_values(self):
        q, k, v, qo = case(7, T=6, P=2, T_out=1, Hq=4, Hkv=2)
        got = orthros.attention(q, k, v, qo, window=1)
        expect = np.repeat(v[2:], 2, axis=1)             # o_t = v_t, KV head h // 2
        np.testing.assert_array_equal(got["o"], expect, err_msg="seed=7")

    def test_float32_and_float16_inputs(self):
        q, k, v, qo = case(8)
        r32 = orthros.attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32),
                                qo.astype(np.float32), window=3)
        self.assertEqual(r32["o"].dtype, np.float32)
        r16 = orthros.attention(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16),
                                qo.astype(np.float16), window=3)
        self.assertEqual(r16["o"].dtype, np.float16)
        ref = transcription(q, k, v, qo, 3)
        rel = np.linalg.norm(r32["o"] - ref["o"]) / np.linalg.norm(ref["o"])
        self.assertLess(rel, 1e-5, "seed=8")

    def test_errors_are_value_errors_with_cpp_messages(self):
        q, k, v, qo = case(9)
        with self.assertRaisesRegex(ValueError, r"window must be >= 1 \(got 0\)"):
            orthros.attention(q, k, v, qo, window=0)
        with self.assertRaisesRegex(orthros.Error, r"H_q % H_kv must be 0"):
            orthros.attention(q[:, :3], k, v, qo[:, :3], window=2)
        with self.assertRaisesRegex(ValueError, r"v must have"):
            orthros.attention(q, k, v[:, :, :4], qo, window=2)
        with self.assertRaisesRegex(ValueError, r"T_out must be <= T"):
            orthros.attention(q, k, v, np.concatenate([q, qo]), window=2)
        with self.assertRaisesRegex(ValueError, r"3-d array"):
            orthros.attention(q[0], k, v, qo, window=2)
        with self.assertRaisesRegex(ValueError, r"float64, float32 or float16"):
            orthros.attention(q.astype(np.int32), k, v, qo, window=2)
        bad = q.copy()
        bad[1, 2, 3] = np.nan
        with self.assertRaisesRegex(ValueError, r"q contains a non-finite value"):
            orthros.attention(bad, k, v, qo, window=2)


class CheckTest(unittest.TestCase):
    def test_one_assert_for_a_port(self):
        # A float32 port (here: the transcription run in float32) passes the f32 criterion.
        q, k, v, qo = case(10, T=16, P=4, T_out=3, Hq=8, Hkv=2, D=16)
        f = [x.astype(np.float32) for x in (q, k, v, qo)]
        port = transcription(*f, 5)
        port = {n: a.astype(np.float32) for n, a in port.items()}
        rep = orthros.check_attention(port, *f, window=5, dtype="f32")
        self.assertTrue(rep["pass"], f"seed=10 {rep}")

    def test_window_off_by_one_fails_at_the_right_rows(self):
        q, k, v, qo = case(11, T=10, P=0, T_out=1, Hq=4, Hkv=2, D=8)
        w = 4
        wrong = orthros.attention(q, k, v, qo, window=w + 1)    # the classic (w, 0) mistake
        rep = orthros.check_attention(wrong, q, k, v, qo, window=w, dtype="f64")
        self.assertFalse(rep["pass"])
        o = rep["tensors"]["o"]
        self.assertEqual(o["bad_rows"], list(range(w, 10)), "seed=11: rows t >= w see one key too many")
        self.assertTrue(rep["tensors"]["o_out"]["pass"], "output queries are full attention")

    def test_bf16_oracle_passes_its_own_criterion(self):
        q, k, v, qo = case(12, T=20, P=5, T_out=4, Hq=8, Hkv=4, D=32)
        low = orthros.attention(q, k, v, qo, window=6, precision="bf16")
        rep = orthros.check_attention(low, q, k, v, qo, window=6, dtype="bf16")
        self.assertTrue(rep["pass"], f"seed=12 {rep}")
        self.assertGreater(rep["tensors"]["o"]["max_abs"], 0.0)

    def test_f16_oracle_overflow_makes_abs_criterion_not_applicable(self):
        # q.k*scale = 300*300*8/sqrt(8) = 254558 > 65504: the naive f16 oracle has no finite answer,
        # so E_X does not exist; a correct port is judged by the relative and NaN/Inf criteria.
        rng = np.random.default_rng(14)
        T, P, T_out, w = 5, 2, 3, 3
        q = np.full((T, 4, 8), 300.0, np.float16)
        k = np.full((P + T, 2, 8), 300.0, np.float16)
        qo = np.full((T_out, 4, 8), 300.0, np.float16)
        v = rng.standard_normal((P + T, 2, 8)).astype(np.float16)
        with self.assertRaisesRegex(orthros.Error, r"^scaled scores q\.k\*scale overflow f16"):
            orthros.attention(q, k, v, qo, window=w, precision="f16")

        def port(window):  # the exact answer, o in f16, lse in f32 (254558 does not fit f16)
            r = transcription(*(x.astype(np.float64) for x in (q, k, v, qo)), window)
            return {n: a.astype(np.float16 if n.startswith("o") else np.float32) for n, a in r.items()}

        rep = orthros.check_attention(port(w), q, k, v, qo, window=w, dtype="f16")
        self.assertTrue(rep["pass"], f"seed=14 {rep}")
        self.assertTrue(rep["abs_criterion"].startswith("n/a (naive f16 oracle overflows: scaled scores"), rep)
        for n, t in rep["tensors"].items():
            self.assertEqual(t["abs_criterion"], rep["abs_criterion"], n)
            self.assertIsNone(t["abs_tol"], n)
            self.assertIsNone(t["oracle_at_dtype_maxabs"], n)
        self.assertGreater(rep["tensors"]["o"]["rel_fro"], 1e-5, "really rounded to f16")
        wrong = orthros.check_attention(port(w + 1), q, k, v, qo, window=w, dtype="f16")
        self.assertFalse(wrong["pass"])
        self.assertFalse(wrong["tensors"]["o"]["pass_rel"], f"seed=14 {wrong['tensors']['o']}")

    def test_narrowing_rounds_once_directly_from_float64(self):
        # 1 + 2^-8 is the midpoint of bf16 neighbours 1 and 1 + 2^-7; + 2^-30 lies above it, so the
        # single rounding gives 1.0078125 (through float32 the 2^-30 is lost and the tie gives 1.0).
        # At f16, 1 + 2^-11 + 2^-40 rounds to 1 + 2^-10, as NumPy's own float64 -> float16 does.
        xb, xh = 1 + 2.0**-8 + 2.0**-30, 1 + 2.0**-11 + 2.0**-40
        self.assertEqual(float(np.float16(xh)), 1 + 2.0**-10)
        q = np.full((1, 1, 2), 0.5)
        v = np.array([[[xb, xh]]])
        ob = orthros.attention(q, q, v, q, window=1, precision="bf16")["o"]  # w = 1: o_t = v_t
        oh = orthros.attention(q, q, v, q, window=1, precision="f16")["o"]
        self.assertEqual(float(ob[0, 0, 0]), 1.0078125)
        self.assertEqual(float(oh[0, 0, 1]), float(np.float16(xh)))

    def test_check_attention_bf16_accepts_a_port_that_rounds_directly(self):
        # float64 inputs, w = 1, dtype bf16: a port that rounds its inputs once to bf16 (as
        # ml_dtypes does) has o = bf16(v) exactly; E_X of o is 0, so any other rounding of v by
        # the checker would fail it on the abs criterion (bound 1e-6).
        rng = np.random.default_rng(15)
        q, k, v, qo = case(15, T=6, P=0, T_out=2, Hq=2, Hkv=2, D=4)
        v[2, 1, 3] = 1 + 2.0**-8 + 2.0**-30
        v[4, 0, 0] = -(1 + 2.0**-8 + 2.0**-30)
        v = v + rng.choice([0.0, 2.0**-30], size=v.shape) * np.sign(v)  # more values near midpoints

        def bf16(x):  # round to nearest even, directly from float64 (7 explicit mantissa bits)
            m, e = np.frexp(x)                       # x = m * 2^e, |m| in [0.5, 1)
            return np.ldexp(np.rint(np.ldexp(m, 8)), e - 8)

        qb, kb, vb, qob = (bf16(x) for x in (q, k, v, qo))
        r = transcription(qb, kb, vb, qob, 1)
        port = {n: a.astype(np.float32) for n, a in r.items()}  # bf16 values are exact in float32
        self.assertTrue(np.array_equal(port["o"], vb.astype(np.float32)))
        rep = orthros.check_attention(port, q, k, v, qo, window=1, dtype="bf16")
        self.assertTrue(rep["pass"], f"seed=15 {rep['tensors']['o']}")
        self.assertEqual(rep["tensors"]["o"]["max_abs"], 0.0)

    def test_check_needs_a_baseline_below_f64(self):
        ref = nonzero(np.random.default_rng(16), (3, 2, 4))
        self.assertTrue(orthros.check(ref, ref, "f64")["pass"])  # f64: E_X = 0 by definition
        with self.assertRaisesRegex(orthros.Error, "oracle_at_dtype_maxabs is required for dtype f32"):
            orthros.check(ref, ref, "f32")
        act = ref + 1e-3
        r = orthros.check(act, ref, "bf16", abs_na_reason="naive bf16 oracle overflows: test")
        self.assertTrue(r["pass"], r)
        self.assertEqual(r["abs_criterion"], "n/a (naive bf16 oracle overflows: test)")
        self.assertFalse(orthros.check(act, ref, "bf16", 0.0)["pass"])

    def test_nan_is_reported(self):
        ref = nonzero(np.random.default_rng(13), (3, 2, 4))
        act = ref.copy()
        act[2, 1, 0] = np.nan
        r = orthros.check(act, ref, "f32", 0.0, "o")
        self.assertFalse(r["pass"])
        self.assertEqual(r["nan_count"], 1)
        self.assertEqual(r["worst_index"], [2, 1, 0])
        self.assertAlmostEqual(orthros.rel_tolerance("bf16"), 1e-2)


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


class BackwardTest(unittest.TestCase):
    def test_matches_dense_transcription(self):
        # GQA ratios 1, 2, 3, 7; P > 0; T_out = 0, 1, T; w = 1 and w >= P+T; a scale from the caller.
        for seed, (T, P, T_out, Hq, Hkv, D, w, scale) in enumerate([
                (9, 3, 4, 4, 2, 8, 3, None), (5, 0, 5, 8, 8, 4, 1, None), (7, 4, 1, 6, 2, 16, 100, None),
                (12, 0, 0, 7, 1, 8, 4, 0.3), (1, 20, 1, 4, 4, 8, 5, None), (6, 2, 3, 14, 2, 8, 2, None)], start=100):
            args = grad_case(seed, T, P, T_out, Hq, Hkv, D)
            got = orthros.attention_backward(*args, window=w, scale=scale)
            ref = transcription_backward(*args, w, scale)
            for name in GRADS:
                self.assertEqual(got[name].shape, ref[name].shape, f"seed={seed} {name}")
                self.assertEqual(got[name].dtype, np.float64, f"seed={seed} {name}")
                if ref[name].size:
                    # relative to max |ref|, or absolute where ref is 0 (w = 1: dq = 0 exactly)
                    err = np.abs(got[name] - ref[name]).max() / max(np.abs(ref[name]).max(), 1.0)
                    self.assertLessEqual(err, 1e-12, f"seed={seed} {name} max abs err / max(|ref|, 1) = {err}")

    def test_unseen_cache_rows_get_zero_and_w1_dv_is_do(self):
        # T_out = 0, w = 1, P = 5: query t sees only key t, so dv of row P+i is do_i summed over the
        # group; cache rows 0..P-1 are seen by no query: exactly 0.
        q, k, v, qo, do, do_out = grad_case(101, T=6, P=5, T_out=0, Hq=4, Hkv=2)
        g = orthros.attention_backward(q, k, v, qo, do, do_out, window=1)
        self.assertTrue(np.all(g["dk"][:5] == 0) and np.all(g["dv"][:5] == 0), "seed=101")
        np.testing.assert_array_equal(g["dv"][5:], do.reshape(6, 2, 2, 8).sum(axis=2), err_msg="seed=101")
        np.testing.assert_array_equal(g["dq"], np.zeros_like(q), err_msg="seed=101: one key, softmax constant")
        self.assertTrue(np.all(g["dv"][5:] != 0), "seed=101: do is never zero")

    def test_precision_and_dtypes(self):
        args = grad_case(102, T=16, P=4, T_out=3, Hq=8, Hkv=2, D=16)
        ref = orthros.attention_backward(*args, window=5)
        for prec, dt, rel in (("f32", np.float32, 1e-5), ("bf16", np.float32, 2e-2), ("f16", np.float16, 4e-3)):
            low = orthros.attention_backward(*args, window=5, precision=prec)
            for name in GRADS:
                self.assertEqual(low[name].dtype, dt, f"{prec} {name}")
                err = np.linalg.norm(low[name] - ref[name]) / np.linalg.norm(ref[name])
                self.assertGreater(err, 0.0, f"seed=102 {prec} {name}: really rounded")
                self.assertLess(err, rel, f"seed=102 {prec} {name}")
        r32 = orthros.attention_backward(*(a.astype(np.float32) for a in args), window=5)
        self.assertEqual(r32["dq"].dtype, np.float32)  # precision None: the inputs' dtype

    def test_errors_name_the_parameter(self):
        q, k, v, qo, do, do_out = grad_case(103)
        with self.assertRaisesRegex(orthros.Error, r"do must have 4 heads"):
            orthros.attention_backward(q, k, v, qo, do[:, :2], do_out, window=3)
        with self.assertRaisesRegex(ValueError, r"do \(dL/do\) must be \[9, 32\]; got \[8, 32\]"):
            orthros.attention_backward(q, k, v, qo, do[:8], do_out, window=3)
        with self.assertRaisesRegex(ValueError, r"do_out \(dL/do_out\) must be \[4, 32\]"):
            orthros.attention_backward(q, k, v, qo, do, do_out[:3], window=3)
        bad = do_out.copy()
        bad[1, 2, 3] = np.inf
        with self.assertRaisesRegex(ValueError, r"do_out contains a non-finite value"):
            orthros.attention_backward(q, k, v, qo, do, bad, window=3)
        with self.assertRaisesRegex(ValueError, r"window must be >= 1 \(got 0\)"):
            orthros.attention_backward(q, k, v, qo, do, do_out, window=0)
        with self.assertRaisesRegex(ValueError, r"precision must be one of"):
            orthros.attention_backward(q, k, v, qo, do, do_out, window=3, precision="fp8")
        with self.assertRaisesRegex(ValueError, r"3-d array"):
            orthros.attention_backward(q, k, v, qo, do[0], do_out, window=3)

    def test_gradient_overflow_at_f16_is_an_error(self):
        q, k, v, qo, do, do_out = grad_case(104)
        with self.assertRaisesRegex(orthros.Error, r"^attention gradients overflow f16"):
            orthros.attention_backward(q, k, v, qo, np.full_like(do, 60000.0), do_out, window=3, precision="f16")


class CheckBackwardTest(unittest.TestCase):
    def test_oracle_at_dtype_passes_with_positive_ex_and_f64_ex_is_zero(self):
        args = grad_case(110, T=20, P=5, T_out=4, Hq=8, Hkv=4, D=32)
        for dt in ("bf16", "f16", "f32", "f64"):
            low = orthros.attention_backward(*args, window=6, precision=dt)
            rep = orthros.check_attention_backward(low, *args, window=6, dtype=dt)
            self.assertTrue(rep["pass"], f"seed=110 {dt} {rep}")
            self.assertEqual(rep["abs_criterion"], "applied")
            self.assertEqual(sorted(rep["tensors"]), sorted(GRADS))
            for name in GRADS:
                e_x = rep["tensors"][name]["oracle_at_dtype_maxabs"]
                if dt == "f64":
                    self.assertEqual(e_x, 0.0, f"{dt} {name}")
                    self.assertEqual(rep["tensors"][name]["max_abs"], 0.0, f"{dt} {name}")
                else:
                    self.assertGreater(e_x, 0.0, f"seed=110 {dt} {name}")

    def test_a_float32_port_passes(self):
        # The dense transcription run in float32 (another summation order) passes the f32 rule.
        args = [a.astype(np.float32) for a in grad_case(111, T=16, P=4, T_out=3, Hq=8, Hkv=2, D=16)]
        port = {n: a.astype(np.float32) for n, a in transcription_backward(*args, 5).items()}
        rep = orthros.check_attention_backward(port, *args, window=5, dtype="f32")
        self.assertTrue(rep["pass"], f"seed=111 {rep}")

    def test_perturbed_dk_row_is_caught_at_its_position(self):
        args = grad_case(112)  # P = 3, T = 9, T_out = 4
        good = orthros.attention_backward(*args, window=3)
        for row in (0, 5, 11):
            bad = {n: a.copy() for n, a in good.items()}
            bad["dk"][row, 1, 2] += 1e-4
            rep = orthros.check_attention_backward(bad, *args, window=3, dtype="f64")
            self.assertFalse(rep["pass"], f"seed=112 row {row}")
            t = rep["tensors"]["dk"]
            self.assertEqual(t["bad_rows"], [row])
            self.assertEqual(t["bad_positions"], [row + 1], "dk row i is cache position i+1")
            self.assertEqual(t["worst_index"], [row, 1, 2])
            for n in ("dq", "dq_out", "dv"):
                self.assertTrue(rep["tensors"][n]["pass"], n)
        bad = {n: a.copy() for n, a in good.items()}
        bad["dq_out"][1, 0, 0] += 1e-4
        rep = orthros.check_attention_backward(bad, *args, window=3, dtype="f64")
        self.assertEqual(rep["tensors"]["dq_out"]["bad_positions"], [3 + 9 - 4 + 1 + 1])
        bad = {n: a.copy() for n, a in good.items()}
        bad["dq"][2, 3, 7] += 1e-4
        rep = orthros.check_attention_backward(bad, *args, window=3, dtype="f64")
        self.assertEqual(rep["tensors"]["dq"]["bad_positions"], [3 + 2 + 1])

    def test_window_off_by_one_fails_the_gradients(self):
        args = grad_case(113, T=10, P=0, T_out=1)
        wrong = orthros.attention_backward(*args, window=5)     # (w, 0) instead of (w-1, 0)
        rep = orthros.check_attention_backward(wrong, *args, window=4, dtype="f64")
        self.assertFalse(rep["pass"])
        self.assertEqual(rep["tensors"]["dq"]["bad_rows"], list(range(4, 10)), "seed=113: rows t > w")
        self.assertFalse(rep["tensors"]["dk"]["pass"])

    def test_missing_gradient_is_an_error(self):
        args = grad_case(114)
        g = orthros.attention_backward(*args, window=3)
        del g["dq"]
        with self.assertRaisesRegex(orthros.Error, r"result must contain 'dq'"):
            orthros.check_attention_backward(g, *args, window=3, dtype="f64")
        with self.assertRaisesRegex(ValueError, r"dtype must be one of"):
            orthros.check_attention_backward(g, *args, window=3, dtype="int8")

    def test_f16_gradient_overflow_makes_abs_criterion_not_applicable(self):
        q, k, v, qo, do, do_out = grad_case(115)
        do = np.full_like(do, 60000.0)  # finite in f16; dP = do.v overflows it
        exact = orthros.attention_backward(q, k, v, qo, do, do_out, window=3)
        port = {n: a.astype(np.float32) for n, a in exact.items()}
        rep = orthros.check_attention_backward(port, q, k, v, qo, do, do_out, window=3, dtype="f16")
        self.assertTrue(rep["pass"], f"seed=115 {rep}")
        self.assertTrue(rep["abs_criterion"].startswith("n/a (naive f16 oracle overflows: attention gradients"), rep)
        for n, t in rep["tensors"].items():
            self.assertIsNone(t["abs_tol"], n)
            self.assertIsNone(t["oracle_at_dtype_maxabs"], n)
        port["dv"] = port["dv"] * np.float32(1.1)
        self.assertFalse(orthros.check_attention_backward(port, q, k, v, qo, do, do_out, window=3,
                                                          dtype="f16")["tensors"]["dv"]["pass_rel"])


@unittest.skipUnless(os.environ.get("ORTHROS"), "ORTHROS (the orthros binary) not set: golden/check tests skipped")
class GoldenGradTest(unittest.TestCase):
    """`orthros golden --grad` and `orthros check` against the Python bindings."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.suites = {}
        for dt in ("f64", "f32", "bf16", "f16"):
            d = os.path.join(cls.tmp.name, dt)
            subprocess.run([os.environ["ORTHROS"], "golden", "--grad", "--out", d, "--dtype", dt, "--seed", "9"],
                           check=True, capture_output=True)
            with open(os.path.join(d, "manifest.json")) as f:
                cls.suites[dt] = (d, json.load(f))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_python_backward_equals_golden_expected_bitwise_at_f64(self):
        d, m = self.suites["f64"]
        self.assertIs(m["grad"], True)
        for c in m["cases"]:
            case, meta = st_read(os.path.join(d, c["file"]))
            exp, emeta = st_read(os.path.join(d, c["expected"]))
            if not c["grad"]:  # the forward-only edge_large_logits: tested below
                continue
            self.assertTrue(np.all(case["do"] != 0) and np.all(case["do_out"] != 0), c["name"])
            scale = float(meta["scale"]) if "scale" in meta else None
            g = orthros.attention_backward(case["q"], case["k"], case["v"], case["q_out"], case["do"], case["do_out"],
                                           window=int(meta["window"]), scale=scale)
            for n in GRADS:
                self.assertEqual(list(g[n].shape), c["shapes"][n], f"seed=9 {c['name']} {n}")
                np.testing.assert_array_equal(g[n], exp[n], err_msg=f"seed=9 {c['name']} {n}")
                self.assertEqual(emeta["oracle_at_dtype_maxabs." + n], "0", f"{c['name']} {n}")
                self.assertEqual(c["tolerance"]["oracle_at_dtype_maxabs"][n], 0.0)

    def test_bf16_suite_ex_positive_and_check_names_dk_position(self):
        d, m = self.suites["bf16"]
        cases = {c["name"]: c for c in m["cases"]}
        c = cases["edge_cache_sft"]  # P = 20, T = 16, T_out = 6
        for n in GRADS:
            self.assertGreater(c["tolerance"]["oracle_at_dtype_maxabs"][n], 0.0, n)
        case, meta = st_read(os.path.join(d, c["file"]))
        args = [case[n] for n in ("q", "k", "v", "q_out")]
        res = dict(orthros.attention(*args, window=int(meta["window"]), precision="bf16"))
        res.update(orthros.attention_backward(*args, case["do"], case["do_out"], window=int(meta["window"]),
                                              precision="bf16"))
        out = os.path.join(self.tmp.name, "res")
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, "edge_cache_sft.safetensors")
        orthros_bin = os.environ["ORTHROS"]

        def check(tensors):
            st_write(path, tensors)
            p = subprocess.run([orthros_bin, "check", "--suite", d, "--actual-dir", out, "--only", "edge_cache_sft",
                                "--json"], capture_output=True, text=True)
            return p.returncode, json.loads(p.stdout)

        rc, rep = check(res)  # the bf16 oracle passes its own criterion
        self.assertEqual(rc, 0, rep)
        self.assertEqual([t["name"] for t in rep["cases"][0]["tensors"]],
                         ["o", "o_out", "lse", "lse_out", "dq", "dq_out", "dk", "dv"])
        bad = dict(res)
        bad["dk"] = res["dk"].astype(np.float64)
        row = 7  # a cache row (P = 20): position 8
        bad["dk"][row, 1, 5] += 10 * c["tolerance"]["abs"]["dk"]
        rc, rep = check(bad)
        self.assertEqual(rc, 1)
        dk = [t for t in rep["cases"][0]["tensors"] if t["name"] == "dk"][0]
        self.assertEqual((dk["bad_rows"], dk["bad_positions"], dk["pass"]), ([row], [row + 1], False))
        missing = {n: a for n, a in res.items() if n != "dq"}
        rc, rep = check(missing)
        self.assertEqual(rc, 1)
        self.assertIn('no tensor "dq"', rep["cases"][0]["error"])
        # --case without --expected: the case holds do/do_out, so gradients are judged too.
        p = subprocess.run([orthros_bin, "check", "--case", os.path.join(d, c["file"]), "--actual", path],
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertIn('no tensor "dq"', p.stdout)


    def oracle_result(self, d, c, dt):
        """The oracle at dt (forward and backward) on case c of suite d, as a port's result."""
        case, meta = st_read(os.path.join(d, c["file"]))
        args = [case[n] for n in ("q", "k", "v", "q_out")]
        kw = dict(window=int(meta["window"]), scale=float(meta["scale"]) if "scale" in meta else None, precision=dt)
        res = dict(orthros.attention(*args, **kw))
        res.update(orthros.attention_backward(*args, case["do"], case["do_out"], **kw))
        return res

    def check(self, d, name, tensors, manifest_dir=None):
        out = os.path.join(self.tmp.name, "res_" + os.path.basename(d))
        os.makedirs(out, exist_ok=True)
        st_write(os.path.join(out, name + ".safetensors"), tensors)
        p = subprocess.run([os.environ["ORTHROS"], "check", "--suite", manifest_dir or d, "--actual-dir", out,
                            "--only", name, "--json"], capture_output=True, text=True)
        return p.returncode, (json.loads(p.stdout) if p.returncode in (0, 1) else p.stderr)

    def test_edge_large_logits_is_forward_only_in_a_grad_suite(self):
        # Its one-hot softmax leaves float64 dq, dq_out, dk of 1e-18..1e-70 (rounding residue): the
        # case carries no do/do_out, its expected file no gradients, its manifest entry "grad": false.
        for dt, (d, m) in self.suites.items():
            cases = {c["name"]: c for c in m["cases"]}
            self.assertEqual([n for n, c in cases.items() if not c["grad"]], ["edge_large_logits"], dt)
            c = cases["edge_large_logits"]
            self.assertIn("forward only in --grad suites", c["description"])
            self.assertEqual(sorted(c["shapes"]), ["k", "lse", "lse_out", "o", "o_out", "q", "q_out", "v"])
            case, _ = st_read(os.path.join(d, c["file"]))
            exp, emeta = st_read(os.path.join(d, c["expected"]))
            self.assertEqual(sorted(case), ["k", "q", "q_out", "v"], dt)
            self.assertEqual(sorted(exp), ["lse", "lse_out", "o", "o_out"], dt)
            self.assertFalse(any(k.startswith("oracle_at_dtype_maxabs.d") for k in emeta), dt)
        # `orthros check` judges its forward tensors only, in the --grad suite (the port here: the
        # exact forward, since scores of 1e4 rounded to bf16 can move the naive bf16 oracle's argmax) ...
        d, m = self.suites["bf16"]
        c = [c for c in m["cases"] if c["name"] == "edge_large_logits"][0]
        exact = st_read(os.path.join(d, c["expected"]))[0]
        rc, rep = self.check(d, c["name"], exact)
        self.assertEqual(rc, 0, rep)
        self.assertIs(rep["cases"][0]["grad"], False)
        self.assertEqual([t["name"] for t in rep["cases"][0]["tensors"]], ["o", "o_out", "lse", "lse_out"])
        # ... and a suite whose manifest says "grad": true for it (its expected file lacking gradients) is bad: exit 2.
        bad = os.path.join(self.tmp.name, "bad_manifest")
        shutil.copytree(d, bad)
        mm = json.loads(json.dumps(m))
        [cc for cc in mm["cases"] if cc["name"] == "edge_large_logits"][0]["grad"] = True
        with open(os.path.join(bad, "manifest.json"), "w") as f:
            json.dump(mm, f)
        rc, err = self.check(bad, c["name"], exact, manifest_dir=bad)
        self.assertEqual(rc, 2, err)
        self.assertIn('case edge_large_logits: the manifest says "grad": true for this case but its expected file '
                      "has no gradients", err)

    def test_edge_grad_large_logits_oracle_at_each_dtype_passes(self):
        for dt, (d, m) in self.suites.items():
            c = [c for c in m["cases"] if c["name"] == "edge_grad_large_logits"][0]
            self.assertIs(c["grad"], True)
            case, meta = st_read(os.path.join(d, c["file"]))
            # scores: integers of magnitude 132..244, exact in every dtype
            q = case["q"].reshape(24, 2, 2, 64)
            s = np.einsum("tgrd,jgd->tgrj", q, case["k"]) * float(c["scale"])
            self.assertTrue(np.all(s == np.round(s)), dt)
            self.assertGreaterEqual(np.abs(s).min(), 132, dt)
            self.assertLessEqual(np.abs(s).max(), 244, dt)
            res = self.oracle_result(d, c, dt)
            rc, rep = self.check(d, c["name"], res)
            self.assertEqual(rc, 0, f"seed=9 {dt}: {rep}")
            t = {x["name"]: x for x in rep["cases"][0]["tensors"]}
            self.assertEqual(sorted(t), sorted(["o", "o_out", "lse", "lse_out", *GRADS]), dt)
            for n in GRADS:
                if dt == "f64":
                    self.assertEqual(t[n]["rel_err"], 0.0, n)
                else:
                    self.assertGreater(t[n]["rel_err"], 0.0, f"{dt} {n}")
            # a dq row off by 10x its abs bound fails there (base row 13 = position 14)
            bad = dict(res)
            bad["dq"] = np.array(res["dq"], dtype=np.float64)
            bad["dq"][13, 2, 40] += 10 * c["tolerance"]["abs"]["dq"]
            rc, rep = self.check(d, c["name"], bad)
            self.assertEqual(rc, 1, dt)
            t = {x["name"]: x for x in rep["cases"][0]["tensors"]}
            self.assertEqual((t["dq"]["pass"], t["dq"]["bad_rows"], t["dq"]["bad_positions"]), (False, [13], [14]), dt)
            self.assertTrue(all(t[n]["pass"] for n in t if n != "dq"), dt)

    def test_forward_suite_has_no_gradient_case_or_flags(self):
        d = os.path.join(self.tmp.name, "fwd")
        subprocess.run([os.environ["ORTHROS"], "golden", "--out", d, "--dtype", "f32", "--seed", "9"], check=True,
                       capture_output=True)
        with open(os.path.join(d, "manifest.json")) as f:
            m = json.load(f)
        self.assertNotIn("grad", m)
        self.assertNotIn("edge_grad_large_logits", [c["name"] for c in m["cases"]])
        self.assertFalse(any("grad" in c for c in m["cases"]))
        c = [c for c in m["cases"] if c["name"] == "edge_large_logits"][0]
        self.assertNotIn("forward only", c["description"])


class RegimeTest(unittest.TestCase):
    def test_regimes_agree_bitwise(self):
        m = orthros.Model("tiny", d_model=32, num_layers=2, seed=5)
        tokens = list(b"Orthros attention, bitwise!")
        pt = m.pretrain(tokens)
        self.assertEqual(pt.shape, (len(tokens), 256))
        cache = m.new_cache()
        pre = m.prefill(tokens[:20], cache)
        np.testing.assert_array_equal(pre[0], pt[19])
        for t in range(20, len(tokens)):
            np.testing.assert_array_equal(m.decode_step(tokens[t], cache)[0], pt[t], err_msg=f"position {t + 1}")
        self.assertEqual(cache.length, len(tokens))
        c2 = m.new_cache()
        np.testing.assert_array_equal(m.prefill_chunked(tokens, [5, 9, len(tokens) - 14], c2)[0], pt[-1])
        np.testing.assert_array_equal(m.sft(tokens, 4), pt[-4:])

    def test_ragged_decode_batch(self):
        m = orthros.Model("tiny", d_model=32, num_layers=1, seed=6)
        a, b = list(b"short"), list(b"a longer prompt")
        ca, cb = m.new_cache(), m.new_cache()
        m.prefill(a, ca)
        m.prefill(b, cb)
        out = m.decode_batch([ord("x"), ord("y")], [ca, cb])
        np.testing.assert_array_equal(out[0], m.pretrain(a + [ord("x")])[-1])
        np.testing.assert_array_equal(out[1], m.pretrain(b + [ord("y")])[-1])

    def test_model_errors(self):
        with self.assertRaisesRegex(ValueError, r"unknown config"):
            orthros.Model("gpt-5", 32, 1, 0)
        m = orthros.Model("tiny", 32, 1, 0)
        with self.assertRaisesRegex(ValueError, r"token id 300"):
            m.pretrain([1, 300])


if __name__ == "__main__":
    unittest.main()
