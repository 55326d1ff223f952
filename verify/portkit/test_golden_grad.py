"""`orthros golden --grad` suites judged end to end with the NumPy port's hand-written backward.

Run by ctest (label unit) with ORTHROS=<path of the orthros binary> and PORT_DIR=<examples/pytorch_port>.
"""
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

from golden_testing import PORT_DIR, run, port, GRAD_TENSORS, ALL_TENSORS, EXTENDED, check_json, subset_suite
import st_io  # noqa: E402  (examples/pytorch_port, on sys.path through golden_testing)


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


if __name__ == "__main__":
    unittest.main()
