"""`orthros check --diagnose` and orthros.testing's diagnosis name the mistake of each deliberately
broken port (examples/ports/broken/broken_port.py), and find nothing in the correct one.

Env: ORTHROS (the CLI), BROKEN_PORT (broken_port.py), PYTHONPATH with the orthros package (the
orthros.testing part is skipped without it).
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ORTHROS = os.environ.get("ORTHROS", "orthros")
BROKEN = os.environ["BROKEN_PORT"]
sys.path.insert(0, os.path.dirname(BROKEN))
import broken_port  # noqa: E402

SEED = "7"
# The cases each broken port runs on (the others are left out: `check --skip-missing`): both streams
# with and without a KV cache, decode, GQA 4:1, a case scale, the window probe.
CASES = "pt,sft,chunked_prefill_3of3,decode_step_1,edge_gqa4,edge_cache_sft,edge_scale,edge_window_probe,edge_w1"


def run(*args):
    return subprocess.run([ORTHROS, *args], capture_output=True, text=True)


class DiagnoseTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.suites = {}
        for name, extra in (("bf16_grad", ["--dtype", "bf16", "--grad"]), ("f32", ["--dtype", "f32"])):
            d = os.path.join(cls.tmp.name, name)
            p = run("golden", "--out", d, "--config", "tiny", "--seed", SEED, *extra)
            assert p.returncode == 0, p.stderr
            cls.suites[name] = d

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def diagnose(self, suite, mistake):
        out = os.path.join(self.tmp.name, f"{os.path.basename(suite)}_{mistake.replace('/', '_')}")
        subprocess.run([sys.executable, BROKEN, "--golden", suite, "--out", out, "--mistake", mistake, "--only", CASES],
                       check=True, capture_output=True)
        p = run("check", "--suite", suite, "--actual-dir", out, "--skip-missing", "--diagnose", "--json")
        self.assertIn(p.returncode, (0, 1), p.stderr)
        return p, json.loads(p.stdout)

    def check_mistake(self, suite, mistake):
        p, rep = self.diagnose(self.suites[suite], mistake)
        failed = [c for c in rep["cases"] if c["status"] == "fail"]
        self.assertTrue(failed, f"{mistake}: the broken port passes every case of {suite}")
        self.assertNotEqual(p.returncode, 0)
        for c in failed:
            if any(t["nan_count"] or t["inf_count"] for t in c["tensors"]):
                continue  # w-1 = 0 keys at w = 1: the result is NaN, which the report says; nothing to match
            d = c["diagnosis"]
            self.assertIn(mistake, d["matches"],
                          f"{suite} {c['name']} ({mistake}): diagnosed {d['cause']}, matches {d['matches']}; closest "
                          f"{[(f['id'], f['worst_ratio']) for f in d['fits'][:3]]}")
        # Where several mistakes give the same result on a case (e.g. the streams' masks swapped and
        # window w+1 both widen a base row that sees every key anyway), the case cannot tell them
        # apart; on most failing cases the mistake is the only match.
        unique = sum(c["diagnosis"]["matches"] == [mistake] for c in failed)
        self.assertGreater(unique, 0, f"{mistake}: never the only match on {suite}")
        return failed

    def test_every_broken_port_is_diagnosed_bf16_with_gradients(self):
        for m in broken_port.MISTAKES[1:]:
            with self.subTest(mistake=m):
                self.check_mistake("bf16_grad", m)

    def test_every_forward_mistake_is_diagnosed_f32(self):
        for m in broken_port.MISTAKES[1:]:
            if m == "dkv-without-out":  # a gradient mistake: the forward suite cannot see it
                continue
            with self.subTest(mistake=m):
                self.check_mistake("f32", m)

    def test_correct_port_gets_no_diagnosis(self):
        for suite in self.suites:
            p, rep = self.diagnose(self.suites[suite], "none")
            # (the exit status of a --skip-missing run is the gate's business; the reports are judged here)
            self.assertEqual(rep["failed"], 0, p.stdout[-3000:])
            self.assertEqual(rep["passed"], len(CASES.split(",")))
            for c in rep["cases"]:
                if c["status"] == "skipped":
                    continue
                self.assertIsNone(c["diagnosis"]["cause"], c["name"])
                self.assertEqual(c["diagnosis"]["note"], "no failure")

    def test_text_report_names_the_cause_and_its_error_against_the_bound(self):
        suite = self.suites["bf16_grad"]
        out = os.path.join(self.tmp.name, "text_window")
        subprocess.run([sys.executable, BROKEN, "--golden", suite, "--out", out, "--mistake", "window+1", "--only",
                        "pt"], check=True, capture_output=True)
        p = run("check", "--suite", suite, "--actual-dir", out, "--only", "pt", "--diagnose")
        self.assertEqual(p.returncode, 1)
        self.assertIn("diagnose: cause: window+1: the base window holds w+1 keys", p.stdout)
        self.assertRegex(p.stdout, r"within SPEC §6: .*o max_abs \d\.\d\de-\d\d \(bound \d\.\d\de-\d\d\)")
        # without --diagnose nothing is said
        self.assertNotIn("diagnose", run("check", "--suite", suite, "--actual-dir", out, "--only", "pt").stdout)

    def test_an_unknown_mistake_is_reported_as_none(self):
        # o scaled by 1.5 everywhere: no convention explains it
        suite = self.suites["f32"]
        out = os.path.join(self.tmp.name, "scaled")
        subprocess.run([sys.executable, BROKEN, "--golden", suite, "--out", out, "--mistake", "none", "--only", "sft"],
                       check=True, capture_output=True)
        import st_io
        path = os.path.join(out, "sft.safetensors")
        t, meta = st_io.read(path)
        t["o"] = t["o"] * 1.5
        st_io.write(path, t, meta, "F32")
        p = run("check", "--suite", suite, "--actual-dir", out, "--only", "sft", "--diagnose")
        self.assertEqual(p.returncode, 1)
        self.assertIn("known convention mistakes reproduces the port's result; closest:", p.stdout)

    def test_case_mode_diagnoses_too(self):
        suite = self.suites["f32"]
        out = os.path.join(self.tmp.name, "case_mode")
        subprocess.run([sys.executable, BROKEN, "--golden", suite, "--out", out, "--mistake", "gqa-modulo", "--only",
                        "sft"], check=True, capture_output=True)
        p = run("check", "--case", os.path.join(suite, "cases", "sft.safetensors"), "--actual",
                os.path.join(out, "sft.safetensors"), "--diagnose", "--json")
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertEqual(json.loads(p.stdout)["cases"][0]["diagnosis"]["cause"], "gqa-modulo")


@unittest.skipUnless(os.environ.get("PYTHONPATH"), "orthros package not on PYTHONPATH")
class TestingDiagnosisTest(unittest.TestCase):
    def test_failure_message_names_the_cause(self):
        import numpy as np
        import orthros.testing
        with tempfile.TemporaryDirectory() as tmp:
            suite = os.path.join(tmp, "g")
            self.assertEqual(run("golden", "--out", suite, "--config", "tiny", "--seed", SEED, "--dtype", "bf16",
                                 "--grad").returncode, 0)

            def port(mistake):
                def fn(case):
                    t = {"q": case.q, "k": case.k, "v": case.v, "q_out": case.q_out}
                    if case.grad:
                        t.update(do=case.do, do_out=case.do_out)
                    return broken_port.port(t, case.window, case.scale, mistake, np.float32)
                return fn

            for mistake, only in (("lse-log2", "sft"), ("dkv-without-out", "pt"), ("out-top-left", "sft")):
                with self.subTest(mistake=mistake):
                    with self.assertRaises(AssertionError) as cm:
                        orthros.testing.assert_matches_golden(port(mistake), suite, only=only)
                    self.assertIn(f"diagnose: cause: {mistake}: ", str(cm.exception))
            orthros.testing.assert_matches_golden(port("none"), suite, only="sft")

    def test_lse_floor_in_python(self):
        import numpy as np
        import orthros
        ref = np.array([[234.0, -200.0], [5.0, 1.0]])
        act = ref + np.array([[3e-5, 0.0], [0.0, 0.0]])   # 2 ulp of 234: within F, not within 1e-6
        self.assertFalse(orthros.check(act, ref, "f32", oracle_at_dtype_maxabs=0.0, name="lse")["pass"])
        r = orthros.check(act, ref, "f32", oracle_at_dtype_maxabs=0.0, name="lse", lse_max_keys=8)
        self.assertTrue(r["pass"], r)
        self.assertAlmostEqual(r["lse_f32_floor"], orthros.lse_f32_floor(234.0, 8), delta=1e-18)
        self.assertAlmostEqual(r["abs_tol"], 1e-6 + r["lse_f32_floor"], delta=1e-18)
        self.assertEqual(orthros.lse_max_keys("lse", 3, 20, 4, 8), 8)
        self.assertEqual(orthros.lse_max_keys("lse_out", 3, 20, 4, 8), 23)
        self.assertEqual(orthros.check(act, ref, "f64", name="lse", lse_max_keys=8)["lse_f32_floor"], 0.0)

    def test_lse_rel_scale_in_python(self):
        import numpy as np
        import orthros
        ref = np.array([[-3.78e-5]])   # a one-key row's LSE near 0 (SPEC §6)
        act = ref + 2.4e-9             # relative 6.3e-5 of L, 2.4e-9 of e^L
        plain = orthros.check(act, ref, "f32", oracle_at_dtype_maxabs=2.45e-9, name="lse")
        self.assertFalse(plain["pass"])
        self.assertFalse(plain["rel_lse_scale"])
        r = orthros.check(act, ref, "f32", oracle_at_dtype_maxabs=2.45e-9, name="lse", lse_max_keys=1)
        self.assertTrue(r["pass"], r)
        self.assertTrue(r["rel_lse_scale"])
        self.assertAlmostEqual(r["rel_fro"], 2.4e-9, delta=1e-15)
        off = orthros.check(ref + 2e-5, ref, "f32", oracle_at_dtype_maxabs=2.45e-9, name="lse", lse_max_keys=1)
        self.assertFalse(off["pass_rel"])

    def test_diagnose_measures_e_x_itself(self):
        import numpy as np
        import orthros
        import orthros.diagnosis
        rng = np.random.default_rng(21)
        q, k, v = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((12, 4, 8), (12, 2, 8), (12, 2, 8)))
        q_out = rng.uniform(-1, 1, (3, 4, 8)).astype(np.float32)
        wrong = orthros.attention(q, k, v, q_out, window=5)  # the port used w = 5 for w = 4
        d = orthros.diagnosis.diagnose(wrong, q, k, v, q_out, window=4, dtype="f32")
        self.assertEqual(d["cause"], "window+1", d["fits"][:2])
        self.assertIn("cause: window+1", orthros.diagnosis.summary(d))
        right = orthros.attention(q, k, v, q_out, window=4)
        self.assertIsNone(orthros.diagnosis.diagnose(right, q, k, v, q_out, window=4, dtype="f32")["cause"])


if __name__ == "__main__":
    unittest.main()
