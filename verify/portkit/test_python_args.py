"""Bad arguments to the Python bindings (orthros._core, converted in verify/python/py_args.hpp):
each raises orthros.Error naming the parameter, the expected form and what was passed, never
pybind11's "incompatible function arguments" with the binding signature and array reprs.
Run by ctest portkit_python_args with PYTHONPATH=<build>/python (Debian's python3, numpy).
"""
import unittest

import numpy as np

import orthros


def case(seed, T=5, P=2, T_out=2, Hq=4, Hkv=2, D=8):
    rng = np.random.default_rng(seed)
    f = lambda *s: rng.uniform(-1, 1, s)  # noqa: E731
    return f(T, Hq, D), f(P + T, Hkv, D), f(P + T, Hkv, D), f(T_out, Hq, D)


class ArgumentErrorsTest(unittest.TestCase):
    def assertArgError(self, fn, pattern):
        with self.assertRaises(orthros.Error) as cm:
            fn()
        msg = str(cm.exception)
        self.assertRegex(msg, pattern)
        self.assertNotIn("incompatible function arguments", msg)
        self.assertNotIn("array(", msg)  # no array repr
        self.assertLess(len(msg), 300, msg)

    def test_window(self):
        q, k, v, qo = case(31)
        for fn in (lambda w: orthros.attention(q, k, v, qo, window=w),
                   lambda w: orthros.check_attention({}, q, k, v, qo, window=w, dtype="f32"),
                   lambda w: orthros.attention_backward(q, k, v, qo, q, qo, window=w)):
            self.assertArgError(lambda: fn(2.5), r"^window must be an integer >= 1 .*; got 2\.5 \(float\)$")
            self.assertArgError(lambda: fn(None), r"^window must be an integer >= 1 .*; got None$")
            self.assertArgError(lambda: fn(True), r"got True \(bool\)")
            self.assertArgError(lambda: fn("3"), r"got '3' \(str\)")
        self.assertArgError(lambda: orthros.attention(q, k, v, qo, window=0), r"window must be >= 1 \(got 0\)")
        a = orthros.attention(q, k, v, qo, window=np.int64(3))  # a NumPy integer is an integer
        b = orthros.attention(q, k, v, qo, window=3)
        self.assertTrue(np.array_equal(a["o"], b["o"]), "seed=31")

    def test_arrays(self):
        q, k, v, qo = case(32)
        self.assertArgError(lambda: orthros.attention(q, k, v, None, window=2),
                            r"^q_out must be an array \[T_out, H_q, D\] \(float64, float32 or float16\); got None$")
        self.assertArgError(lambda: orthros.attention(q, "k", v, qo, window=2), r"^k must be an array \[P\+T, H_kv, D\]")
        self.assertArgError(lambda: orthros.attention(q, k, v, qo, window=2, scale="big"),
                            r"^scale must be a number or None .*; got 'big' \(str\)$")
        self.assertArgError(lambda: orthros.attention(q, k, v, qo, window=2, precision=16),
                            r"^precision must be None or one of .*; got 16 \(int\)$")
        self.assertArgError(lambda: orthros.attention_backward(q, k, v, qo, None, qo, window=2), r"^do must be an array")
        self.assertArgError(lambda: orthros.check(None, q, "f32", 0.0), r"^actual must be an array")
        self.assertArgError(lambda: orthros.check(q, q, "f32", "x"), r"^oracle_at_dtype_maxabs must be a number")
        self.assertArgError(lambda: orthros.check(q, q, 32, 0.0), r"^dtype must be one of")
        r = orthros.attention(q.tolist(), k, v, qo, window=2, scale=0.5)  # nested lists still convert
        self.assertEqual(r["o"].shape, q.shape)

    def test_value_and_key_shapes_in_their_own_layout(self):
        q, k, v, qo = case(33)
        self.assertArgError(lambda: orthros.attention(q, k, v[:-1], qo, window=2),
                            r"^v must have the shape of k, \[P\+T, H_kv, D\] = \[7, 2, 8\]; got \[6, 2, 8\]$")
        self.assertArgError(lambda: orthros.attention_backward(q, k, v[:, :1], qo, q, qo, window=2),
                            r"^v must have the shape of k, \[P\+T, H_kv, D\] = \[7, 2, 8\]; got \[7, 1, 8\]$")

    def test_report_has_actual_shape_and_row_runs(self):
        ref = np.ones((6, 2, 3))
        rep = orthros.check(np.ones((2, 6, 3)), ref, "f64")
        self.assertEqual((rep["shape_ok"], rep["shape"], rep["actual_shape"]), (False, [6, 2, 3], [2, 6, 3]))
        out = ref.copy()
        out[[0, 1, 2, 4], 1, 1] = 3.0
        rep = orthros.check(out, ref, "f64")
        self.assertEqual((rep["bad_rows"], rep["bad_row_ranges"]), ([0, 1, 2, 4], [(0, 2), (4, 4)]))


if __name__ == "__main__":
    unittest.main()
