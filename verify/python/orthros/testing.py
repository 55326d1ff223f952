"""A port's golden-suite test in one call: `assert_matches_golden(port_fn, suite_dir)`.

    import orthros.testing

    def my_port(case):                      # case: one golden case (see GoldenCase)
        out = my_attention(case.q, case.k, case.v, case.q_out, window=case.window, scale=case.scale)
        if case.grad:                       # a `orthros golden --grad` suite: the backward too
            out.update(my_attention_backward(case.q, case.k, case.v, case.q_out, case.do, case.do_out,
                                             window=case.window, scale=case.scale))
        return out                          # mapping: o, o_out, lse, lse_out (+ dq, dq_out, dk, dv)

    def test_port_matches_golden():         # pytest / unittest
        orthros.testing.assert_matches_golden(my_port, "golden-bf16")

The suite is a directory written by `orthros golden --out DIR [--dtype ...] [--grad]`
(docs/porting.md). For every case of its manifest the port runs on the case's inputs, and each
returned tensor is judged against the suite's float64 expected file by SPEC §6 with the E_X the
suite stores: `orthros.check`, the C++ checker of `orthros check --suite` (no tolerance rule is
restated here). Gradients are judged when the suite has them (per case, as `orthros check` does:
`edge_large_logits` is forward-only in a `--grad` suite). Nothing is written to disk.

When a case fails, AssertionError says which case, which tensor, why (rel, abs, nan/inf, shape),
the errors and their bounds, the worst index with the actual and expected value, and the bad rows
(all of them, as runs of consecutive rows) as absolute positions t (base rows t = P+i+1, output
rows t = P+T-T_out+i+1, dk/dv rows are cache rows t = i+1), so a failure reads like the report of
`orthros check`, and a `diagnose:` line names the known convention mistake the result matches, as
`orthros check --diagnose` does (orthros.diagnosis). Under pytest the helper's own frames are hidden (`__tracebackhide__`): a
failure shows the test's line and the message, not this module's source.

`read_safetensors(path)` reads any .safetensors file with NumPy alone (a case, an expected file,
a port's result): it returns `(tensors, metadata)`, a dict of NumPy arrays by name (BF16 widened
to float32 exactly) and the `__metadata__` dict of strings; it raises ValueError naming the file
for anything that is not a regular file, a truncated or malformed file, or an unsupported dtype.
"""
import json
import math
import os

import numpy as np

from . import _core
from . import diagnosis as _diagnosis
from ._safetensors import read_safetensors, require_regular_file  # one reader, shared with examples/pytorch_port/st_io.py

__all__ = ["GoldenCase", "LayerCase", "assert_matches_golden", "golden_cases", "read_safetensors"]

OUTPUTS = ("o", "o_out", "lse", "lse_out")
GRADIENTS = ("dq", "dq_out", "dk", "dv")
LAYER_OUTPUTS = ("y", "y_out", "k_cache_after", "v_cache_after")
LAYER_WEIGHTS = ("w_q", "w_k", "w_v", "w_o", "alpha", "beta", "alpha_out", "beta_out", "q_norm", "k_norm")


