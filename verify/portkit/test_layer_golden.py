"""End-to-end tests of the layer-level golden suite: `orthros golden --level layer`,
`orthros check` on layer suites and cases, and the NumPy layer port with its broken variants.

Run by ctest (label unit) with ORTHROS=<path of the orthros binary> and PORT_DIR=<examples/pytorch_port>.
"""
import concurrent.futures
import filecmp
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

ORTHROS = os.environ["ORTHROS"]
PORT_DIR = os.environ["PORT_DIR"]
sys.path.insert(0, PORT_DIR)
import numpy_layer_port  # noqa: E402
import st_io  # noqa: E402

LAYER_TENSORS = ["y", "y_out", "k_cache_after", "v_cache_after"]

# variant -> the tensors that must fail (and no other), as docs/porting.md "Layer suite" states.
BUG_TENSORS = {
    "out-rope-t+1": {"y_out"},
    "out-rope-own-counter": {"y_out"},
    "scale-offset-after-rope": {"y", "y_out"},
    "scale-offset-before-qknorm": {"y", "y_out"},
    "swap-alpha-beta-streams": {"y", "y_out"},
    "out-appends-cache": {"k_cache_after", "v_cache_after"},
    "separate-wo": {"y_out"},
    "out-from-base-hidden": {"y_out"},
}


