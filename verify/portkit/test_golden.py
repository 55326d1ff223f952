"""End-to-end tests of `orthros golden`, `orthros check` and the NumPy example port.

Run by ctest (label unit) with ORTHROS=<path of the orthros binary> and PORT_DIR=<examples/pytorch_port>.
"""
import concurrent.futures
import filecmp
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest

import numpy as np

ORTHROS = os.environ["ORTHROS"]
PORT_DIR = os.environ["PORT_DIR"]
sys.path.insert(0, PORT_DIR)
import st_io  # noqa: E402


def run(*args, check=True):
    p = subprocess.run([ORTHROS, *args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"orthros {' '.join(args)} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def port(golden, out, bug=None):
    cmd = [sys.executable, os.path.join(PORT_DIR, "numpy_port.py"), "--golden", golden, "--out", out]
    if bug:
        cmd += ["--bug", bug]
    subprocess.run(cmd, check=True, capture_output=True)


def all_files(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


class GoldenTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dirs = {}
        for dt in ("f64", "f32", "bf16", "f16"):
            d = os.path.join(cls.tmp.name, "golden_" + dt)
            run("golden", "--out", d, "--dtype", dt, "--seed", "7")
            cls.dirs[dt] = d

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def manifest(self, dt):
        with open(os.path.join(self.dirs[dt], "manifest.json")) as f:
            return json.load(f)

    def test_regenerating_gives_identical_bytes(self):
        again = os.path.join(self.tmp.name, "again")
        run("golden", "--out", again, "--dtype", "bf16", "--seed", "7")
        files = all_files(self.dirs["bf16"])
        self.assertEqual(files, all_files(again))
        match, mismatch, errors = filecmp.cmpfiles(self.dirs["bf16"], again, files, shallow=False)
        self.assertEqual(mismatch + errors, [], "seed=7")
        other = os.path.join(self.tmp.name, "other_seed")
        run("golden", "--out", other, "--dtype", "bf16", "--seed", "8")
        self.assertFalse(filecmp.cmp(os.path.join(again, "cases/pt.safetensors"),
                                     os.path.join(other, "cases/pt.safetensors"), shallow=False))

    def test_manifest_covers_every_regime_and_edge(self):
        m = self.manifest("bf16")
        self.assertEqual(m["format"], "orthros-golden")
        self.assertEqual(m["suite_version"], 1)
        regimes = {c["regime"] for c in m["cases"]}
        self.assertTrue({"pt", "sft", "prefill", "chunked_prefill", "decode", "ragged_prefill", "ragged_decode",
                         "edge"} <= regimes, regimes)
        cases = {c["name"]: c for c in m["cases"]}
        self.assertEqual(cases["edge_w1"]["window"], 1)
        self.assertGreaterEqual(cases["edge_w_eq_T"]["window"], cases["edge_w_eq_T"]["T"])
        self.assertGreater(cases["edge_T_lt_w"]["window"], cases["edge_T_lt_w"]["T"])
        self.assertEqual({c["H_q"] // c["H_kv"] for c in m["cases"] if c["name"].startswith("edge_gqa")},
                         {1, 3, 4, 7, 8})
        self.assertTrue({64, 128} <= {c["D"] for c in m["cases"]})
        self.assertTrue(any(c["P"] > 0 for c in m["cases"]))
        self.assertTrue(any(c["T_out"] == 0 for c in m["cases"]))
        for c in m["cases"]:
            t, meta = st_io.read(os.path.join(self.dirs["bf16"], c["file"]))
            self.assertEqual(list(t["q"].shape), c["shapes"]["q"])
            self.assertEqual(int(meta["window"]), c["window"])
            self.assertEqual(c["tolerance"]["rel"], 1e-2)
            for n, e in c["tolerance"]["oracle_at_dtype_maxabs"].items():
                self.assertAlmostEqual(c["tolerance"]["abs"][n], 2 * e + 1e-6, delta=1e-15)
        lg = st_io.read(os.path.join(self.dirs["f32"], "cases/edge_large_logits.safetensors"))[0]
        s = np.einsum("thd,nhd->htn", lg["q"][:, :2].astype(np.float64), lg["k"][:, :1].astype(np.float64)) / 8
        self.assertGreater(np.abs(s).max(), 1e4, "large-logit case must reach |score| > 1e4")

    def test_regime_cases_are_rows_of_pt(self):
        # The oracle is bitwise regime-consistent (SPEC §4.2), so the expected files must be too.
        d = self.dirs["f64"]
        m = self.manifest("f64")
        cases = {c["name"]: c for c in m["cases"]}
        exp = lambda n: st_io.read(os.path.join(d, cases[n]["expected"]))[0]  # noqa: E731
        pt = exp("pt")
        for name, c in cases.items():
            if c["regime"] in ("sft", "prefill", "chunked_prefill", "decode"):
                e = exp(name)
                P, T, T_out = c["P"], c["T"], c["T_out"]
                np.testing.assert_array_equal(e["o"], pt["o"][P:P + T], err_msg=name)
                np.testing.assert_array_equal(e["lse"], pt["lse"][P:P + T], err_msg=name)
                np.testing.assert_array_equal(e["o_out"], pt["o_out"][P + T - T_out:P + T], err_msg=name)

    def test_expected_against_itself_passes_every_dtype(self):
        for dt, d in self.dirs.items():
            p = run("check", "--suite", d, "--actual-dir", os.path.join(d, "expected"))
            n = len(self.manifest(dt)["cases"])
            self.assertIn(f"{n} passed, 0 failed", p.stdout, dt)

    def test_numpy_port_passes_every_dtype(self):
        for dt, d in self.dirs.items():
            out = os.path.join(self.tmp.name, "np_" + dt)
            port(d, out)
            p = run("check", "--suite", d, "--actual-dir", out, "--json", check=False)
            r = json.loads(p.stdout)
            self.assertEqual((r["failed"], p.returncode), (0, 0), f"{dt}: " + str(
                [c["name"] for c in r["cases"] if c["status"] != "pass"]))

    def test_window_off_by_one_fails_at_the_wrong_rows(self):
        d = self.dirs["bf16"]
        out = os.path.join(self.tmp.name, "np_bug")
        port(d, out, bug="window-off-by-one")
        p = run("check", "--suite", d, "--actual-dir", out, "--json", check=False)
        self.assertEqual(p.returncode, 1)
        r = {c["name"]: c for c in json.loads(p.stdout)["cases"]}
        for name, c in r.items():
            o = next(t for t in c["tensors"] if t["name"] == "o")
            # rows whose window [t-w+1, t] has a key before it: absolute position t > w
            expect = [t for t in range(c["P"] + 1, c["P"] + c["T"] + 1) if t > c["window"]]
            self.assertTrue(set(o["bad_positions"]) <= set(expect), name)  # never blames a correct row
            if name != "edge_large_logits":  # there the extra key matters only where it is the max score
                self.assertEqual(o["bad_positions"], expect[:16], name)
                self.assertEqual(c["status"] == "pass", not expect, name)
            self.assertTrue(next(t for t in c["tensors"] if t["name"] == "o_out")["pass"], name)
        text = run("check", "--suite", d, "--actual-dir", out, "--only", "edge_window_probe", check=False).stdout
        self.assertIn("rows 4-7 = positions t = 5-8", text)
        self.assertIn("0 passed, 1 failed", text)

    def test_case_mode_runs_the_oracle_itself(self):
        d = self.dirs["f16"]
        out = os.path.join(self.tmp.name, "np_case")
        port(d, out)
        a = run("check", "--case", os.path.join(d, "cases/edge_gqa7.safetensors"),
                "--actual", os.path.join(out, "edge_gqa7.safetensors"), "--json")
        b = run("check", "--case", os.path.join(d, "cases/edge_gqa7.safetensors"),
                "--actual", os.path.join(out, "edge_gqa7.safetensors"),
                "--expected", os.path.join(d, "expected/edge_gqa7.safetensors"), "--json")
        self.assertEqual(json.loads(a.stdout), json.loads(b.stdout))
        self.assertIn("1 passed, 0 failed", run("check", "--case", os.path.join(d, "cases/edge_gqa7.safetensors"),
                                               "--actual", os.path.join(out, "edge_gqa7.safetensors")).stdout)

    def test_f16_oracle_overflow_is_judged_without_the_abs_criterion(self):
        # F16 q, k, q_out all 300: q.k*scale = 300*300*8/sqrt(8) = 254558 > 65504, so the naive f16
        # oracle has no finite answer and E_X does not exist (the abs bound must not become 1e-6).
        rng = np.random.default_rng(17)
        T, P, T_out, w = 5, 2, 3, 3
        q = np.full((T, 4, 8), 300.0)
        k = np.full((P + T, 2, 8), 300.0)
        qo = np.full((T_out, 4, 8), 300.0)
        v = rng.standard_normal((P + T, 2, 8)).astype(np.float16).astype(np.float64)
        d = os.path.join(self.tmp.name, "overflow")
        os.makedirs(d, exist_ok=True)
        case = os.path.join(d, "case.safetensors")
        st_io.write(case, {"q": q, "k": k, "v": v, "q_out": qo}, metadata={"window": str(w)}, dtype="F16")

        def result(window, name):  # the exact answer (dense masked softmax, float64)
            s = 1 / np.sqrt(8)
            out = {}
            for tag, qq, lo in (("", q, lambda t: t - window + 1), ("_out", qo, lambda t: np.ones_like(t))):
                pos = P + (T - qq.shape[0]) + np.arange(qq.shape[0]) + 1
                j = np.arange(P + T) + 1
                mask = (j[None, :] <= pos[:, None]) & (j[None, :] >= lo(pos)[:, None])
                sc = np.einsum("thd,nhd->htn", qq, np.repeat(k, 2, axis=1)) * s
                sc = np.where(mask[None], sc, -np.inf)
                m = sc.max(-1, keepdims=True)
                e = np.exp(sc - m)
                out["o" + tag] = np.einsum("htn,nhd->thd", e / e.sum(-1, keepdims=True), np.repeat(v, 2, axis=1))
                out["lse" + tag] = (m + np.log(e.sum(-1, keepdims=True)))[..., 0].T
            path = os.path.join(d, name)
            st_io.write(path, out, dtype="F32")  # LSE 254558 does not fit f16; o rounded to f32
            return path

        good = result(w, "good.safetensors")
        p = run("check", "--case", case, "--actual", good, "--dtype", "f16")
        self.assertIn("[PASS]", p.stdout)
        self.assertIn("abs criterion: n/a (naive f16 oracle overflows: scaled scores q.k*scale overflow f16", p.stdout)
        self.assertIn("(n/a)", p.stdout)
        j = json.loads(run("check", "--case", case, "--actual", good, "--dtype", "f16", "--json").stdout)
        for t in j["cases"][0]["tensors"]:
            self.assertTrue(t["abs_criterion"].startswith("n/a (naive f16 oracle overflows: "), t)
            self.assertIsNone(t["abs_tol"])
            self.assertIsNone(t["oracle_at_dtype_maxabs"])
            self.assertTrue(t["pass"], t)
        bad = result(w + 1, "bad.safetensors")  # window off by one
        p = run("check", "--case", case, "--actual", bad, "--dtype", "f16", "--json", check=False)
        self.assertEqual(p.returncode, 1)
        o = json.loads(p.stdout)["cases"][0]["tensors"][0]
        self.assertEqual(o["name"], "o")
        self.assertFalse(o["pass_rel"], o)
        # At f32 the oracle is finite: the abs criterion applies and is reported as applied.
        j = json.loads(run("check", "--case", case, "--actual", good, "--dtype", "f32", "--json",
                           check=False).stdout)
        self.assertEqual(j["cases"][0]["tensors"][0]["abs_criterion"], "applied")

    def d64_result(self, sub, change_o):
        """(suite, actual dir, expected): ACTUAL_DIR `sub` with a result for edge_d64 of the f32 suite,
        its expected outputs with o replaced by change_o(a copy of the expected o)."""
        d = self.dirs["f32"]
        bad = os.path.join(self.tmp.name, sub)
        os.makedirs(bad, exist_ok=True)
        exp, _ = st_io.read(os.path.join(d, "expected/edge_d64.safetensors"))
        st_io.write(os.path.join(bad, "edge_d64.safetensors"), dict(exp, o=change_o(exp["o"].copy())), dtype="F32")
        return d, bad, exp

    def test_bad_results_fail_clearly(self):
        def one_nan(o):
            o[3, 1, 7] = np.nan
            return o
        d, bad, exp = self.d64_result("bad", one_nan)
        p = run("check", "--suite", d, "--actual-dir", bad, "--only", "edge_d64", "--json", check=False)
        self.assertEqual(p.returncode, 1)
        o = json.loads(p.stdout)["cases"][0]["tensors"][0]
        self.assertEqual((o["nan_count"], o["worst_index"], o["bad_rows"]), (1, [3, 1, 7], [3]))
        # missing tensor, missing file, truncated file
        st_io.write(os.path.join(bad, "edge_d128.safetensors"), {"o": exp["o"]}, dtype="F32")
        p = run("check", "--suite", d, "--actual-dir", bad, "--only", "edge_d128", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("no tensor \"o_out\"", p.stdout)
        p = run("check", "--suite", d, "--actual-dir", bad, "--only", "edge_w1", check=False)
        self.assertEqual(p.returncode, 1, "a missing result of the port is a failure, not a usage error")
        self.assertIn("no result file", p.stdout)
        p = run("check", "--suite", d, "--actual-dir", bad, "--only", "edge_w1", "--skip-missing", check=False)
        self.assertIn("0 passed, 0 failed, 1 skipped", p.stdout)
        self.assertEqual(p.returncode, 1, "nothing checked is not a pass")
        with open(os.path.join(bad, "edge_gqa1.safetensors"), "wb") as f:
            f.write(b"\x10\x00\x00")
        p = run("check", "--suite", d, "--actual-dir", bad, "--only", "edge_gqa1", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("error:", p.stdout)
        p = run("check", "--suite", os.path.join(self.tmp.name, "nowhere"), "--actual-dir", bad, check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("manifest.json", p.stderr)
        # --case mode: a missing or truncated result of the port is a failure too
        case = os.path.join(d, "cases/edge_gqa1.safetensors")
        for actual in (os.path.join(bad, "edge_gqa1.safetensors"), os.path.join(bad, "absent.safetensors")):
            p = run("check", "--case", case, "--actual", actual, check=False)
            self.assertEqual(p.returncode, 1, actual)
            self.assertIn("[FAIL] edge_gqa1  (edge, T=", p.stdout)
            self.assertIn("0 passed, 1 failed", p.stdout)

    def test_all_nan_result_reads_inf_not_zero(self):
        d, bad, exp = self.d64_result("all_nan", lambda o: np.full_like(o, np.nan))
        p = run("check", "--suite", d, "--actual-dir", bad, "--only", "edge_d64", "--json", check=False)
        self.assertEqual(p.returncode, 1)
        o = json.loads(p.stdout)["cases"][0]["tensors"][0]
        n = exp["o"].size
        self.assertEqual((o["name"], o["pass"], o["pass_finite"], o["nan_count"], o["inf_count"]),
                         ("o", False, False, n, 0))
        self.assertEqual((o["max_abs"], o["rel_err"], o["max_rel"]), ("inf", "inf", "inf"))
        self.assertEqual(o["worst_index"], [0, 0, 0])
        p = run("check", "--suite", d, "--actual-dir", bad, "--only", "edge_d64", check=False)
        self.assertEqual(p.returncode, 1)
        row = next(line for line in p.stdout.splitlines() if line.strip().startswith("o "))
        self.assertNotIn("0.00e+00", row)
        self.assertIn(f" {n} ", row)
        self.assertTrue(row.rstrip().endswith(f"FAIL ({n} NaN,rel,abs)"), row)
        self.assertIn(f"    o: {n} NaN of {n} values (the first at [0,0,0]): rel_err, max_abs and max_rel are inf\n",
                      p.stdout)

    def assertUsageError(self, p, *fragments):
        """Exit 2, nothing on stdout, exactly one line `orthros: error: ...` on stderr."""
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertEqual(p.stdout, "")
        lines = p.stderr.splitlines()
        self.assertEqual(len(lines), 1, p.stderr)
        self.assertTrue(lines[0].startswith("orthros: error: "), lines[0])
        for f in fragments:
            self.assertIn(f, lines[0])

    def test_bad_inputs_of_the_check_are_usage_errors(self):
        d = self.dirs["f32"]
        case = os.path.join(d, "cases/edge_d64.safetensors")
        result = os.path.join(d, "expected/edge_d64.safetensors")  # a valid result file (F64 outputs)
        self.assertEqual(run("check", "--case", case, "--actual", result).returncode, 0)
        missing = os.path.join(self.tmp.name, "missing.safetensors")
        self.assertUsageError(run("check", "--case", missing, "--actual", result, check=False),
                              "--case " + missing, "no such file")
        self.assertUsageError(run("check", "--case", result, "--actual", result, check=False),
                              "not a case file", "give it as --actual")
        junk = os.path.join(self.tmp.name, "junk.safetensors")
        with open(junk, "wb") as f:
            f.write(b"\x10\x00\x00")
        self.assertUsageError(run("check", "--case", junk, "--actual", result, check=False), "--case " + junk)
        self.assertUsageError(run("check", "--case", case, "--actual", result, "--expected", missing, check=False),
                              "--expected " + missing, "no such file")
        self.assertUsageError(run("check", "--case", case, "--actual", result, "--expected", case, check=False),
                              "--expected " + case, "not an expected file")
        other = os.path.join(d, "expected/edge_d128.safetensors")
        self.assertUsageError(run("check", "--case", case, "--actual", result, "--expected", other, check=False),
                              "--expected " + other, "has shape")
        nodir = os.path.join(self.tmp.name, "nonexistent")
        self.assertUsageError(run("check", "--suite", d, "--actual-dir", nodir, check=False),
                              "--actual-dir", nodir, "does not exist")
        self.assertUsageError(run("check", "--suite", d, "--case", case, check=False), "--case excludes --suite")
        self.assertUsageError(run("check", "--suite", d, "--actual-dir", d, "--case", case, "--actual", result,
                                  check=False), "excludes")
        self.assertUsageError(run("check", "--case", case, check=False), "--case requires --actual")
        self.assertUsageError(run("check", "--suite", d, check=False), "--suite requires --actual-dir")
        # a broken suite (expected file) is the check's input, not the port's failure
        broken = os.path.join(self.tmp.name, "broken_suite")
        shutil.copytree(d, broken)
        with open(os.path.join(broken, "expected/edge_w1.safetensors"), "wb") as f:
            f.write(b"\x10\x00\x00")
        self.assertUsageError(run("check", "--suite", broken, "--actual-dir", os.path.join(d, "expected"),
                                  "--only", "edge_w1", check=False), "edge_w1", "expected file")

    def test_one_bad_row_is_reported_in_the_singular(self):
        d = self.dirs["f32"]
        bad = os.path.join(self.tmp.name, "one_row")
        os.makedirs(bad, exist_ok=True)
        exp, _ = st_io.read(os.path.join(d, "expected/edge_cache_sft.safetensors"))
        P = self.manifest("f32")["cases"]
        P = next(c["P"] for c in P if c["name"] == "edge_cache_sft")
        wrong = {n: a.copy() for n, a in exp.items()}
        wrong["o"][2, 0, 0] += 1.0  # base row 2 = absolute position P + 3 (SPEC §2)
        st_io.write(os.path.join(bad, "edge_cache_sft.safetensors"), wrong, dtype="F64")
        p = run("check", "--suite", d, "--actual-dir", bad, "--only", "edge_cache_sft", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn(f"o: 1 of {exp['o'].shape[0]} rows over the abs bound or non-finite: row 2 = position t = {P + 3}\n",
                      p.stdout)

    def test_numpy_port_without_a_suite_is_one_error_line(self):
        out = os.path.join(self.tmp.name, "np_nowhere")
        p = subprocess.run([sys.executable, os.path.join(PORT_DIR, "numpy_port.py"), "--golden",
                            os.path.join(self.tmp.name, "nonexistent"), "--out", out], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)
        self.assertEqual(p.stdout, "")
        self.assertEqual(len(p.stderr.splitlines()), 1, p.stderr)
        self.assertIn("numpy_port.py: error: --golden", p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        self.assertFalse(os.path.exists(out))


class GoldenOutDirTest(unittest.TestCase):
    """`orthros golden` refuses a non-empty --out unless --force (also its own ctest, portkit_golden_out_dir)."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def refused(self, out, *extra):
        p = run("golden", "--out", out, "--dtype", "f64", *extra, check=False)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertEqual(p.stdout, "")
        self.assertEqual(len(p.stderr.splitlines()), 1, p.stderr)
        return p.stderr.strip()

    def test_missing_and_empty_dirs_are_written(self):
        missing = os.path.join(self.tmp.name, "a", "b")
        run("golden", "--out", missing, "--dtype", "f64")
        self.assertTrue(os.path.isfile(os.path.join(missing, "manifest.json")))
        empty = os.path.join(self.tmp.name, "empty")
        os.mkdir(empty)
        run("golden", "--out", empty, "--dtype", "f64")
        self.assertEqual(all_files(missing), all_files(empty))

    def test_a_second_suite_is_refused_and_nothing_is_written(self):
        d = os.path.join(self.tmp.name, "suite")
        run("golden", "--out", d, "--dtype", "f64", "--seed", "7")
        before = {f: open(os.path.join(d, f), "rb").read() for f in all_files(d)}
        msg = self.refused(d, "--seed", "8")
        self.assertEqual(msg, f"orthros: error: golden: --out {d} is not empty (holds {len(before)} files, e.g. "
                              "manifest.json); pass --force to overwrite")
        self.assertEqual(before, {f: open(os.path.join(d, f), "rb").read() for f in all_files(d)})
        # the layer suite is refused the same way, before it writes anything
        self.assertIn(f"golden: --out {d} is not empty", self.refused(d, "--level", "layer"))
        self.assertEqual(sorted(before), all_files(d))

    def test_force_overwrites(self):
        d, fresh = os.path.join(self.tmp.name, "suite"), os.path.join(self.tmp.name, "fresh")
        run("golden", "--out", d, "--dtype", "f64", "--seed", "7")
        run("golden", "--out", d, "--dtype", "f64", "--seed", "8", "--force")
        run("golden", "--out", fresh, "--dtype", "f64", "--seed", "8")
        files = all_files(fresh)
        self.assertEqual(files, all_files(d))
        _, mismatch, errors = filecmp.cmpfiles(d, fresh, files, shallow=False)
        self.assertEqual(mismatch + errors, [])

    def test_any_content_is_named(self):
        d = os.path.join(self.tmp.name, "notes")
        os.mkdir(d)
        with open(os.path.join(d, "notes.txt"), "w") as f:
            f.write("mine\n")
        self.assertIn(f"--out {d} is not empty (holds 1 file, e.g. notes.txt); pass --force to overwrite",
                      self.refused(d))
        self.assertEqual(os.listdir(d), ["notes.txt"])  # no cases/ or expected/ created
        e = os.path.join(self.tmp.name, "dirs_only")
        os.makedirs(os.path.join(e, "cases"))
        self.assertIn(f"--out {e} is not empty (holds 0 files and 1 directory, e.g. cases/)", self.refused(e))
        f = os.path.join(self.tmp.name, "a_file")
        open(f, "w").close()
        self.assertIn(f"golden: --out {f} exists and is not a directory", self.refused(f, "--force"))


GRAD_TENSORS = ("dq", "dq_out", "dk", "dv")
ALL_TENSORS = ("o", "o_out", "lse", "lse_out") + GRAD_TENSORS
EXTENDED = np.finfo(np.longdouble).eps < 1e-17  # x86-64: 80-bit long double


def check_json(suite, actual, *extra):
    p = run("check", "--suite", suite, "--actual-dir", actual, "--json", *extra, check=False)
    return p.returncode, json.loads(p.stdout), p.stdout


def subset_suite(src, dst, names):
    """A copy of suite `src` with only the cases `names` (a smaller suite for the script tests)."""
    with open(os.path.join(src, "manifest.json")) as f:
        m = json.load(f)
    m["cases"] = [c for c in m["cases"] if c["name"] in names]
    m.pop("groups", None)
    for c in m["cases"]:
        c.pop("group", None)
        for k in ("file", "expected"):
            os.makedirs(os.path.dirname(os.path.join(dst, c[k])), exist_ok=True)
            shutil.copyfile(os.path.join(src, c[k]), os.path.join(dst, c[k]))
    with open(os.path.join(dst, "manifest.json"), "w") as f:
        json.dump(m, f)
    return dst


class GradSuiteTest(unittest.TestCase):
    """`orthros golden --grad` suites judged end to end with the NumPy port's hand-written backward."""

    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, PORT_DIR)
        import numpy_port
        cls.np_port = numpy_port
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dirs, cls.results = {}, {}
        # The default seed: the suites of the GPU run (examples/pytorch_port/results-2026-12-01-h200-grad).
        # (At --seed 11 the float32 forward of this port fails o of edge_large_logits, rel 1e-5: its
        # float32 scores of ~1e4 carry absolute errors ~1e-3; a known limit of that forward probe.)
        for dt in ("f64", "f32", "bf16", "f16"):
            d = os.path.join(cls.tmp.name, "grad_" + dt)
            run("golden", "--grad", "--out", d, "--dtype", dt)
            cls.dirs[dt] = d
            cls.results[dt] = os.path.join(cls.tmp.name, "np_grad_" + dt)
        cls.bug = os.path.join(cls.tmp.name, "np_grad_bug")
        # each suite is ported and checked once (the reports are shared by the tests), in parallel
        jobs = [(dt, cls.dirs[dt], cls.results[dt], None) for dt in cls.dirs] + [
            ("bug", cls.dirs["bf16"], cls.bug, "window-off-by-one")]

        def port_and_check(job):
            name, suite, out, bug = job
            port(suite, out, bug=bug)
            return name, check_json(suite, out)

        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
            cls.reports = dict(ex.map(port_and_check, jobs))
        cls.bug_report = cls.reports.pop("bug")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def manifest(self, dt):
        with open(os.path.join(self.dirs[dt], "manifest.json")) as f:
            return json.load(f)

    def test_suite_holds_upstream_and_expected_gradients(self):
        m = self.manifest("bf16")
        self.assertIs(m.get("grad"), True)
        # every case carries gradients except the forward-only large-logits probe (its softmax is
        # one-hot: the gradients through it are below every dtype's resolution; docs/porting.md)
        self.assertEqual([c["name"] for c in m["cases"] if not c["grad"]], ["edge_large_logits"])
        self.assertIn("edge_grad_large_logits", [c["name"] for c in m["cases"]])
        for c in m["cases"]:
            t, _ = st_io.read(os.path.join(self.dirs["bf16"], c["file"]))
            e, _ = st_io.read(os.path.join(self.dirs["bf16"], c["expected"]))
            if not c["grad"]:
                self.assertNotIn("do", t, c["name"])
                self.assertNotIn("dq", e, c["name"])
                continue
            T, P, T_out, Hq, Hkv, D = (c[n] for n in ("T", "P", "T_out", "H_q", "H_kv", "D"))
            self.assertEqual(t["do"].shape, (T, Hq, D), c["name"])
            self.assertEqual(t["do_out"].shape, (T_out, Hq, D), c["name"])
            self.assertTrue(np.all(np.isfinite(t["do"])) and np.all(t["do"] != 0), c["name"])
            for n, shape in (("dq", (T, Hq, D)), ("dq_out", (T_out, Hq, D)), ("dk", (P + T, Hkv, D)),
                             ("dv", (P + T, Hkv, D))):
                self.assertEqual(e[n].shape, shape, (c["name"], n))
                self.assertEqual(e[n].dtype, np.float64, (c["name"], n))
        # a forward-only suite has no upstream gradients: the port then writes the forward only
        fwd = subset_suite(self.dirs["f32"], os.path.join(self.tmp.name, "fwd_only"), ["pt"])
        for f in ("cases/pt.safetensors",):
            t, meta = st_io.read(os.path.join(fwd, f))
            st_io.write(os.path.join(fwd, f), {n: t[n] for n in ("q", "k", "v", "q_out")}, meta, "F32")
        out = os.path.join(self.tmp.name, "np_fwd_only")
        port(fwd, out)
        r, _ = st_io.read(os.path.join(out, "pt.safetensors"))
        self.assertEqual(sorted(r), ["lse", "lse_out", "o", "o_out"])

    def test_numpy_port_passes_all_eight_tensors_every_dtype(self):
        for dt in self.dirs:
            rc, r, _ = self.reports[dt]
            for c in r["cases"]:
                want = ALL_TENSORS if c["name"] != "edge_large_logits" else ALL_TENSORS[:4]  # forward-only probe
                self.assertEqual(tuple(t["name"] for t in c["tensors"]), want, (dt, c["name"]))
            bad = [(c["name"], t["name"]) for c in r["cases"] for t in c["tensors"] if not t["pass"]]
            self.assertEqual(bad, [], dt)
            self.assertEqual(rc, 0, dt)

    def test_numpy_backward_matches_extended_precision(self):
        # The port's own accuracy, independent of the oracle: float64 vs np.longdouble, same code.
        if not EXTENDED:
            self.skipTest("np.longdouble is not wider than float64 here")
        for dt in ("f64", "bf16"):
            for name in ("edge_grad_large_logits", "edge_gqa7", "edge_cache_sft", "pt"):
                t, meta = st_io.read(os.path.join(self.dirs[dt], "cases", name + ".safetensors"))
                args = [t[n] for n in ("q", "k", "v", "q_out", "do", "do_out")]
                scale = 1 / np.sqrt(t["q"].shape[2])
                a = self.np_port.attention_backward(*args, int(meta["window"]), scale)
                x = self.np_port.attention_backward(*args, int(meta["window"]), scale, dtype=np.longdouble)
                for n in GRAD_TENSORS:
                    if x[n].size:
                        err = np.linalg.norm((a[n] - x[n]).astype(np.float64)) / np.linalg.norm(x[n].astype(np.float64))
                        self.assertLess(err, 1e-11, (dt, name, n))

    def test_window_off_by_one_fails_in_the_gradients(self):
        rc, r, _ = self.bug_report
        self.assertEqual(rc, 1)
        failed_grads = set()
        for c in r["cases"]:
            t = {x["name"]: x for x in c["tensors"]}
            wrong = [p for p in range(c["P"] + 1, c["P"] + c["T"] + 1) if p > c["window"]]  # rows t > w
            if not c["grad"]:  # the forward-only probe (edge_large_logits): no gradients to judge
                self.assertNotIn("dq", t, c["name"])
                continue
            # the output stream's query gradient never sees the window: it passes
            self.assertTrue(t["dq_out"]["pass"], c["name"])
            # dq of a base row depends only on that row's window: only rows t > w are blamed
            self.assertTrue(set(t["dq"]["bad_positions"]) <= set(wrong), c["name"])
            if not wrong:  # t <= w everywhere: a window cannot be off by one, all eight pass
                self.assertEqual(c["status"], "pass", c["name"])
                continue
            self.assertFalse(t["dq"]["pass"], c["name"])
            if c["window"] <= 16:  # the extra key weighs ~1/(w+1): at w = 128 some rows stay in bounds
                self.assertEqual(t["dq"]["bad_positions"], wrong[:16], c["name"])
                self.assertEqual(t["dq"]["bad_row_count"], len(wrong), c["name"])
            for n in GRAD_TENSORS:
                if not t[n]["pass"]:
                    failed_grads.add(n)
                    self.assertGreater(t[n]["bad_row_count"], 0, (c["name"], n))  # the wrong rows are named
                    self.assertTrue(t[n]["bad_positions"], (c["name"], n))
        self.assertEqual(failed_grads, {"dq", "dk", "dv"})
        text = run("check", "--suite", self.dirs["bf16"], "--actual-dir", self.bug, "--only", "edge_window_probe",
                   check=False).stdout
        self.assertIn("dq: 4 of 8 rows over the abs bound or non-finite: rows 4-7 = positions t = 5-8", text)
        self.assertIn("0 passed, 1 failed", text)

    def test_backward_only_mistake_fails_only_dk_dv(self):
        # A port whose forward is right but whose dk/dv forget the output stream's share (the
        # keys are read by both streams, so their gradients add): only dk and dv fail, at every
        # key row an output query sees.
        d = self.dirs["f32"]
        out = os.path.join(self.tmp.name, "np_grad_no_out_stream")
        os.makedirs(out, exist_ok=True)
        case = "edge_cache_sft"
        t, meta = st_io.read(os.path.join(d, "cases", case + ".safetensors"))
        r, _ = st_io.read(os.path.join(self.results["f32"], case + ".safetensors"))
        scale = 1 / np.sqrt(t["q"].shape[2])
        g = self.np_port.attention_backward(t["q"], t["k"], t["v"], t["q_out"], t["do"], np.zeros_like(t["do_out"]),
                                            int(meta["window"]), scale)
        r = dict(r, dk=g["dk"], dv=g["dv"])
        st_io.write(os.path.join(out, case + ".safetensors"), r, dtype="F32")
        rc, rep, _ = check_json(d, out, "--only", case)
        self.assertEqual(rc, 1)
        c = rep["cases"][0]
        self.assertEqual([x["name"] for x in c["tensors"] if not x["pass"]], ["dk", "dv"])
        dk = next(x for x in c["tensors"] if x["name"] == "dk")
        self.assertEqual(dk["bad_row_count"], c["P"] + c["T"])  # every key row is seen by an output query

    def test_summary_names_failing_gradient_tensors(self):
        summ = os.path.join(PORT_DIR, "summarize_checks.py")
        rep = os.path.join(self.tmp.name, "bug.json")
        with open(rep, "w") as f:
            f.write(self.bug_report[2])
        p = subprocess.run([sys.executable, summ, rep, "--label", "bug", "--bug"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        failing = p.stdout.splitlines()[0].split("failing tensors: ")[1]
        self.assertEqual([f.split(" (")[0] for f in failing.split(", ")], ["o", "lse", "dq", "dk", "dv"])
        # --bug on a report where every gradient passes: the broken port was not caught in them
        _, ok_report, _ = check_json(self.dirs["f16"], self.results["f16"], "--only", "edge_gqa")
        self.assertEqual(ok_report["failed"], 0)
        ok = os.path.join(self.tmp.name, "ok.json")
        with open(ok, "w") as f:
            json.dump(ok_report, f)
        p = subprocess.run([sys.executable, summ, ok, "--label", "ok", "--bug"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 1)
        self.assertIn("not caught in the gradients", p.stderr)
        self.assertIn("failing tensors: none", p.stdout)


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