class GoldenCase:
    """One case of a golden suite, as handed to the port.

    Attributes: name, regime, description, dtype (the suite's: "f64", "f32", "bf16", "f16"),
    q [T, H_q, D], k and v [P+T, H_kv, D], q_out [T_out, H_q, D] (NumPy, in the suite dtype;
    bf16 read as float32 exactly), window, scale (the effective one: metadata or 1/sqrt(D)),
    T, P, T_out, H_q, H_kv, D; grad (True when this case's gradients are judged) with
    do [T, H_q, D] and do_out [T_out, H_q, D] (None otherwise); entry (the manifest entry).
    `case["q"]` works too."""

    def __init__(self, entry, tensors, metadata, dtype, grad):
        self.entry = entry
        self.name = entry["name"]
        self.regime = entry.get("regime", "")
        self.description = entry.get("description", "")
        self.dtype = dtype
        for n in ("q", "k", "v", "q_out"):
            if n not in tensors:
                raise ValueError(f"case {self.name}: the case file has no tensor {n!r} (tensors: "
                                 f"{', '.join(sorted(tensors))}); assert_matches_golden runs attention cases")
        self.q, self.k, self.v, self.q_out = (tensors[n] for n in ("q", "k", "v", "q_out"))
        self.T, self.H_q, self.D = self.q.shape
        self.P = self.k.shape[0] - self.T
        self.H_kv = self.k.shape[1]
        self.T_out = self.q_out.shape[0]
        self.window = int(metadata.get("window", entry.get("window")))
        self.scale = float(metadata["scale"]) if "scale" in metadata else 1.0 / math.sqrt(self.D)
        self.grad = bool(grad)
        self.do = tensors.get("do") if grad else None
        self.do_out = tensors.get("do_out") if grad else None
        if grad and (self.do is None or self.do_out is None):
            raise ValueError(f"case {self.name}: its gradients are judged but the case file has no do/do_out")

    def __getitem__(self, key):
        return getattr(self, key)

    def __contains__(self, key):
        return getattr(self, key, None) is not None

    def position(self, tensor, row):
        """Absolute position t (1-based) of row `row` of `tensor` (SPEC §5; docs/porting.md)."""
        if tensor in ("dk", "dv", "k", "v"):
            return row + 1
        if tensor.endswith("_out"):
            return self.P + self.T - self.T_out + row + 1
        return self.P + row + 1

    def __repr__(self):
        return (f"GoldenCase({self.name}: {self.regime}, T={self.T} P={self.P} T_out={self.T_out} H_q={self.H_q} "
                f"H_kv={self.H_kv} D={self.D} w={self.window}, {self.dtype}{', grad' if self.grad else ''})")


class LayerCase:
    """One case of a layer suite (`orthros golden --level layer`; docs/porting.md "Layer suite"),
    as handed to the port.

    Attributes: name, regime, description, dtype; x [T, d_model], x_out [T_out, d_model], weights
    (dict: w_q [d_model, H_q*D], w_k, w_v [d_model, H_kv*D], w_o [H_q*D, d_model], alpha, beta,
    alpha_out, beta_out [H_q*D], q_norm, k_norm [D] or None without QK-norm), k_cache, v_cache
    [P, H_kv, D] (the cache before the call); T, P, T_out, d_model, H_q, H_kv, D, window,
    rope_theta, qk_norm (bool), rms_eps, scale (1/sqrt(D)); grad False; entry. The port returns
    y [T, d_model], y_out [T_out, d_model], k_cache_after, v_cache_after [P+T, H_kv, D]."""

    grad = False

    def __init__(self, entry, tensors, metadata, dtype):
        self.entry = entry
        self.name = entry["name"]
        self.regime = entry.get("regime", "")
        self.description = entry.get("description", "")
        self.dtype = dtype
        for n in ("x", "x_out", "k_cache", "v_cache") + LAYER_WEIGHTS[:8]:
            if n not in tensors:
                raise ValueError(f"case {self.name}: the layer case file has no tensor {n!r}")
        self.x, self.x_out, self.k_cache, self.v_cache = (tensors[n] for n in ("x", "x_out", "k_cache", "v_cache"))
        self.weights = {n: tensors.get(n) for n in LAYER_WEIGHTS}
        self.H_q, self.H_kv, self.D = (int(metadata[n]) for n in ("num_q_heads", "num_kv_heads", "head_dim"))
        self.window = int(metadata["window"])
        self.rope_theta, self.rms_eps = float(metadata["rope_theta"]), float(metadata["rms_eps"])
        self.qk_norm = metadata["qk_norm"] == "1"
        self.T, self.d_model = self.x.shape
        self.T_out, self.P = self.x_out.shape[0], self.k_cache.shape[0]
        self.scale = 1.0 / math.sqrt(self.D)

    def __getitem__(self, key):
        return getattr(self, key)

    def __contains__(self, key):
        return getattr(self, key, None) is not None

    def position(self, tensor, row):
        """Absolute position t (1-based) of row `row` of `tensor`: y rows P+i+1, y_out rows
        P+T-T_out+i+1, cache rows i+1."""
        if tensor.startswith(("k_cache", "v_cache")):
            return row + 1
        if tensor.endswith("_out"):
            return self.P + self.T - self.T_out + row + 1
        return self.P + row + 1

    def __repr__(self):
        return (f"LayerCase({self.name}: {self.regime}, T={self.T} P={self.P} T_out={self.T_out} "
                f"d_model={self.d_model} H_q={self.H_q} H_kv={self.H_kv} D={self.D} w={self.window}, {self.dtype})")


