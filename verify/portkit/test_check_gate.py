"""`orthros check` as a CI gate, and the command line's inputs: run by ctest (label unit) with
ORTHROS=<orthros binary> and PORT_DIR=<examples/pytorch_port>.

- `check --suite` validates the manifest and every case and expected file it judges (a missing,
  truncated or foreign case file is exit status 2, whatever the results are), and says how many
  cases were judged; with --skip-missing no judged case, or fewer than --min-judged N, is exit 1.
- Paths of the wrong kind are named (a directory for --case, a file for --actual-dir, the
  manifest itself for --suite), and inputs that are not regular files (FIFOs, devices) are
  rejected before they are opened, so nothing blocks on them.
- --dtype may not differ from the dtype of the expected files' E_X; --seed takes no negative;
  `orthros --version`; no help text cites an issue number; bad rows are printed and written as
  runs of consecutive rows, all of them.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

ORTHROS = os.environ["ORTHROS"]
PORT_DIR = os.environ["PORT_DIR"]
sys.path.insert(0, PORT_DIR)
import st_io  # noqa: E402

SEED = "7"


def run(*args, timeout=120):
    return subprocess.run([ORTHROS, *args], capture_output=True, text=True, timeout=timeout)


class CheckGateTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.suite = os.path.join(cls.tmp.name, "suite")
        p = run("golden", "--out", cls.suite, "--dtype", "bf16", "--seed", SEED)
        assert p.returncode == 0, p.stderr
        cls.results = os.path.join(cls.tmp.name, "results")
        subprocess.run([sys.executable, os.path.join(PORT_DIR, "numpy_port.py"), "--golden", cls.suite,
                        "--out", cls.results], check=True, capture_output=True)
        with open(os.path.join(cls.suite, "manifest.json")) as f:
            cls.manifest = json.load(f)
        cls.names = [c["name"] for c in cls.manifest["cases"]]

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def copy(self, src, name):
        dst = os.path.join(self.tmp.name, name)
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)
        return dst

    def partial_results(self, keep, name):
        """A results directory holding only the results of the cases in `keep`."""
        d = os.path.join(self.tmp.name, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        for n in keep:
            shutil.copy(os.path.join(self.results, n + ".safetensors"), d)
        return d

    def assertUsageError(self, p, *fragments):
        """Exit 2, nothing on stdout, one line `orthros: error: ...` holding every fragment."""
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertEqual(p.stdout, "")
        lines = p.stderr.splitlines()
        self.assertEqual(len(lines), 1, p.stderr)
        self.assertTrue(lines[0].startswith("orthros: error: "), lines[0])
        for f in fragments:
            self.assertIn(f, lines[0])

    # ---- judged counts and the gate's exit status ----------------------------------------------

    def test_all_results_judged(self):
        p = run("check", "--suite", self.suite, "--actual-dir", self.results)
        self.assertEqual(p.returncode, 0, p.stdout[-2000:])
        self.assertTrue(p.stdout.endswith(f"{len(self.names)} passed, 0 failed\n"), p.stdout[-300:])
        self.assertNotIn("\njudged ", p.stdout)
        j = json.loads(run("check", "--suite", self.suite, "--actual-dir", self.results, "--json").stdout)
        self.assertEqual((j["judged"], j["total"], j["skipped"], j["pass"]), (len(self.names), len(self.names), 0, True))

    def test_skip_missing_says_how_many_were_judged(self):
        n = len(self.names)
        part = self.partial_results(["pt", "sft"], "two_results")
        p = run("check", "--suite", self.suite, "--actual-dir", part, "--skip-missing")
        self.assertEqual(p.returncode, 0, p.stdout[-2000:])
        self.assertIn(f"2 passed, 0 failed, {n - 2} skipped (no result file)\njudged 2 of {n} cases\n", p.stdout)
        j = json.loads(run("check", "--suite", self.suite, "--actual-dir", part, "--skip-missing", "--json").stdout)
        self.assertEqual((j["passed"], j["judged"], j["total"], j["skipped"], j["pass"]), (2, 2, n, n - 2, True))
        # A gate that needs every case: 2 of 32 is exit status 1, and the report says why.
        p = run("check", "--suite", self.suite, "--actual-dir", part, "--skip-missing", "--min-judged", str(n))
        self.assertEqual(p.returncode, 1, p.stdout[-2000:])
        self.assertTrue(p.stdout.endswith(
            f"judged 2 of {n} cases (--min-judged {n})\n"
            f"FAIL: 2 of {n} cases judged ({n - 2} without a result file), fewer than --min-judged {n}\n"), p.stdout[-400:])
        j = json.loads(run("check", "--suite", self.suite, "--actual-dir", part, "--skip-missing", "--min-judged",
                           str(n), "--json").stdout)
        self.assertEqual((j["pass"], j["min_judged"], j["judged"]), (False, n, 2))
        self.assertIn("fewer than --min-judged", j["reason"])
        self.assertEqual(run("check", "--suite", self.suite, "--actual-dir", part, "--skip-missing",
                             "--min-judged", "2").returncode, 0)
        # Without --skip-missing a missing result is a failure.
        p = run("check", "--suite", self.suite, "--actual-dir", part)
        self.assertEqual(p.returncode, 1)
        self.assertIn(f"2 passed, {n - 2} failed\n", p.stdout)
        self.assertIn("error: no result file", p.stdout)

    def test_nothing_judged_is_a_failure_that_says_why(self):
        n = len(self.names)
        empty = self.partial_results([], "no_results")
        p = run("check", "--suite", self.suite, "--actual-dir", empty, "--skip-missing")
        self.assertEqual(p.returncode, 1, p.stdout[-1000:])
        self.assertTrue(p.stdout.endswith(
            f"0 passed, 0 failed, {n} skipped (no result file)\njudged 0 of {n} cases\n"
            f"FAIL: no case judged: all {n} selected cases lack a result file (--skip-missing)\n"), p.stdout[-400:])

    def test_min_judged_beyond_the_selection_is_a_usage_error(self):
        self.assertUsageError(run("check", "--suite", self.suite, "--actual-dir", self.results, "--only", "decode_step",
                                  "--min-judged", "5"), "--min-judged 5 exceeds the 4 cases selected by --only")
        p = run("check", "--suite", self.suite, "--actual-dir", self.results, "--min-judged", "0")
        self.assertEqual(p.returncode, 2)
        self.assertIn("--min-judged", p.stderr)

    # ---- the suite's own files are validated ---------------------------------------------------

    def test_missing_or_truncated_case_file_is_exit_2(self):
        s = self.copy(self.suite, "no_case")
        os.remove(os.path.join(s, "cases", "pt.safetensors"))
        self.assertUsageError(run("check", "--suite", s, "--actual-dir", self.results),
                              "case pt, case file", "no such file")
        s = self.copy(self.suite, "truncated_case")
        path = os.path.join(s, "cases", "pt.safetensors")
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(size - 100)
        self.assertUsageError(run("check", "--suite", s, "--actual-dir", self.results, "--skip-missing"),
                              "case pt, case file", "truncated")

    def test_case_file_of_another_case_is_exit_2(self):
        s = self.copy(self.suite, "swapped_case")
        shutil.copy(os.path.join(s, "cases", "decode_step_1.safetensors"), os.path.join(s, "cases", "pt.safetensors"))
        self.assertUsageError(run("check", "--suite", s, "--actual-dir", self.results),
                              "case pt", "does not match its manifest entry")

    def edited_manifest(self, name, edit):
        s = self.copy(self.suite, name)
        m = json.loads(json.dumps(self.manifest))
        edit(m)
        with open(os.path.join(s, "manifest.json"), "w") as f:
            json.dump(m, f)
        return s

    def test_incomplete_manifest_is_exit_2(self):
        s = self.edited_manifest("dropped_case", lambda m: m["cases"].pop(
            next(i for i, c in enumerate(m["cases"]) if c["name"] == "ragged_decode_b1")))
        self.assertUsageError(run("check", "--suite", s, "--actual-dir", self.results),
                              "ragged_decode_b1", "which \"cases\" does not list")
        s = self.edited_manifest("twice", lambda m: m["cases"].append(dict(m["cases"][0])))
        self.assertUsageError(run("check", "--suite", s, "--actual-dir", self.results), "\"pt\" is listed twice")
        s = self.edited_manifest("no_file", lambda m: m["cases"][1].pop("file"))
        self.assertUsageError(run("check", "--suite", s, "--actual-dir", self.results), "has no \"file\" path")
        s = self.edited_manifest("empty", lambda m: m.update(cases=[]))
        self.assertUsageError(run("check", "--suite", s, "--actual-dir", self.results), "\"cases\" is empty")

    # ---- paths of the wrong kind ----------------------------------------------------------------

    def test_paths_of_the_wrong_kind_are_named(self):
        mpath = os.path.join(self.suite, "manifest.json")
        p = run("check", "--suite", mpath, "--actual-dir", self.results)  # the manifest itself: its suite
        self.assertEqual(p.returncode, 0, p.stderr + p.stdout[-500:])
        self.assertNotIn("manifest.json/manifest.json", p.stdout + p.stderr)
        self.assertUsageError(run("check", "--suite", os.path.join(self.tmp.name, "nowhere"), "--actual-dir",
                                  self.results), "--suite", "does not exist")
        result = os.path.join(self.results, "pt.safetensors")
        self.assertUsageError(run("check", "--suite", self.suite, "--actual-dir", result),
                              "--actual-dir", result, "is a file, not a directory")
        cases = os.path.join(self.suite, "cases")
        self.assertUsageError(run("check", "--case", cases, "--actual", result), "--case " + cases, "is a directory")

    def test_fifos_and_devices_are_rejected_before_reading(self):
        fifo = os.path.join(self.tmp.name, "fifo.safetensors")
        if not os.path.exists(fifo):
            os.mkfifo(fifo)
        out = os.path.join(self.tmp.name, "out.safetensors")
        # Each would block (a FIFO without a writer) or never end (/dev/zero) if it were opened.
        self.assertUsageError(run("attention", "--in", "/dev/zero", "--out", out, timeout=30),
                              "\"/dev/zero\" is a character device, not a .safetensors file")
        self.assertUsageError(run("attention", "--in", fifo, "--out", out, timeout=30), "is a FIFO (named pipe)")
        result = os.path.join(self.results, "pt.safetensors")
        self.assertUsageError(run("check", "--case", fifo, "--actual", result, timeout=30), "--case", "FIFO")
        case = os.path.join(self.suite, "cases", "pt.safetensors")
        p = run("check", "--case", case, "--actual", "/dev/zero", timeout=30)  # the port's result: its failure
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("is a character device, not a .safetensors file", p.stdout)
        self.assertUsageError(run("verify", "--text", "/dev/zero", timeout=30),
                              "--text", "is a character device, not a text file")
        self.assertUsageError(run("verify", "--text", fifo, timeout=30), "--text", "FIFO")

    # ---- --dtype, --seed, --version, --help -----------------------------------------------------

    def test_dtype_other_than_the_expected_files_is_exit_2(self):
        self.assertUsageError(run("check", "--suite", self.suite, "--actual-dir", self.results, "--dtype", "f32"),
                              "--dtype f32", "of bf16", "mix f32's relative bound with bf16's absolute one")
        self.assertEqual(run("check", "--suite", self.suite, "--actual-dir", self.results, "--dtype",
                             "bf16").returncode, 0)
        case = os.path.join(self.suite, "cases", "pt.safetensors")
        expected = os.path.join(self.suite, "expected", "pt.safetensors")
        result = os.path.join(self.results, "pt.safetensors")
        self.assertUsageError(run("check", "--case", case, "--expected", expected, "--actual", result,
                                  "--dtype", "f16"), "--dtype f16", "--expected")
        # Without --expected the oracle runs at --dtype on the case: consistent, allowed.
        p = run("check", "--case", case, "--actual", result, "--dtype", "f32")
        self.assertIn("f32", p.stdout)
        self.assertIn(p.returncode, (0, 1))

    def test_negative_or_too_large_seed_is_rejected(self):
        out = os.path.join(self.tmp.name, "seeded")
        for cmd, limit in ((["golden", "--out", out], "18446744073709551615"), (["verify"], "4294967295")):
            for bad in ("-1", "18446744073709551616", "1e3", "12abc"):
                p = run(*cmd, "--seed", bad)
                self.assertEqual(p.returncode, 2, (cmd, bad, p.stdout, p.stderr))
                self.assertIn(f"--seed: must be a decimal integer in [0, {limit}] (got \"{bad}\")", p.stderr)
        self.assertFalse(os.path.exists(out))

    def test_version(self):
        p = run("--version")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertRegex(p.stdout, r"^orthros \d+\.\d+\.\d+ \(CPU oracle")

    def test_help_cites_no_issue_numbers(self):
        texts = [run("--help").stdout]
        for sub in ("verify", "attention", "golden", "check"):
            p = run(sub, "--help")
            self.assertEqual(p.returncode, 0, sub)
            texts.append(p.stdout)
            self.assertIn("--", p.stdout)
        for t in texts:
            self.assertIsNone(re.search(r"\bissue\s*#?\d", t, re.I), t)

    # ---- bad rows as runs -----------------------------------------------------------------------

    def test_bad_rows_are_reported_as_runs(self):
        t, _ = st_io.read(os.path.join(self.results, "pt.safetensors"))
        o = t["o"].astype(np.float32).copy()
        T = o.shape[0]
        bad = list(range(3, T - 3)) + [T - 1]  # rows 3..T-4 and T-1: two runs, more than 16 rows
        o[bad, 1, 2] += 0.75
        d = self.partial_results([], "bad_rows")
        tensors = {k: v.astype(np.float32) for k, v in t.items()}
        tensors["o"] = o
        st_io.write(os.path.join(d, "pt.safetensors"), tensors, dtype="F32")
        p = run("check", "--suite", self.suite, "--actual-dir", d, "--only", "pt", "--skip-missing")
        self.assertEqual(p.returncode, 1)
        # pt: P = 0, so row i is position i+1
        self.assertIn(f"    o: {len(bad)} of {T} rows over the abs bound or non-finite: rows 3-{T - 4}, {T - 1} "
                      f"= positions t = 4-{T - 3}, {T}\n", p.stdout)
        j = json.loads(run("check", "--suite", self.suite, "--actual-dir", d, "--only", "pt", "--skip-missing",
                           "--json").stdout)
        case = next(c for c in j["cases"] if c["name"] == "pt")
        ot = next(x for x in case["tensors"] if x["name"] == "o")
        self.assertEqual(ot["bad_row_count"], len(bad))
        self.assertEqual(ot["bad_rows"], bad[:16])  # the first 16, as before
        self.assertEqual(ot["bad_row_ranges"], [[3, T - 4], [T - 1, T - 1]])
        self.assertEqual(ot["bad_position_ranges"], [[4, T - 3], [T, T]])


if __name__ == "__main__":
    unittest.main()
