"""orthros::attention, orthros::attention_backward and orthros::rope_append_kv on CPU: opcheck
(schema, fake tensors, autograd registration, AOT dispatch), the ops against the oracle and
against an independent dense float64 reference in every regime, gradients (vs
orthros.attention_backward and by finite differences), the P > 0 backward error."""
import pytest
import torch

import orthros
import orthros.torch as ot
from torch_cases import REGIMES, dense_reference, make_case, op_args

SEEDS = [11, 12]


@pytest.mark.parametrize("regime", sorted(REGIMES))
def test_attention_opcheck(regime):
    c = make_case(regime, seed=5, dtype=torch.float64)
    training = all(P == 0 for _, _, P in c["seqs"])
    for n in ("q", "q_out", "k_cache", "v_cache"):
        c[n].requires_grad_(training)
    torch.library.opcheck(torch.ops.orthros.attention.default, op_args(c) + (None, False))


@pytest.mark.parametrize("regime", ["pt", "sft", "ragged_training"])
def test_attention_backward_opcheck(regime):
    c = make_case(regime, seed=6, dtype=torch.float32)
    o, o_out, lse, lse_out = ot.attention(*op_args(c))
    d_o, d_o_out = torch.randn_like(o), torch.randn_like(o_out)
    args = (c["q"], c["q_out"], c["k_cache"], c["v_cache"], o, o_out, lse, lse_out, d_o, d_o_out,
            c["cu_seqlens_q"], c["cu_seqlens_out"], c["cache_seqlens"], c["window"], None, False)
    torch.library.opcheck(torch.ops.orthros.attention_backward.default, args)


