"""Tests of the `orthros` Python module against `orthros golden --grad` (bitwise) and of
`orthros check` on gradient results.

Run by ctest (label unit) with Debian's /usr/bin/python3, PYTHONPATH=<build>/python and
ORTHROS=<the orthros binary> (the golden/check tests skip, saying so, when ORTHROS is not set).
Every random input is seeded; the seed is in each assertion message.
"""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

import numpy as np

import orthros

from python_testing import GRADS, st_read, st_write


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


if __name__ == "__main__":
    unittest.main()