def run(*args, check=True):
    p = subprocess.run([ORTHROS, *args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"orthros {' '.join(args)} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def port(golden, out, bug=None):
    cmd = [sys.executable, os.path.join(PORT_DIR, "numpy_layer_port.py"), "--golden", golden, "--out", out]
    if bug:
        cmd += ["--bug", bug]
    subprocess.run(cmd, check=True, capture_output=True)


def check_json(golden, results, *extra):
    p = run("check", "--suite", golden, "--actual-dir", results, "--json", *extra, check=False)
    return p.returncode, json.loads(p.stdout)


def failing(report):
    """{case name: set of failing tensor names} of a check --json report (skipped cases left out)."""
    return {c["name"]: {t["name"] for t in c["tensors"] if not t["pass"]} for c in report["cases"]
            if c["status"] == "fail"}


# The broken variants run on these cases of the bf16 suite (every regime but the T = 269 ones, whose
# NumPy attention takes seconds on a reference BLAS; docs/porting.md has the whole-suite table):
# a cache-only chunk (T_out = 0), the last chunk, a decode step, ragged prefill/decode, the edges.
BUG_CASES = [p + n for p in ("qwen3_8b_", "llama3_1_8b_") for n in
             ("chunked_prefill_2of3", "chunked_prefill_3of3", "decode_step_2", "ragged_prefill_b0",
              "ragged_decode_b1")] + ["edge_w1", "edge_gqa7", "edge_cache_sft"]


class LayerGoldenTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dirs, cls.results = {}, {}
        for dt in ("f64", "f32", "bf16"):
            cls.dirs[dt] = os.path.join(cls.tmp.name, "layer_" + dt)
            cls.results[dt] = os.path.join(cls.tmp.name, "results_" + dt)
        run("golden", "--level", "layer", "--out", cls.dirs["bf16"], "--dtype", "bf16", "--seed", "7")
        # while the correct port runs on one suite (the command line, every case), write the next
        cls.again = os.path.join(cls.tmp.name, "again_bf16")
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as ex:
            jobs = [ex.submit(port, cls.dirs["bf16"], cls.results["bf16"])]
            run("golden", "--level", "layer", "--out", cls.dirs["f32"], "--dtype", "f32", "--seed", "7")
            jobs.append(ex.submit(port, cls.dirs["f32"], cls.results["f32"]))
            run("golden", "--level", "layer", "--out", cls.dirs["f64"], "--dtype", "f64", "--seed", "7")
            jobs.append(ex.submit(port, cls.dirs["f64"], cls.results["f64"]))
            run("golden", "--level", "layer", "--out", cls.again, "--dtype", "bf16", "--seed", "7")
            for j in jobs:
                j.result()
        # every broken variant on BUG_CASES of the bf16 suite (the loosest tolerance), in process
        cls.bug_reports = {}
        dirs = {bug: os.path.join(cls.tmp.name, "bug_" + bug) for bug in BUG_TENSORS}
        for d in dirs.values():
            os.makedirs(d)
        for name in BUG_CASES:
            t, meta = st_io.read(os.path.join(cls.dirs["bf16"], "cases", name + ".safetensors"))
            for bug, d in dirs.items():
                st_io.write(os.path.join(d, name + ".safetensors"), numpy_layer_port.layer(t, meta, np.float32, bug))
        for bug, d in dirs.items():
            cls.bug_reports[bug] = check_json(cls.dirs["bf16"], d, "--skip-missing")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def manifest(self, dt):
        with open(os.path.join(self.dirs[dt], "manifest.json")) as f:
            return json.load(f)

    def case(self, dt, name, expected=False):
        return st_io.read(os.path.join(self.dirs[dt], ("expected/" if expected else "cases/") + name + ".safetensors"))

    # ---- the suite ----
    def test_manifest_covers_regimes_configs_and_edges(self):
        m = self.manifest("bf16")
        self.assertEqual((m["format"], m["level"], m["suite_version"]), ("orthros-golden", "layer", 1))
        cases = {c["name"]: c for c in m["cases"]}
        self.assertEqual(len(cases), 35)
        for prefix, cfg, qk, theta in (("qwen3_8b", "qwen3-8b", True, 1e6), ("llama3_1_8b", "llama3.1-8b", False, 5e5)):
            mine = [c for c in m["cases"] if c["config"] == cfg]
            self.assertEqual({c["regime"] for c in mine}, {"pt", "sft", "prefill", "chunked_prefill", "decode",
                                                           "ragged_prefill", "ragged_decode"})
            self.assertEqual(len(mine), 16)
            for c in mine:
                self.assertEqual((c["H_q"], c["H_kv"], c["D"], c["window"], c["d_model"], c["qk_norm"],
                                  c["rope_theta"]), (32, 8, 128, 128, 64, qk, theta), c["name"])
            pt = cases[prefix + "_pt"]
            self.assertGreater(pt["T"], 2 * pt["window"])  # T crosses the window
            self.assertEqual(pt["shapes"]["y"], [pt["T"], 64])
            self.assertEqual(pt["shapes"]["w_q"], [64, 4096])
            self.assertEqual(pt["shapes"]["w_o"], [4096, 64])
            self.assertEqual(pt["shapes"]["k_cache"], [0, 8, 128])
            self.assertEqual("q_norm" in pt["shapes"], qk)
            d3 = cases[prefix + "_decode_step_3"]
            self.assertEqual((d3["T"], d3["T_out"]), (1, 1))
            self.assertEqual(d3["shapes"]["k_cache_after"], [d3["P"] + 1, 8, 128])
            self.assertEqual(d3["positions"]["y_out"], [d3["P"] + 1, d3["P"] + 1])
            self.assertEqual(cases[prefix + "_chunked_prefill_1of3"]["T_out"], 0)
        self.assertEqual(cases["edge_w1"]["window"], 1)
        self.assertEqual((cases["edge_gqa7"]["H_q"], cases["edge_gqa7"]["H_kv"]), (28, 4))
        for c in m["cases"]:
            for t in LAYER_TENSORS:
                if c["shapes"][t][0] > 0:  # (y_out of a T_out = 0 chunk is empty: E_X = 0)
                    self.assertGreater(c["tolerance"]["oracle_at_dtype_maxabs"][t], 0.0, (c["name"], t))

    def test_weights_are_away_from_identity_and_inputs_nonzero(self):
        t, meta = self.case("f64", "qwen3_8b_sft")
        self.assertEqual((meta["qk_norm"], meta["level"], meta["window"]), ("1", "layer", "128"))
        for n in ("alpha", "alpha_out"):
            a = np.abs(t[n])
            self.assertTrue(np.all((a >= 0.5) & (a <= 1.5) & (np.abs(a - 1) >= 0.15)), n)
            self.assertTrue(np.any(t[n] < 0) and np.any(t[n] > 0), n)
        for n in ("beta", "beta_out"):
            self.assertTrue(np.all((np.abs(t[n]) >= 0.2) & (np.abs(t[n]) <= 0.6)), n)
        self.assertFalse(np.allclose(t["alpha"], t["alpha_out"]))
        for n, a in t.items():
            self.assertTrue(a.size == 0 or np.all(a != 0), n)
        t2, meta2 = self.case("f64", "llama3_1_8b_pt")
        self.assertEqual(meta2["qk_norm"], "0")
        self.assertNotIn("q_norm", t2)

    def test_caches_chain_through_the_float64_oracle(self):
        """Chunk i's cache is chunk i-1's expected cache after (bitwise in the f64 suite); decode step
        i's cache is step i-1's; y rows equal the pt case's rows (the regimes agree)."""
        for prefix in ("qwen3_8b", "llama3_1_8b"):
            for prev, cur in ((f"{prefix}_chunked_prefill_1of3", f"{prefix}_chunked_prefill_2of3"),
                              (f"{prefix}_chunked_prefill_2of3", f"{prefix}_chunked_prefill_3of3"),
                              (f"{prefix}_decode_step_1", f"{prefix}_decode_step_2"),
                              (f"{prefix}_ragged_prefill_b2", f"{prefix}_ragged_decode_b2")):
                e, _ = self.case("f64", prev, expected=True)
                c, _ = self.case("f64", cur)
                np.testing.assert_array_equal(c["k_cache"], e["k_cache_after"], err_msg=cur)
                np.testing.assert_array_equal(c["v_cache"], e["v_cache_after"], err_msg=cur)
            pt, _ = self.case("f64", prefix + "_pt", expected=True)
            last, meta = self.case("f64", prefix + "_decode_step_4", expected=True)
            ci, _ = self.case("f64", prefix + "_decode_step_4")
            P = ci["k_cache"].shape[0]
            np.testing.assert_array_equal(last["y"][0], pt["y"][P])
            np.testing.assert_array_equal(last["y_out"][0], pt["y_out"][P])
            np.testing.assert_array_equal(last["k_cache_after"], pt["k_cache_after"][:P + 1])
        # in a narrower suite the cache is the same float64 cache, rounded once
        c32, _ = self.case("f32", "qwen3_8b_chunked_prefill_2of3")
        e64, _ = self.case("f64", "qwen3_8b_chunked_prefill_1of3", expected=True)
        np.testing.assert_array_equal(c32["k_cache"], e64["k_cache_after"].astype(np.float32))

    def test_regenerating_gives_identical_bytes(self):
        again = self.again
        files = sorted(os.path.relpath(os.path.join(d, f), again) for d, _, fs in os.walk(again) for f in fs)
        self.assertEqual(len(files), 2 * 35 + 1)
        _, mismatch, errors = filecmp.cmpfiles(self.dirs["bf16"], again, files, shallow=False)
        self.assertEqual(mismatch + errors, [])

    # ---- the correct port ----
    def test_correct_port_passes_every_case(self):
        for dt in ("f64", "f32", "bf16"):
            with self.subTest(dtype=dt):
                rc, rep = check_json(self.dirs[dt], self.results[dt])
                self.assertEqual((rc, rep["failed"], rep["passed"]), (0, 0, 35), failing(rep))
                for c in rep["cases"]:
                    self.assertEqual(c["level"], "layer")
                    self.assertEqual([t["name"] for t in c["tensors"]], LAYER_TENSORS)
                    for t in c["tensors"]:
                        self.assertEqual(t["abs_criterion"], "applied")

    def test_single_case_mode(self):
        d, r = self.dirs["bf16"], self.results["bf16"]
        for name in ("edge_gqa7", "llama3_1_8b_decode_step_2"):
            case, res = os.path.join(d, "cases", name + ".safetensors"), os.path.join(r, name + ".safetensors")
            p = run("check", "--case", case, "--actual", res)  # runs the layer oracle on the case now
            self.assertIn("layer, ", p.stdout)
            self.assertIn("k_cache_after", p.stdout)
            run("check", "--case", case, "--actual", res, "--expected", os.path.join(d, "expected", name + ".safetensors"))
        # an expected file of another case is the check's input error
        p = run("check", "--case", os.path.join(d, "cases", "edge_w1.safetensors"), "--actual",
                os.path.join(r, "edge_w1.safetensors"), "--expected", os.path.join(d, "expected", "edge_gqa7.safetensors"),
                check=False)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertIn("expected file of another case", p.stderr)

    # ---- the broken variants ----
    def test_each_broken_variant_fails_the_expected_tensors(self):
        m = {c["name"]: c for c in self.manifest("bf16")["cases"] if c["name"] in BUG_CASES}
        with_out = {n for n in m if m[n]["T_out"] > 0}
        for bug, want in BUG_TENSORS.items():
            with self.subTest(bug=bug):
                rc, rep = self.bug_reports[bug]
                self.assertEqual((rep["passed"] + rep["failed"], rep["skipped"]), (len(BUG_CASES), 35 - len(BUG_CASES)))
                fails = failing(rep)
                self.assertEqual(rc, 1)
                self.assertEqual(set().union(*fails.values()), want, fails)
                if bug == "scale-offset-before-qknorm":  # both streams' queries, but a no-op without QK-norm
                    self.assertEqual(set(fails), {n for n in m if m[n]["qk_norm"]})
                elif "y" in want:  # both streams' queries: every case
                    self.assertEqual(set(fails), set(m))
                else:  # the output stream or the cache it must not write: every case with output tokens
                    self.assertEqual(set(fails), with_out)

    def test_report_names_tensor_and_positions(self):
        rc, rep = self.bug_reports["out-rope-t+1"]
        c = next(c for c in rep["cases"] if c["name"] == "qwen3_8b_decode_step_2")
        bad = {t["name"]: t for t in c["tensors"]}
        self.assertFalse(bad["y_out"]["pass"])
        self.assertEqual(bad["y_out"]["bad_positions"], [c["P"] + 1])
        self.assertTrue(bad["y"]["pass"] and bad["k_cache_after"]["pass"])
        # text report: the failing tensor, its rows and their absolute positions
        r = os.path.join(self.tmp.name, "bug_out-rope-t+1")
        p = run("check", "--suite", self.dirs["bf16"], "--actual-dir", r, "--only", "edge_cache_sft", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertRegex(p.stdout, r"y_out +\[6,32\].*FAIL")
        self.assertRegex(p.stdout, r"y +\[16,32\].*pass")
        # P = 20, T = 16, T_out = 6: output rows are positions 31..36
        self.assertRegex(p.stdout, r"y_out: \d+ of 6 rows over the abs bound or non-finite: rows? [0-5].* = positions? t = 3[1-6]")
        # the cache variant fails by shape and says so
        rc, rep = self.bug_reports["out-appends-cache"]
        c = next(c for c in rep["cases"] if c["name"] == "llama3_1_8b_decode_step_2")
        t = {x["name"]: x for x in c["tensors"]}
        self.assertFalse(t["k_cache_after"]["shape_ok"])
        self.assertTrue(t["y"]["pass"] and t["y_out"]["pass"])

    # ---- bad input ----
    def test_bad_input_names_parameter_and_values(self):
        p = run("golden", "--level", "layer", "--out", os.path.join(self.tmp.name, "x"), "--config", "qwen3-8b",
                check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--config qwen3-8b applies to --level op only", p.stderr)
        p = run("golden", "--level", "layer", "--out", os.path.join(self.tmp.name, "x"), "--grad", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--grad applies to --level op only", p.stderr)
        p = run("golden", "--level", "block", "--out", os.path.join(self.tmp.name, "x"), check=False)
        self.assertNotEqual(p.returncode, 0)
        t, meta = self.case("bf16", "edge_w1")
        res = os.path.join(self.results["bf16"], "edge_w1.safetensors")
        bad_cases = [
            ("w_o", lambda t, m: t.update(w_o=t["w_o"][:, :7]), 'tensor "w_o" must be [H_q*D, d_model] = [64, 32]; got [64, 7]'),
            ("alpha", lambda t, m: t.pop("alpha"), 'missing tensor "alpha" [H_q*D]'),
            ("window", lambda t, m: m.update(window="0"), 'metadata "window"'),
            ("qk_norm", lambda t, m: m.update(qk_norm="yes"), 'metadata "qk_norm" must be "1" or "0" (got "yes")'),
            ("heads", lambda t, m: m.update(num_kv_heads="3"), "H_q % H_kv"),
            ("x_out", lambda t, m: t.update(x_out=np.ones((13, 32), np.float32)), "T_out must be <= T"),
            ("k_cache", lambda t, m: t.update(k_cache=np.ones((2, 2, 16), np.float32)), 'tensor "v_cache" must be'),
        ]
        for what, mutate, msg in bad_cases:
            with self.subTest(bad=what):
                tt, mm = dict(t), dict(meta)
                mutate(tt, mm)
                path = os.path.join(self.tmp.name, f"bad_{what}.safetensors")
                st_io.write(path, tt, mm, "F32")
                p = run("check", "--case", path, "--actual", res, check=False)
                self.assertEqual(p.returncode, 2, p.stdout)
                self.assertIn(msg, p.stderr)
        # a result without a layer tensor is the port's failure (exit 1), naming the tensor
        r, _ = st_io.read(res)
        r.pop("v_cache_after")
        path = os.path.join(self.tmp.name, "partial.safetensors")
        st_io.write(path, r, {}, "F32")
        p = run("check", "--case", os.path.join(self.dirs["bf16"], "cases", "edge_w1.safetensors"), "--actual", path,
                check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn('no tensor "v_cache_after" (a layer case needs y, y_out, k_cache_after and v_cache_after)', p.stdout)


if __name__ == "__main__":
    unittest.main()