def _manifest(suite_dir):
    __tracebackhide__ = True
    path = os.path.join(os.fspath(suite_dir), "manifest.json")
    try:
        require_regular_file(path, "a manifest.json file")
        with open(path) as f:
            m = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read golden suite {suite_dir}: {path}: {e} "
                         "(write one with `orthros golden --out DIR`)") from None
    if not isinstance(m, dict) or m.get("format") != "orthros-golden" or not isinstance(m.get("cases"), list):
        raise ValueError(f"{path} is not an orthros golden manifest")
    return m


def _selected(entry, only, skip):
    name = entry["name"]
    if only is not None:
        names = [only] if isinstance(only, str) else list(only)
        if not any(s in name for s in names):
            return False
    return not (skip is not None and (skip(entry) if callable(skip) else name in set(skip)))


def golden_cases(suite_dir, grad=None, only=None, skip=None):
    """Yields (GoldenCase, expected tensors, expected metadata) for every selected case of a suite.

    grad: None judges gradients where the suite has them (per-case "grad", as `orthros check`),
    False never, True requires them (ValueError for a forward-only suite). only: a substring (or
    list of substrings) of the case names to keep; skip: case names (or a predicate on the
    manifest entry) to leave out."""
    __tracebackhide__ = True
    suite_dir = os.fspath(suite_dir)
    m = _manifest(suite_dir)
    suite_grad = m.get("grad")
    if grad and not suite_grad:
        raise ValueError(f"golden suite {suite_dir} has no gradients (write it with `orthros golden --grad`)")
    for entry in m["cases"]:
        if not _selected(entry, only, skip):
            continue
        name = entry.get("name", "?")
        try:
            tensors, meta = read_safetensors(os.path.join(suite_dir, entry["file"]))
            expected, emeta = read_safetensors(os.path.join(suite_dir, entry["expected"]))
        except (OSError, KeyError, ValueError) as e:
            raise ValueError(f"golden suite {suite_dir}, case {name}: {e}") from None
        has_grad = all(g in expected for g in GRADIENTS)
        judged = entry.get("grad", suite_grad if suite_grad is not None else has_grad)
        if judged and not has_grad:
            raise ValueError(f"golden suite {suite_dir}, case {name}: says \"grad\": true but its expected file "
                             "has no dq, dq_out, dk, dv")
        dtype = emeta.get("dtype") or entry.get("dtype") or m.get("dtype")
        if m.get("level") == "layer":
            yield LayerCase(entry, tensors, meta, dtype), expected, emeta
        else:
            yield GoldenCase(entry, tensors, meta, dtype, judged and grad is not False), expected, emeta


