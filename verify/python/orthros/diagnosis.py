"""Which known convention mistake explains a port's failing result (`orthros check --diagnose` in Python).

    import orthros.diagnosis
    d = orthros.diagnosis.diagnose(out, q, k, v, q_out, window=w, dtype="bf16")
    print(orthros.diagnosis.summary(d))      # "cause: window+1: the base window holds w+1 keys ..."

The float64 oracle is recomputed under each mistake of verify/kit/include/orthros/diagnose.hpp
(window w±1, LSE in log2, top-left causal alignment, softmax scale 1/D or 1, GQA mapping
h % H_kv, the output query at t+1, dk/dv without the output stream, the two streams swapped);
a mistake whose result the port's reproduces within SPEC §6 (every tensor judged) is the cause.
"""
import math

from . import _core

__all__ = ["diagnose", "summary"]

_OUTPUTS = ("o", "o_out", "lse", "lse_out")
_GRADIENTS = ("dq", "dq_out", "dk", "dv")


def diagnose(result, q, k, v, q_out, window, scale=None, dtype="f32", do=None, do_out=None,
             oracle_at_dtype_maxabs=None, abs_na_reason=None):
    """Names the convention mistake whose oracle the port's `result` matches.

    result: mapping with o [T,H_q,D], o_out [T_out,H_q,D], lse [T,H_q], lse_out [T_out,H_q] (and
    dq, dq_out, dk, dv when do/do_out are given); q [T,H_q,D], k/v [P+T,H_kv,D], q_out [T_out,H_q,D]
    as the port saw them (NumPy, float64/float32/float16; round bf16 inputs first). dtype: the
    port's ("f64", "f32", "bf16", "f16"), selecting SPEC §6's bounds. oracle_at_dtype_maxabs:
    {tensor: E_X or None} (None needs abs_na_reason[tensor]); omitted, it is measured with
    orthros.check_attention (and check_attention_backward) on these inputs.

    Returns {"cause": id or None, "matches": [ids], "fits": [{"id", "description", "match",
    "worst_ratio", "tensors": {name: {"max_abs", "abs_tol", "rel_fro", "rel_tol", "pass"}}}],
    "indistinguishable": [ids that change nothing on this case]}; fits are sorted, matches first,
    then by worst_ratio (max over tensors of max_abs / abs_tol). When E_X is measured here and the
    result passes SPEC §6, nothing is diagnosed: cause None, "note": "no failure".
    Raises orthros.Error on bad input.
    """
    names = _OUTPUTS + (_GRADIENTS if do is not None else ())
    if oracle_at_dtype_maxabs is None:
        reps = dict(_core.check_attention(result, q, k, v, q_out, window=window, scale=scale,
                                          dtype=dtype)["tensors"])
        if do is not None:
            reps.update(_core.check_attention_backward(result, q, k, v, q_out, do, do_out, window=window,
                                                       scale=scale, dtype=dtype)["tensors"])
        if all(reps[n]["pass"] for n in names):
            return {"cause": None, "matches": [], "fits": [], "indistinguishable": [], "note": "no failure"}
        oracle_at_dtype_maxabs = {n: reps[n]["oracle_at_dtype_maxabs"] for n in names}
        abs_na_reason = {n: reps[n]["abs_criterion"] for n in names if reps[n]["oracle_at_dtype_maxabs"] is None}
    return _core._diagnose(result, q, k, v, q_out, int(window), scale, dtype, do, do_out,
                           dict(oracle_at_dtype_maxabs), dict(abs_na_reason or {}))


def summary(d, failing=None):
    """One line from diagnose()'s dict: "cause: ID: description (tensor max_abs X (bound Y), ...)"
    or "no known convention mistake reproduces the result; closest: ID (R x its bound)".
    failing: tensor names to quote (default: every tensor of the fit)."""
    def tensors(fit):
        items = [(n, t) for n, t in fit["tensors"].items() if failing is None or n in failing]
        return "; ".join(f"{n} max_abs {t['max_abs']:.2e} (bound "
                         f"{'n/a' if t['abs_tol'] is None else format(t['abs_tol'], '.2e')})" for n, t in items)
    if d["cause"] is not None:
        fit = next(f for f in d["fits"] if f["id"] == d["cause"])
        also = [m for m in d["matches"] if m != d["cause"]]
        return (f"cause: {fit['id']}: {fit['description']} (within SPEC §6 of it: {tensors(fit)})"
                + (f"; also matching on this case: {', '.join(also)}" if also else ""))
    if d.get("note") == "no failure":
        return "no failure, nothing to diagnose"
    if not d["fits"]:
        return "no known convention mistake is distinguishable on this case"
    c = d["fits"][0]
    return (f"none of the {len(d['fits'])} known convention mistakes reproduces the result; closest: {c['id']} "
            f"({c['worst_ratio']:.3g}x its bound: {tensors(c)})")


def for_golden_case(case, out, emeta, failing):
    """The diagnosis line of orthros.testing for a failing golden case: `case` a GoldenCase, `out`
    the port's mapping, `emeta` the expected file's metadata (E_X per tensor), `failing` the
    names of the failing tensors. Never raises: a diagnosis that cannot run says why."""
    names = _OUTPUTS + (_GRADIENTS if case.grad else ())
    missing = [n for n in names if n not in out or out[n] is None]
    if missing:
        return f"diagnose: not run (the result has no {', '.join(missing)})"
    try:
        import numpy as np
        e_x, na = {}, {}
        note = emeta.get("abs_criterion", "")
        for n in names:
            x = emeta.get(f"oracle_at_dtype_maxabs.{n}", "0" if case.dtype == "f64" else None)
            if x is None:
                return f"diagnose: not run (the expected file lacks oracle_at_dtype_maxabs.{n})"
            e_x[n] = None if x == "n/a" else float(x)
            if x == "n/a":
                na[n] = note[len("n/a ("):-1] if note.startswith("n/a (") and note.endswith(")") else "n/a"
        res = {}
        for n in names:
            a = out[n]
            if hasattr(a, "detach") and hasattr(a, "cpu"):  # torch.Tensor, without importing torch
                a = a.detach().cpu().float().numpy()
            res[n] = np.asarray(a, dtype=np.float64)
        D = case.q.shape[2]
        scale = None if abs(case.scale * math.sqrt(D) - 1.0) < 1e-15 else case.scale  # None: the default 1/sqrt(D)
        d = diagnose(res, case.q, case.k, case.v, case.q_out, case.window, scale, case.dtype,
                     case.do if case.grad else None, case.do_out if case.grad else None, e_x, na)
        return "diagnose: " + summary(d, failing)
    except Exception as e:  # the failure report must not be lost to the diagnosis
        return f"diagnose: not run ({type(e).__name__}: {e})"
