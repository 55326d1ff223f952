"""orthros.testing's failure messages, and the helper under pytest (ctest packaging_testing_pytest).

Run with PYTHONPATH=<build>/python and ORTHROS=<the orthros binary>: a wrong shape is reported
with the shape the port returned; bad rows are written as runs of consecutive rows, all of them;
the reader names a truncated file, a FIFO and a device; and under pytest (Debian's
python3-pytest, installed by ci/setup.sh) a failing assert_matches_golden shows the test's line
and the message, not the helper's own source (__tracebackhide__).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

import numpy as np

import orthros
import orthros.testing

HERE = os.path.dirname(os.path.abspath(__file__))
PORT_DIR = os.environ.get("PORT_DIR", os.path.join(HERE, "..", "..", "examples", "pytorch_port"))
sys.path.insert(0, PORT_DIR)
import numpy_port  # noqa: E402  (examples/pytorch_port/numpy_port.py)


def good(case):
    return numpy_port.attention(*(a.astype(np.float32) for a in (case.q, case.k, case.v, case.q_out)),
                                case.window, case.scale)


class TestingMessagesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.suite = os.path.join(cls.tmp.name, "suite-f32")
        exe = os.environ.get("ORTHROS") or shutil.which("orthros")
        subprocess.run([exe, "golden", "--out", cls.suite, "--dtype", "f32", "--seed", "7"], check=True,
                       capture_output=True)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def failure(self, port, only="pt"):
        with self.assertRaises(AssertionError) as cm:
            orthros.testing.assert_matches_golden(port, self.suite, only=only)
        return str(cm.exception)

    def test_wrong_shape_names_the_returned_shape(self):
        def transposed(case):
            out = good(case)
            out["o"] = np.ascontiguousarray(out["o"].transpose(1, 0, 2))  # [H_q, T, D]
            return out
        msg = self.failure(transposed)
        case = next(orthros.testing.golden_cases(self.suite, only="pt"))[0]
        T, H, D = case.T, case.H_q, case.D
        self.assertIn(f"o FAIL (shape): the port returned shape [{H}, {T}, {D}], the suite expects [{T}, {H}, {D}]",
                      msg)

    def test_bad_rows_are_runs_of_every_row(self):
        def spoiled(case):
            out = good(case)
            out["o"] = out["o"].copy()
            out["o"][3:case.T - 3, 0, 1] += 0.5  # more than 16 consecutive rows
            out["o"][case.T - 1, 0, 1] += 0.5
            return out
        msg = self.failure(spoiled)
        case = next(orthros.testing.golden_cases(self.suite, only="pt"))[0]
        T = case.T
        n = (T - 6) + 1
        self.assertIn(f"; {n} of {T} rows bad: rows 3-{T - 4}, {T - 1} = positions t = 4-{T - 3}, {T}", msg)
        self.assertNotIn(", ...", msg)
        rep = orthros.check(np.zeros((40, 2)), np.ones((40, 2)), "f64")
        self.assertEqual((rep["bad_row_ranges"], rep["bad_row_count"], len(rep["bad_rows"])), ([(0, 39)], 40, 16))

    def test_reader_names_truncation_fifos_and_devices(self):
        src = os.path.join(self.suite, "cases", "pt.safetensors")
        cut = os.path.join(self.tmp.name, "cut.safetensors")
        with open(src, "rb") as f:
            raw = f.read()
        with open(cut, "wb") as f:
            f.write(raw[:-64])
        with self.assertRaisesRegex(ValueError, r"cut\.safetensors: tensor \w+: data_offsets .* reach past the "
                                                r"\d+ data bytes of the file; file truncated\?"):
            orthros.testing.read_safetensors(cut)
        with self.assertRaisesRegex(ValueError, r"'/dev/zero' is a character device, not a \.safetensors file"):
            orthros.testing.read_safetensors("/dev/zero")
        fifo = os.path.join(self.tmp.name, "fifo")
        os.mkfifo(fifo)
        with self.assertRaisesRegex(ValueError, r"is a FIFO \(named pipe\)"):
            orthros.testing.read_safetensors(fifo)
        with self.assertRaisesRegex(ValueError, r"is a directory"):
            orthros.testing.read_safetensors(self.suite)
        tensors, meta = orthros.testing.read_safetensors(src)
        self.assertEqual(tensors["q"].ndim, 3)
        self.assertIn("window", meta)
        # a truncated case inside a suite: the helper says which case and why
        broken = os.path.join(self.tmp.name, "broken")
        shutil.copytree(self.suite, broken)
        shutil.copy(cut, os.path.join(broken, "cases", "pt.safetensors"))
        with self.assertRaisesRegex(ValueError, r"golden suite .*, case pt: .*file truncated\?"):
            orthros.testing.assert_matches_golden(good, broken, only="pt")

    def test_pytest_shows_the_message_not_the_helper_source(self):
        import importlib.util
        self.assertIsNotNone(importlib.util.find_spec("pytest"),
                             "pytest is missing: ci/setup.sh installs Debian's python3-pytest")
        test = os.path.join(self.tmp.name, "test_port_under_pytest.py")
        with open(test, "w") as f:
            f.write(textwrap.dedent(f"""
                import sys
                import numpy as np
                import orthros.testing
                sys.path.insert(0, {PORT_DIR!r})
                import numpy_port

                def off_by_one(case):
                    return numpy_port.attention(*(a.astype(np.float32) for a in (case.q, case.k, case.v, case.q_out)),
                                                case.window, case.scale, "window-off-by-one")

                def test_port():
                    orthros.testing.assert_matches_golden(off_by_one, {self.suite!r}, only="edge_window_probe")
                """))
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                           capture_output=True, text=True, cwd=self.tmp.name, timeout=300)
        out = p.stdout + p.stderr
        self.assertEqual(p.returncode, 1, out)
        self.assertIn("AssertionError: port fails SPEC §6 on 1 of 1 cases", out)
        self.assertIn("edge_window_probe", out)
        self.assertIn("orthros.testing.assert_matches_golden(off_by_one", out)  # the test's own line
        for helper_line in ("def assert_matches_golden", "failures.append", "__tracebackhide__", "raise AssertionError("):
            self.assertNotIn(helper_line, out, "pytest printed the helper's source")
        self.assertLess(len(out.splitlines()), 40, out)


if __name__ == "__main__":
    unittest.main()