def _as_numpy(x):
    """NumPy view of a port's output: NumPy arrays, lists, and PyTorch tensors (any device/dtype)."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch.Tensor without importing torch
        x = x.detach().cpu()
        if str(getattr(x, "dtype", "")) == "torch.bfloat16":
            x = x.float()  # exact
        x = x.numpy()
    a = np.asarray(x)
    if a.dtype.kind != "f":
        a = a.astype(np.float64)
    return a


_MAX_RUNS_SHOWN = 16  # runs of bad rows written out per tensor (the report dict keeps all)


def _ranges(runs, offset=0):
    """'4-7, 9' from runs (first, last) of consecutive rows, each shifted by `offset`; past
    _MAX_RUNS_SHOWN runs, ', ... (N more runs)'."""
    out = [str(a + offset) if a == b else f"{a + offset}-{b + offset}" for a, b in runs[:_MAX_RUNS_SHOWN]]
    if len(runs) > _MAX_RUNS_SHOWN:
        out.append(f"... ({len(runs) - _MAX_RUNS_SHOWN} more runs)")
    return ", ".join(out)


def _judge(case, name, actual, expected, emeta):
    """SPEC §6 on one tensor by orthros.check (the C++ checker) with the suite's E_X."""
    e_x = emeta.get(f"oracle_at_dtype_maxabs.{name}")
    na = None
    if e_x == "n/a":
        note = emeta.get("abs_criterion", "")
        na = note[len("n/a ("):-1] if note.startswith("n/a (") and note.endswith(")") else (note or "n/a")
        e_x = None
    elif e_x is not None:
        e_x = float(e_x)
    elif case.dtype != "f64":
        raise ValueError(f"case {case.name}: expected file lacks metadata oracle_at_dtype_maxabs.{name}")
    rep = _core.check(actual, expected[name], case.dtype, oracle_at_dtype_maxabs=e_x, name=name, abs_na_reason=na,
                      lse_max_keys=_core.lse_max_keys(name, case.P, case.T, case.T_out, case.window))
    rep["bad_positions"] = [case.position(name, r) for r in rep["bad_rows"]]
    first = case.position(name, 0)
    rep["bad_position_ranges"] = [(a + first, b + first) for a, b in rep["bad_row_ranges"]]
    return rep


def _why(rep):
    if not rep["shape_ok"]:
        return "shape"
    return ",".join(w for w, ok in (("nan/inf", rep["pass_finite"]), ("rel", rep["pass_rel"]),
                                    ("abs", rep["pass_abs"])) if not ok) or "fail"


def _describe(case, name, rep, expected_shape):
    if rep is None:
        return f"{name}: missing (the port's result has no {name!r})"
    if not rep["shape_ok"]:
        return (f"{name} FAIL (shape): the port returned shape {list(rep['actual_shape'])}, the suite expects "
                f"{list(expected_shape)}")
    abs_tol = "n/a" if rep["abs_tol"] is None else f"{rep['abs_tol']:.2e}"
    s = (f"{name} FAIL ({_why(rep)}): rel_err {rep['rel_fro']:.2e} (tol {rep['rel_tol']:.0e}), "
         f"max_abs {rep['max_abs']:.2e} (tol {abs_tol}), max_rel {rep['max_rel']:.2e}")
    if rep["worst_index"]:
        s += (f", worst [{','.join(str(i) for i in rep['worst_index'])}] actual {rep['worst_actual']:.6g} "
              f"expected {rep['worst_ref']:.6g}")
    if rep["nan_count"] or rep["inf_count"]:
        s += f", {rep['nan_count']} NaN {rep['inf_count']} Inf"
    n = rep["bad_row_count"]
    if n:
        rows = expected_shape[0] if expected_shape else 0
        runs = rep["bad_row_ranges"]
        s += (f"; {n} of {rows} rows bad: {'row' if n == 1 else 'rows'} {_ranges(runs)} = "
              f"{'position' if n == 1 else 'positions'} t = {_ranges(runs, case.position(name, 0))}")
    return s


