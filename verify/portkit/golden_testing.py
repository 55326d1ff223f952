"""Helpers of the end-to-end tests of `orthros golden`, `orthros check` and the NumPy example port
(test_golden*.py): the command, the port, suite subsets and the check's JSON report.

The tests run with ORTHROS=<path of the orthros binary> and PORT_DIR=<examples/pytorch_port>.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np

ORTHROS = os.environ["ORTHROS"]
PORT_DIR = os.environ["PORT_DIR"]
sys.path.insert(0, PORT_DIR)


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
