"""The kit validates the torch ops as a port (CPU, float32): orthros.testing.assert_matches_golden
with orthros.torch.attention on an f32 operator suite, forward and --grad (gradients through
autograd), and with OrthrosAttention on the f32 layer suite. The suites are generated here by
`orthros golden` (ORTHROS=<path of the orthros command>)."""
import os

import numpy as np
import pytest
import torch

import orthros.testing
import orthros.torch as ot
from torch_cases import write_golden


def attention_port(device="cpu", dtype=torch.float32):
    """A golden operator case through orthros.torch.attention (B = 1, k_cache = k[None]) and, for a
    gradient case, autograd. The backward needs P = 0 (training); a case with P > 0 is
    differentiated as the equivalent training call over all P+T positions whose first P base rows
    have zero upstream gradient (their dS is exactly 0, so they add exact zeros to dk, dv), which
    is the same function of q, q_out, k, v."""
    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=dtype)

    def port(case):
        T, P, T_out = case.T, case.P, case.T_out
        i32 = dict(dtype=torch.int32)
        q, q_out, k, v = t(case.q), t(case.q_out), t(case.k)[None], t(case.v)[None]
        o, o_out, lse, lse_out = ot.attention(q, q_out, k, v, torch.tensor([0, T], **i32),
                                              torch.tensor([0, T_out], **i32), torch.tensor([P + T], **i32),
                                              case.window, scale=case.scale)
        out = dict(o=o, o_out=o_out, lse=lse, lse_out=lse_out)
        if case.grad:
            q_full = torch.cat([torch.zeros(P, case.H_q, case.D, dtype=dtype, device=device), q]).requires_grad_()
            q_out_g, k_g, v_g = q_out.clone().requires_grad_(), k.clone().requires_grad_(), v.clone().requires_grad_()
            og, og_out, _, _ = ot.attention(q_full, q_out_g, k_g, v_g, torch.tensor([0, P + T], **i32),
                                            torch.tensor([0, T_out], **i32), torch.tensor([P + T], **i32),
                                            case.window, scale=case.scale)
            d_o = torch.cat([torch.zeros(P, case.H_q, case.D, dtype=dtype, device=device), t(case.do)])
            dq, dq_out, dk, dv = torch.autograd.grad((og * d_o).sum() + (og_out * t(case.do_out)).sum(),
                                                     [q_full, q_out_g, k_g, v_g])
            out.update(dq=dq[P:], dq_out=dq_out, dk=dk[0], dv=dv[0])
        return out
    return port


def layer_port(device="cpu", dtype=torch.float32, deterministic=False):
    """A golden layer case through OrthrosAttention with an OrthrosKVCache holding the case's cache
    before the call (prefill, chunk, decode) or none (P = 0: the training path)."""
    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=dtype)

    def port(case):
        layer = ot.OrthrosAttention(case.d_model, case.H_q, case.H_kv, case.D, case.window, rope_theta=case.rope_theta,
                                    qk_norm=case.qk_norm, rms_eps=case.rms_eps, deterministic=deterministic,
                                    dtype=dtype, device=device)
        with torch.no_grad():
            for n, w in case.weights.items():
                if w is not None:
                    getattr(layer, n).copy_(t(w))
            cache = layer.new_cache(1, case.P + case.T)
            cache.k[0, :case.P] = t(case.k_cache)
            cache.v[0, :case.P] = t(case.v_cache)
            cache.lengths = [case.P]
            y, y_out = layer(t(case.x), t(case.x_out), cache=cache)
        return dict(y=y, y_out=y_out, k_cache_after=cache.k[0], v_cache_after=cache.v[0])
    return port


@pytest.fixture(scope="session")
def suites(tmp_path_factory):
    d = tmp_path_factory.mktemp("golden")
    return {"op": write_golden(d / "op_f32", "--dtype", "f32"),
            "grad": write_golden(d / "grad_f32", "--dtype", "f32", "--grad")}


def test_attention_op_passes_the_f32_operator_suite(suites):
    r = orthros.testing.assert_matches_golden(attention_port(), suites["op"])
    assert len(r["passed"]) == 32 and not r["failed"] and not r["skipped"]


def test_attention_op_and_autograd_pass_the_f32_gradient_suite(suites):
    r = orthros.testing.assert_matches_golden(attention_port(), suites["grad"], grad=True)
    assert len(r["passed"]) == 33 and sum(rep["grad"] for rep in r["reports"].values()) == 32  # edge_large_logits: forward only


def test_a_broken_port_fails_the_suite(suites):
    """The judge is live: the window off by one (FlashAttention's window_size=(w, 0) taken for ours)
    fails the window cases."""
    good = attention_port()

    def off_by_one(case):
        case.window += 1
        return good(case)

    with pytest.raises(AssertionError, match="port fails SPEC §6"):
        orthros.testing.assert_matches_golden(off_by_one, suites["op"], only=["pt", "edge_w1"])


def test_orthros_attention_module_passes_the_f32_layer_suite(tmp_path):
    d = write_golden(tmp_path / "layer_f32", "--level", "layer", "--dtype", "f32")
    r = orthros.testing.assert_matches_golden(layer_port(), d)
    assert len(r["passed"]) == 35 and not r["failed"]
