"""The example port's scripts and reader: examples/pytorch_port/run_on_gpu.sh's exit status (with
stand-ins for PyTorch) and st_io (the package's safetensors reader, its BF16 rounding).

Run by ctest (label unit) with ORTHROS=<path of the orthros binary> and PORT_DIR=<examples/pytorch_port>.
"""
import json
import os
import stat
import subprocess
import sys
import tempfile
import unittest

import numpy as np

from golden_testing import ORTHROS, PORT_DIR, run, port, ALL_TENSORS, subset_suite


class RunOnGpuScriptTest(unittest.TestCase):
    """examples/pytorch_port/run_on_gpu.sh's exit status, with stand-ins for PyTorch (none needed here)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        # Small suites (4 cases: a T_out = 0 chunk, a cache, the window probe) keep the checks fast.
        few = ["pt", "chunked_prefill_1of3", "edge_cache_sft", "edge_window_probe"]
        run("golden", "--out", os.path.join(cls.tmp.name, "full"), "--dtype", "f32", "--seed", "3")
        cls.suite = subset_suite(os.path.join(cls.tmp.name, "full"), os.path.join(cls.tmp.name, "golden"), few)
        run("golden", "--grad", "--out", os.path.join(cls.tmp.name, "full_grad"), "--dtype", "bf16", "--seed", "3")
        cls.grad_suite = subset_suite(os.path.join(cls.tmp.name, "full_grad"), os.path.join(cls.tmp.name,
                                                                                            "golden_grad"), few)
        # A "python" whose torch_port.py is the NumPy port (--backend dropped); FAKE_PORT_FAIL=1
        # makes every port run fail without writing results; FAKE_FIX_BUG=1 drops --bug (a
        # "broken" port that is not broken, which the checks must report). Other scripts
        # (summarize_checks.py) run with this interpreter.
        cls.fake = os.path.join(cls.tmp.name, "fake_python")
        with open(cls.fake, "w") as f:
            f.write(f"""#!{sys.executable}
import os, sys
a = sys.argv[1:]
if a[0] == "-c":
    print("torch stand-in")
    sys.exit(0)
if not a[0].endswith("torch_port.py"):
    os.execv(sys.executable, [sys.executable] + a)
if os.environ.get("FAKE_PORT_FAIL"):
    sys.exit(1)
a = a[1:]
if os.environ.get("FAKE_FIX_BUG") and "--bug" in a:
    i = a.index("--bug")
    del a[i:i + 2]
