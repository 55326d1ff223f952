"""Tests of the `orthros` Python module (verify/python), forward: the operator against an
independent NumPy transcription of SPEC §2, the SPEC §6 checker, the regime entry points, and the
errors. The backward: test_python_backward.py, test_python_golden_grad.py.

Run by ctest (label unit) with Debian's /usr/bin/python3, PYTHONPATH=<build>/python and
ORTHROS=<the orthros binary> (the golden/check tests skip, saying so, when ORTHROS is not set).
Every random input is seeded; the seed is in each assertion message.
"""
import unittest

import numpy as np

import orthros

from python_testing import nonzero, transcription, case


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
