"""The library adapters of examples/ports/ where they can run without a GPU: FlexAttention's forward on
CPU (self-check, then cases of the tiny f32 forward suite judged by `orthros check --diagnose`), and
summarize_ports.py on the reports. Skipped when the interpreter has no torch.

Env: ORTHROS (the CLI), PORTS_DIR (examples/ports).
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ORTHROS = os.environ.get("ORTHROS", "orthros")
PORTS = os.environ["PORTS_DIR"]
sys.path.insert(0, PORTS)
try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

CASES = ("pt", "sft", "chunked_prefill_3of3", "decode_step_1", "edge_gqa7", "edge_scale", "edge_w1")


@unittest.skipUnless(HAVE_TORCH, "no torch in this interpreter")
class FlexOnCpuTest(unittest.TestCase):
    def test_flex_adapter_passes_the_tiny_f32_forward_cases(self):
        import flex_port
        import port_common
        with tempfile.TemporaryDirectory() as tmp:
            suite = os.path.join(tmp, "g")
            p = subprocess.run([ORTHROS, "golden", "--out", suite, "--config", "tiny", "--dtype", "f32", "--seed", "7"],
                               capture_output=True, text=True)
            self.assertEqual(p.returncode, 0, p.stderr)
            found = port_common.self_check("flex", flex_port.VARIANTS, "cpu", torch.float32, grad=False)
            self.assertEqual(found, "one block mask, natural-log LSE")
            with open(os.path.join(suite, "manifest.json")) as f:
                m = json.load(f)
            m["cases"] = [c for c in m["cases"] if c["name"] in CASES]
            m.pop("groups", None)  # the suite's regime groups name cases this subset leaves out
            small = os.path.join(tmp, "small")
            os.makedirs(small)
            for d in ("cases", "expected"):
                os.symlink(os.path.join(suite, d), os.path.join(small, d))
            with open(os.path.join(small, "manifest.json"), "w") as f:
                json.dump(m, f)
            out = os.path.join(tmp, "flex")
            written, skipped = port_common.run_suite("flex", flex_port.VARIANTS[found], small, out, "cpu", "test")
            self.assertEqual((written, skipped), (len(CASES), {}))
            p = subprocess.run([ORTHROS, "check", "--suite", small, "--actual-dir", out, "--diagnose", "--json"],
                               capture_output=True, text=True)
            rep = json.loads(p.stdout)
            self.assertEqual((rep["passed"], rep["failed"]), (len(CASES), 0), p.stdout[-2000:])
            # the summary table reads the reports
            ports = os.path.join(tmp, "ports")
            os.makedirs(os.path.join(ports, "flex", "op-small.results"))
            with open(os.path.join(ports, "flex", "op-small.json"), "w") as f:
                f.write(p.stdout)
            with open(os.path.join(ports, "flex", "op-small.log"), "w") as f:
                f.write(f"[flex self-check] convention found: {found}\n")
            s = subprocess.run([sys.executable, os.path.join(PORTS, "summarize_ports.py"), ports, "--libs", "flex",
                                "--suites", "op-small"], capture_output=True, text=True, check=True).stdout
            self.assertIn(f"| flex | op-small | {len(CASES)} | 0 | 0 | {found} |", s)


if __name__ == "__main__":
    unittest.main()
