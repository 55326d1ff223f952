"""Tests of the `orthros` Python module's backward: attention_backward against a dense NumPy
transcription, and check_attention_backward.

Run by ctest (label unit) with Debian's /usr/bin/python3, PYTHONPATH=<build>/python and
ORTHROS=<the orthros binary> (the golden/check tests skip, saying so, when ORTHROS is not set).
Every random input is seeded; the seed is in each assertion message.
"""
import unittest

import numpy as np

import orthros

from python_testing import transcription_backward, grad_case, GRADS


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


if __name__ == "__main__":
    unittest.main()