@pytest.mark.parametrize("seed", SEEDS, ids=lambda s: f"seed{s}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("regime", sorted(REGIMES))
def test_attention_matches_oracle_per_sequence(regime, dtype, seed):
    """The varlen op equals orthros.attention called on each sequence's slice, bitwise."""
    c = make_case(regime, seed, dtype)
    out = ot.attention(*op_args(c))
    b0 = o0 = 0
    for b, (T, T_out, P) in enumerate(c["seqs"]):
        r = orthros.attention(c["q"][b0:b0 + T].numpy(), c["k_cache"][b, :P + T].numpy(),
                              c["v_cache"][b, :P + T].numpy(), c["q_out"][o0:o0 + T_out].numpy(), window=c["window"])
        for i, n in enumerate(("o", "o_out", "lse", "lse_out")):
            rows = slice(b0, b0 + T) if "out" not in n else slice(o0, o0 + T_out)
            assert torch.equal(out[i][rows], torch.from_numpy(r[n])), f"{regime} seed {seed} sequence {b}: {n}"
        b0, o0 = b0 + T, o0 + T_out


@pytest.mark.parametrize("seed", SEEDS, ids=lambda s: f"seed{s}")
@pytest.mark.parametrize("regime", sorted(REGIMES))
def test_attention_matches_dense_reference(regime, seed):
    """float64 op vs the dense reference of torch_cases (SPEC §2 written independently): both are
    float64 softmax attentions over <= 64 keys of unit-variance data, so they differ by rounding
    only, ~1e-15 relative; 1e-12 leaves a margin of ~1000 roundings and still fails any masking,
    window or GQA mistake (those change outputs by O(1))."""
    c = make_case(regime, seed, torch.float64)
    out = ot.attention(*op_args(c))
    ref = dense_reference(c["q"], c["q_out"], c["k_cache"], c["v_cache"], c["seqs"], c["window"])
    for i, n in enumerate(("o", "o_out", "lse", "lse_out")):
        torch.testing.assert_close(out[i], ref[n], rtol=1e-12, atol=1e-12, msg=lambda m: f"{regime} seed {seed} {n}: {m}")


def test_attention_scale_and_lse_dtype():
    c = make_case("sft", 3, torch.float32)
    o, o_out, lse, lse_out = ot.attention(*op_args(c), scale=0.3)
    assert lse.dtype == torch.float32 and lse.shape == (c["q"].shape[0], c["q"].shape[1])
    ref = dense_reference(c["q"], c["q_out"], c["k_cache"], c["v_cache"], c["seqs"], c["window"], scale=0.3)
    # float32 over 29 keys: rounding ~ 29 * 6e-8 relative; 1e-5 is a 5x margin and O(1) errors fail
    torch.testing.assert_close(o.double(), ref["o"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse_out.double(), ref["lse_out"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", SEEDS, ids=lambda s: f"seed{s}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("regime", ["pt", "sft", "prefill", "ragged_training", "window_1"])
def test_attention_gradients_match_oracle_backward(regime, dtype, seed):
    """autograd through the op: dq, dq_out bitwise orthros.attention_backward's; dk_cache/dv_cache
    hold its dk/dv at rows 0..T_b-1 of sequence b and exact zeros elsewhere."""
    c = make_case(regime, seed, dtype)
    leaves = [c[n].requires_grad_() for n in ("q", "q_out", "k_cache", "v_cache")]
    o, o_out, _, _ = ot.attention(*op_args(c))
    g = torch.Generator().manual_seed(seed + 1000)
    d_o = torch.randn(o.shape, generator=g, dtype=torch.float64).to(dtype)
    d_o_out = torch.randn(o_out.shape, generator=g, dtype=torch.float64).to(dtype)
    ((o * d_o).sum() + (o_out * d_o_out).sum()).backward()
    dq, dq_out, dk, dv = (t.grad for t in leaves)
    b0 = o0 = 0
    for b, (T, T_out, _) in enumerate(c["seqs"]):
        r = orthros.attention_backward(c["q"][b0:b0 + T].detach().numpy(), c["k_cache"][b, :T].detach().numpy(),
                                       c["v_cache"][b, :T].detach().numpy(), c["q_out"][o0:o0 + T_out].detach().numpy(),
                                       d_o[b0:b0 + T].numpy(), d_o_out[o0:o0 + T_out].numpy(), window=c["window"])
        msg = f"{regime} seed {seed} sequence {b}"
        assert torch.equal(dq[b0:b0 + T], torch.from_numpy(r["dq"])), msg
        assert torch.equal(dq_out[o0:o0 + T_out], torch.from_numpy(r["dq_out"])), msg
        assert torch.equal(dk[b, :T], torch.from_numpy(r["dk"])), msg
        assert torch.equal(dv[b, :T], torch.from_numpy(r["dv"])), msg
        assert not dk[b, T:].any() and not dv[b, T:].any(), msg
        b0, o0 = b0 + T, o0 + T_out


@pytest.mark.parametrize("regime", ["grad_sft", "grad_ragged"])
def test_attention_gradcheck(regime):
    """Finite differences (torch.autograd.gradcheck, float64) of o and o_out in every input: an
    independent check of the backward and of the k_cache-layout mapping."""
    c = make_case(regime, 21, torch.float64, capacity_extra=1)
    for n in ("q", "q_out", "k_cache", "v_cache"):
        c[n].requires_grad_()

    def f(q, q_out, k, v):
        o, o_out, _, _ = ot.attention(q, q_out, k, v, c["cu_seqlens_q"], c["cu_seqlens_out"], c["cache_seqlens"],
                                      c["window"])
        return o, o_out

    assert torch.autograd.gradcheck(f, (c["q"], c["q_out"], c["k_cache"], c["v_cache"]), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("regime", ["chunked_prefill", "decode", "ragged"])
def test_backward_with_cached_prefix_raises(regime):
    c = make_case(regime, 1, torch.float32)
    c["q"].requires_grad_()
    o, o_out, _, _ = ot.attention(*op_args(c))
    with pytest.raises(orthros.Error, match=r"empty KV-cache prefix.*sequence \d+ has P = .* cached positions"):
        (o.sum() + o_out.sum()).backward()


def test_lse_is_not_differentiable():
    c = make_case("pt", 2, torch.float32)
    c["q"].requires_grad_()
    _, _, lse, lse_out = ot.attention(*op_args(c))
    assert not lse.requires_grad and not lse_out.requires_grad


# ---- rope_append_kv ------------------------------------------------------------------

def _append_case(seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    seqs = [(5, 2, 3), (1, 1, 7), (4, 0, 0)]  # (T, T_out, P)
    Hq, Hkv, D, cap = 4, 2, 8, 12
    n, n_out = sum(s[0] for s in seqs), sum(s[1] for s in seqs)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype)  # noqa: E731
    return dict(k_new=r(n, Hkv, D), v_new=r(n, Hkv, D), k_cache=r(3, cap, Hkv, D), v_cache=r(3, cap, Hkv, D),
                q=r(n, Hq, D), q_out=r(n_out, Hq, D), cu_seqlens_q=ot.cu_seqlens([s[0] for s in seqs]),
                cu_seqlens_out=ot.cu_seqlens([s[1] for s in seqs]),
                cache_seqlens=torch.tensor([s[0] + s[2] for s in seqs], dtype=torch.int32), seqs=seqs)


def test_rope_append_kv_opcheck():
    c = _append_case(3)
    torch.library.opcheck(torch.ops.orthros.rope_append_kv.default,
                          (c["k_new"], c["v_new"], c["k_cache"], c["v_cache"], c["q"], c["q_out"], c["cu_seqlens_q"],
                           c["cu_seqlens_out"], c["cache_seqlens"], 1e4, 2))
    torch.library.opcheck(torch.ops.orthros.rope_append_kv.default,
                          (c["k_new"], c["v_new"], c["k_cache"], c["v_cache"], None, None, c["cu_seqlens_q"],
                           c["cu_seqlens_out"], c["cache_seqlens"], 0.0, 0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_rope_append_kv_matches_oracle_rope(dtype):
    """Rows P_b..P_b+T_b-1 of sequence b get RoPE(k_new) at 0-based position row + offset (the
    oracle's orthros.rope, float64, rounded once), values copied; the other rows are untouched; q
    and q_out rotated at their base positions."""
    c = _append_case(4, dtype)
    before = {n: c[n].clone() for n in ("k_cache", "v_cache", "q", "q_out")}
    off, theta = 2, 1e4
    ot.rope_append_kv(c["k_new"], c["v_new"], c["k_cache"], c["v_cache"], c["cu_seqlens_q"], c["cache_seqlens"],
                      q=c["q"], q_out=c["q_out"], cu_seqlens_out=c["cu_seqlens_out"], theta=theta, position_offset=off)
    b0 = o0 = 0
    for b, (T, T_out, P) in enumerate(c["seqs"]):
        pos = list(range(P + off, P + T + off))
        rk = torch.from_numpy(orthros.rope(c["k_new"][b0:b0 + T].numpy(), pos, theta)).to(dtype)
        assert torch.equal(c["k_cache"][b, P:P + T], rk)
        assert torch.equal(c["v_cache"][b, P:P + T], c["v_new"][b0:b0 + T])
        assert torch.equal(c["k_cache"][b, :P], before["k_cache"][b, :P])
        assert torch.equal(c["k_cache"][b, P + T:], before["k_cache"][b, P + T:])
        rq = torch.from_numpy(orthros.rope(before["q"][b0:b0 + T].numpy(), pos, theta)).to(dtype)
        assert torch.equal(c["q"][b0:b0 + T], rq)
        rqo = torch.from_numpy(orthros.rope(before["q_out"][o0:o0 + T_out].numpy(), pos[T - T_out:], theta)).to(dtype)
        assert torch.equal(c["q_out"][o0:o0 + T_out], rqo)
        b0, o0 = b0 + T, o0 + T_out


def test_rope_append_kv_plain_append_and_independent_rope():
    """theta <= 0: a plain copy. theta > 0 vs rotate-half written here from SPEC §2 (float64:
    cos/sin of the same angles, agreement to rounding, 1e-12)."""
    c = _append_case(5)
    ot.rope_append_kv(c["k_new"], c["v_new"], c["k_cache"], c["v_cache"], c["cu_seqlens_q"], c["cache_seqlens"],
                      theta=0.0)
    T0, P0 = c["seqs"][0][0], c["seqs"][0][2]
    assert torch.equal(c["k_cache"][0, P0:P0 + T0], c["k_new"][:T0])
    c = _append_case(5)
    ot.rope_append_kv(c["k_new"], c["v_new"], c["k_cache"], c["v_cache"], c["cu_seqlens_q"], c["cache_seqlens"],
                      theta=500.0)
    D = c["k_new"].shape[2]
    x = c["k_new"][:T0]
    pos = torch.arange(P0, P0 + T0, dtype=torch.float64)[:, None, None]
    f = 500.0 ** (-2.0 * torch.arange(D // 2, dtype=torch.float64) / D)
    a = pos * f
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    ref = torch.cat([x1 * a.cos() - x2 * a.sin(), x2 * a.cos() + x1 * a.sin()], dim=-1)
    torch.testing.assert_close(c["k_cache"][0, P0:P0 + T0], ref, rtol=1e-12, atol=1e-12)
