"""Tests of `orthros.testing.assert_matches_golden` with the NumPy example port.

Run by ctest twice (label unit):
- packaging_testing_helper: Debian's /usr/bin/python3 with PYTHONPATH=<build>/python and
  ORTHROS=<the orthros binary of the build>;
- packaging_wheel (wheel_test.sh): the Python of a venv that `pip install`ed the repository, with
  the `orthros` command found on that venv's PATH and ORTHROS_EXPECT_INSTALLED=1, which also checks
  that the module and the command come from the venv, not from a build tree.
The example port (examples/pytorch_port/numpy_port.py) is imported, not copied: its correct
forward and backward pass every case; its `window-off-by-one` bug and two backward mistakes made
here fail, and the AssertionError must name the case, the tensor and the bad positions.
Runs as `python3 test_testing.py` or under pytest.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

import orthros
import orthros.testing

HERE = os.path.dirname(os.path.abspath(__file__))
PORT_DIR = os.environ.get("PORT_DIR", os.path.join(HERE, "..", "..", "examples", "pytorch_port"))
sys.path.insert(0, PORT_DIR)
import numpy_port  # noqa: E402  (examples/pytorch_port/numpy_port.py)


def make_port(bug=None, grads=True, backward_bug=None):
    """A port function for assert_matches_golden built from the example NumPy port."""
    def port(case):
        cdt = np.float64 if case.dtype == "f64" else np.float32
        out = numpy_port.attention(*(a.astype(cdt) for a in (case.q, case.k, case.v, case.q_out)),
                                   case.window, case.scale, bug)
        if case.grad and grads:
            g = numpy_port.attention_backward(case.q, case.k, case.v, case.q_out, case.do, case.do_out,
                                              case.window, case.scale, bug)
            if backward_bug == "kv-base-stream-only":  # dk, dv forget the output stream's share
                g0 = numpy_port.attention_backward(case.q, case.k, case.v, case.q_out, case.do,
                                                   np.zeros_like(case.do_out), case.window, case.scale)
                g["dk"], g["dv"] = g0["dk"], g0["dv"]
            out.update(g)
        return out
    return port


def orthros_command():
    exe = os.environ.get("ORTHROS") or shutil.which("orthros")
    if not exe:
        raise unittest.SkipTest("no orthros command (set ORTHROS or put it on PATH)")
    return exe


def snapshot(root):
    return sorted((os.path.relpath(os.path.join(d, f), root), os.stat(os.path.join(d, f)).st_mtime_ns)
                  for d, _, files in os.walk(root) for f in files)


class AssertMatchesGolden(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.exe = orthros_command()
        cls.tmp = tempfile.mkdtemp(prefix="orthros-testing-")
        cls.fwd = os.path.join(cls.tmp, "golden-f32")
        cls.grad = os.path.join(cls.tmp, "golden-bf16-grad")
        for args in (["--out", cls.fwd, "--dtype", "f32"], ["--out", cls.grad, "--dtype", "bf16", "--grad"]):
            subprocess.run([cls.exe, "golden"] + args, check=True, stdout=subprocess.DEVNULL)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_installed_where_expected(self):
        self.assertTrue(callable(orthros.attention) and callable(orthros.check_attention_backward))
        self.assertTrue(issubclass(orthros.Error, ValueError))
        self.assertEqual(orthros.Model.__module__, "orthros")
        if os.environ.get("ORTHROS_EXPECT_INSTALLED") == "1":  # the wheel test: venv, not a build tree
            prefix = os.path.realpath(sys.prefix)
            self.assertTrue(os.path.realpath(orthros.__file__).startswith(prefix), orthros.__file__)
            self.assertTrue(os.path.realpath(orthros._core.__file__).startswith(prefix), orthros._core.__file__)
            self.assertTrue(os.path.realpath(shutil.which("orthros")).startswith(prefix), shutil.which("orthros"))

    def test_correct_port_passes_forward_suite(self):
        r = orthros.testing.assert_matches_golden(make_port(), self.fwd)
        self.assertEqual(len(r["passed"]), 32)
        self.assertEqual(r["failed"], [])
        self.assertFalse(any(rep["grad"] for rep in r["reports"].values()))

    def test_correct_port_passes_gradient_suite(self):
        r = orthros.testing.assert_matches_golden(make_port(), self.grad)
        self.assertEqual(r["failed"], [])
        grads = [n for n, rep in r["reports"].items() if rep["grad"]]
        self.assertEqual(len(r["passed"]), 33)
        self.assertEqual(len(grads), 32)  # every case but the forward-only edge_large_logits
        self.assertNotIn("edge_large_logits", grads)
        self.assertIn("dk", r["reports"]["pt"]["tensors"])

    def test_window_off_by_one_is_named(self):
        with self.assertRaises(AssertionError) as cm:
            orthros.testing.assert_matches_golden(make_port(bug="window-off-by-one"), self.fwd, max_cases_shown=None)
        msg = str(cm.exception)
        self.assertIn("on 27 of 32 cases", msg)
        self.assertRegex(msg, r"(?m)^edge_window_probe \(edge, T=8 P=0 T_out=1 H_q=2 H_kv=1 D=64 w=4, f32\)$")
        block = msg[msg.index("\nedge_window_probe ("):].split("\n", 2)[2]
        block = block[:block.find("\n", block.find("    lse "))]
        self.assertRegex(block, r"o FAIL \(rel,abs\): rel_err .*; 4 of 8 rows bad: rows 4-7 = positions t = 5-8")
        self.assertRegex(block, r"lse FAIL \(rel,abs\): .*positions t = 5-8")
        self.assertNotIn("o_out FAIL", block)
        for ok in ("edge_w_eq_T", "edge_T_lt_w", "edge_single_token", "ragged_prefill_b0", "ragged_decode_b0"):
            self.assertNotIn(ok + " (", msg)

    def test_window_off_by_one_only_selected_case(self):
        with self.assertRaisesRegex(AssertionError, r"on 1 of 1 cases .*: edge_window_probe\n"):
            orthros.testing.assert_matches_golden(make_port(bug="window-off-by-one"), self.fwd,
                                                  only="edge_window_probe")
        r = orthros.testing.assert_matches_golden(make_port(bug="window-off-by-one"), self.fwd,
                                                  skip=lambda e: e["name"] not in ("edge_w_eq_T", "edge_T_lt_w"))
        self.assertEqual(sorted(r["passed"]), ["edge_T_lt_w", "edge_w_eq_T"])
        self.assertEqual(len(r["skipped"]), 30)

    def test_backward_mistake_names_gradients(self):
        with self.assertRaises(AssertionError) as cm:
            orthros.testing.assert_matches_golden(make_port(backward_bug="kv-base-stream-only"), self.grad,
                                                  only="sft")
        msg = str(cm.exception)
        self.assertRegex(msg, r"(?m)^sft \(sft, .*, bf16, with gradients\)$")
        self.assertRegex(msg, r"dk FAIL \(.*\).*positions t = ")
        self.assertRegex(msg, r"dv FAIL \(.*\).*positions t = ")
        for fine in ("    o FAIL", "    dq FAIL", "    dq_out FAIL"):
            self.assertNotIn(fine, msg)

    def test_forward_only_port_on_gradient_suite(self):
        with self.assertRaisesRegex(AssertionError, r"dq: missing \(the port's result has no 'dq'\)"):
            orthros.testing.assert_matches_golden(make_port(grads=False), self.grad, only="pt")
        r = orthros.testing.assert_matches_golden(make_port(grads=False), self.grad, grad=False)
        self.assertEqual(len(r["passed"]), 33)
        with self.assertRaisesRegex(ValueError, r"has no gradients"):
            orthros.testing.assert_matches_golden(make_port(), self.fwd, grad=True)

    def test_port_exception_names_case(self):
        def port(case):
            if case.name == "edge_d128":
                raise ZeroDivisionError("my kernel")
            return make_port()(case)
        with self.assertRaises((ZeroDivisionError, RuntimeError)) as cm:
            orthros.testing.assert_matches_golden(port, self.fwd)
        text = str(cm.exception) + " ".join(getattr(cm.exception, "__notes__", []))
        self.assertIn("edge_d128", text)

    def test_writes_nothing(self):
        before = snapshot(self.tmp)
        cwd = tempfile.mkdtemp(prefix="orthros-testing-cwd-")
        old = os.getcwd()
        try:
            os.chdir(cwd)
            with self.assertRaises(AssertionError):
                orthros.testing.assert_matches_golden(make_port(bug="window-off-by-one"), self.grad)
            orthros.testing.assert_matches_golden(make_port(), self.grad, only="decode")
            self.assertEqual(os.listdir(cwd), [])
        finally:
            os.chdir(old)
            shutil.rmtree(cwd, ignore_errors=True)
        self.assertEqual(snapshot(self.tmp), before)

    def test_bad_suite(self):
        with self.assertRaisesRegex(ValueError, r"cannot read golden suite .*manifest\.json"):
            orthros.testing.assert_matches_golden(make_port(), os.path.join(self.tmp, "nope"))
        with self.assertRaisesRegex(ValueError, r"no case selected"):
            orthros.testing.assert_matches_golden(make_port(), self.fwd, only="no-such-case")


if __name__ == "__main__":
    unittest.main(verbosity=2)