i = a.index("--backend")
del a[i:i + 2]
os.execv(sys.executable, [sys.executable, {os.path.join(PORT_DIR, "numpy_port.py")!r}] + a)
""")
        os.chmod(cls.fake, os.stat(cls.fake).st_mode | stat.S_IXUSR)
        # a torch package that cannot be imported, whatever is installed
        cls.notorch = os.path.join(cls.tmp.name, "notorch")
        os.makedirs(os.path.join(cls.notorch, "torch"))
        with open(os.path.join(cls.notorch, "torch", "__init__.py"), "w") as f:
            f.write("raise ImportError('No module named torch (test stand-in)')\n")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def script(self, out, *suites, **env):
        e = dict(os.environ, ORTHROS=ORTHROS, **env)
        return subprocess.run(["bash", os.path.join(PORT_DIR, "run_on_gpu.sh"), out, *(suites or [self.suite])],
                              capture_output=True, text=True, env=e)

    def test_missing_torch_is_an_error(self):
        p = self.script(os.path.join(self.tmp.name, "out_notorch"), PYTHON=sys.executable,
                        PYTHONPATH=self.notorch)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertIn("cannot import torch", p.stderr)

    def test_passing_ports_and_caught_bug_exit_0(self):
        p = self.script(os.path.join(self.tmp.name, "out_ok"), PYTHON=self.fake)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("check golden.sdpa-bug: ", p.stdout)

    def test_gradient_suite_is_judged_on_eight_tensors_and_the_bug_caught_in_them(self):
        out = os.path.join(self.tmp.name, "out_grad")
        p = self.script(out, self.suite, self.grad_suite, PYTHON=self.fake, VARIANTS="sdpa flex-bug",
                        RESULTS_ARCHIVE="0", CHECK_JOBS="2")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertFalse(os.path.exists(os.path.join(out, "torch_results.tar.gz")))
        with open(os.path.join(out, "checks.jsonl")) as f:
            rows = {r["label"]: r["report"] for r in map(json.loads, f)}
        self.assertEqual(sorted(rows), ["golden.flex-bug", "golden.sdpa", "golden_grad.flex-bug", "golden_grad.sdpa"])
        names = lambda rep: {t["name"] for c in rep["cases"] for t in c["tensors"]}  # noqa: E731
        self.assertEqual(names(rows["golden.sdpa"]), {"o", "o_out", "lse", "lse_out"})
        self.assertEqual(names(rows["golden_grad.sdpa"]), set(ALL_TENSORS))
        self.assertTrue(rows["golden_grad.sdpa"]["pass"])
        self.assertIn("golden_grad.flex-bug: ", p.stdout)
        self.assertRegex(p.stdout, r"golden_grad.flex-bug: \d+ passed, \d+ failed; failing tensors: .*dq \(")
        table = subprocess.run([sys.executable, os.path.join(PORT_DIR, "summarize_checks.py"), "--table",
                                os.path.join(out, "checks.jsonl")], capture_output=True, text=True, check=True).stdout
        self.assertIn("| golden_grad.sdpa | 4 passed, 0 failed |", table)
        # a "-bug" variant that is not broken is not caught: the script fails
        p = self.script(os.path.join(self.tmp.name, "out_nobug"), self.grad_suite, PYTHON=self.fake,
                        VARIANTS="sdpa-bug", RESULTS_ARCHIVE="0", FAKE_FIX_BUG="1")
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("FAILED: check golden_grad.sdpa-bug exited 0 (want 1)", p.stderr)

    def test_parallel_check_equals_the_plain_check(self):
        out = os.path.join(self.tmp.name, "np_bug_par")
        port(self.grad_suite, out, bug="window-off-by-one")
        j, t = os.path.join(self.tmp.name, "par.json"), os.path.join(self.tmp.name, "par.txt")
        p = subprocess.run([sys.executable, os.path.join(PORT_DIR, "check_parallel.py"), "--orthros", ORTHROS,
                            "--suite", self.grad_suite, "--actual-dir", out, "--jobs", "3", "--json", j, "--text", t],
                           capture_output=True, text=True)
        plain = run("check", "--suite", self.grad_suite, "--actual-dir", out, check=False)
        self.assertEqual((p.returncode, plain.returncode), (1, 1), p.stderr)
        with open(t) as f:
            self.assertEqual(f.read(), plain.stdout)
        with open(j) as f:
            self.assertEqual(json.load(f), json.loads(run("check", "--suite", self.grad_suite, "--actual-dir", out,
                                                          "--json", check=False).stdout))

    def test_failing_port_runs_exit_nonzero(self):
        p = self.script(os.path.join(self.tmp.name, "out_fail"), PYTHON=self.fake, FAKE_PORT_FAIL="1")
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("failed", p.stderr)


class StIoReaderTest(unittest.TestCase):
    """The example's reader is the package's (one implementation: verify/python/orthros/_safetensors.py)."""

    def test_st_io_reads_with_the_package_reader(self):
        import st_io
        src = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "verify", "python",
                           "orthros", "_safetensors.py")
        self.assertEqual(os.path.realpath(st_io.read.__code__.co_filename), os.path.realpath(src))
        with tempfile.TemporaryDirectory() as d:  # the package reader's checks, which st_io's own lacked
            short = os.path.join(d, "short.safetensors")
            with open(short, "wb") as f:
                f.write(b"\x10\x00\x00")
            with self.assertRaisesRegex(ValueError, "shorter than 8 bytes"):
                st_io.read(short)


class StIoBf16Test(unittest.TestCase):
    """The example's BF16 writer rounds once, to nearest even, from the value's own precision."""

    def test_float64_is_not_rounded_through_float32(self):
        import st_io
        # 1 + 2^-8 + 2^-30: above the halfway point 1 + 2^-8 between 1 and 1 + 2^-7, so it rounds
        # up to 1.0078125 (0x3F81); via float32 it first becomes the tie 1 + 2^-8, then 1.0 (0x3F80).
        x = np.array([1 + 2**-8 + 2**-30, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8 + 2**-30)])
        self.assertEqual([hex(b) for b in st_io._bf16_bits(x)], ["0x3f81", "0x3f80", "0x3f82", "0xbf81"])

    def test_float32_rounding_is_bit_manipulation_rne(self):
        import st_io
        rng = np.random.default_rng(20261130)
        x = np.concatenate([rng.standard_normal(5000), rng.standard_normal(500) * 1e-39,
                            [3.39e38, 1e-45, np.inf, -np.inf]]).astype(np.float32)
        u = x.view(np.uint32).astype(np.uint64)
        expect = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # float32 -> bf16 RNE on the bits
        np.testing.assert_array_equal(st_io._bf16_bits(x), expect)
        self.assertEqual(st_io._bf16_bits(np.array([np.nan]))[0], 0x7FC0)


if __name__ == "__main__":
    unittest.main()