def assert_matches_golden(port_fn, suite_dir, *, grad=None, only=None, skip=None, max_cases_shown=10):
    """Runs `port_fn` on every case of the golden suite `suite_dir` and judges it by SPEC §6.

    port_fn(case) gets a GoldenCase (q, k, v, q_out, window, scale, and do, do_out when
    case.grad) and returns a mapping with o [T,H_q,D], o_out [T_out,H_q,D], lse [T,H_q],
    lse_out [T_out,H_q] (natural log), plus dq, dq_out, dk, dv when case.grad: NumPy arrays (or
    PyTorch tensors), any float dtype. On a layer suite (`orthros golden --level layer`) port_fn
    gets a LayerCase (x, x_out, weights, k_cache, v_cache, config) and returns y [T,d_model],
    y_out [T_out,d_model], k_cache_after, v_cache_after [P+T,H_kv,D], judged the same way.
    grad: None (default) judges gradients where the suite has them; False judges the forward
    only; True requires a gradient suite. only: substring(s) of case names to run; skip: case
    names (or a predicate on the manifest entry) the port does not support.

    Raises AssertionError when any case fails, naming each failing case, tensor, criterion and
    bad positions (the first `max_cases_shown` cases in full; None: all); ValueError when the suite itself
    is unreadable or nothing is selected. An exception from port_fn propagates with the case's
    name attached. Returns {"passed": [names], "failed": [names], "skipped": [names],
    "reports": {name: {"pass": bool, "grad": bool, "tensors": {tensor: report}}}} (reports are
    orthros.check()'s dicts plus "bad_positions" and "bad_position_ranges"). Writes no files.
    """
    __tracebackhide__ = True  # pytest: show the test's line and the message, not this function's source
    suite_dir = os.fspath(suite_dir)
    m = _manifest(suite_dir)
    result = {"passed": [], "failed": [], "skipped": [], "reports": {}}
    result["skipped"] = [e["name"] for e in m["cases"] if _selected(e, only, None) and not _selected(e, None, skip)]
    failures = []
    n_grad = 0
    for case, expected, emeta in golden_cases(suite_dir, grad=grad, only=only, skip=skip):
        try:
            out = port_fn(case)
        except Exception as e:
            msg = f"orthros.testing.assert_matches_golden: port_fn raised on case {case.name} ({case!r})"
            if hasattr(e, "add_note"):
                e.add_note(msg)
                raise
            raise RuntimeError(f"{msg}: {type(e).__name__}: {e}") from e
        if out is None or not hasattr(out, "__getitem__") or not hasattr(out, "__contains__"):
            want = LAYER_OUTPUTS if isinstance(case, LayerCase) else OUTPUTS + (GRADIENTS if case.grad else ())
            raise TypeError(f"port_fn returned {type(out).__name__} on case {case.name}; expected a mapping with "
                            f"{', '.join(want)}")
        names = LAYER_OUTPUTS if isinstance(case, LayerCase) else OUTPUTS + (GRADIENTS if case.grad else ())
        n_grad += case.grad
        tensors, lines = {}, []
        for n in names:
            if n not in out or out[n] is None:
                tensors[n] = None
                lines.append(_describe(case, n, None, None))
                continue
            rep = _judge(case, n, _as_numpy(out[n]), expected, emeta)
            tensors[n] = rep
            if not rep["pass"]:
                lines.append(_describe(case, n, rep, expected[n].shape))
        ok = not lines
        if not ok:  # which known convention mistake reproduces the result (orthros/diagnosis.py)
            lines.append(_diagnosis.for_golden_case(case, out, emeta, [n for n in names if tensors[n] is None
                                                                       or not tensors[n]["pass"]]))
        result["reports"][case.name] = {"pass": ok, "grad": case.grad, "tensors": tensors}
        result["passed" if ok else "failed"].append(case.name)
        if not ok:
            na = {r["abs_criterion"] for r in tensors.values() if r is not None and r["abs_criterion"] != "applied"}
            head = (f"{case.name} ({case.regime}, T={case.T} P={case.P} T_out={case.T_out} H_q={case.H_q} "
                    f"H_kv={case.H_kv} D={case.D} w={case.window}, {case.dtype}"
                    f"{', with gradients' if case.grad else ''})")
            failures.append("\n".join([head] + ["    " + line for line in lines] +
                                      [f"    abs criterion: {x}" for x in sorted(na)]))
    total = len(result["passed"]) + len(result["failed"])
    if total == 0:
        raise ValueError(f"golden suite {suite_dir}: no case selected (only={only!r}, skip={skip!r})")
    if failures:
        shown = failures if max_cases_shown is None else failures[:max_cases_shown]
        more = len(failures) - len(shown)
        raise AssertionError(
            f"port fails SPEC §6 on {len(failures)} of {total} cases of golden suite {suite_dir} "
            f"({m.get('dtype', '?')}, gradients judged in {n_grad}): {', '.join(result['failed'])}\n"
            + "\n".join(shown) + (f"\n... and {more} more failing case(s)" if more else ""))
    return result
