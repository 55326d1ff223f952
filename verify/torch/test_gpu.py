"""GPU variants (marker `gpu`; skipped with the reason when there is no GPU or no orthros._cuda):
opcheck on CUDA; the bf16/f16 operator suites, forward and --grad, through the torch op; the layer
suite through OrthrosAttention; the deterministic mode bitwise equal across PT, SFT, prefill,
chunked prefill and decode through the ops; a decode step captured in a CUDA graph replays
correctly. The regime-equality check also runs on CPU (the oracle), which tests the test."""
import numpy as np
import pytest
import torch

import orthros.testing
import orthros.torch as ot
from test_golden import attention_port, layer_port
from torch_cases import make_case, op_args, write_golden

gpu = pytest.mark.gpu
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


def _to(c, device, dtype):
    out = dict(c)
    for n in ("q", "q_out", "k_cache", "v_cache"):
        out[n] = c[n].to(device=device, dtype=dtype)
    return out


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("regime", ["pt", "sft", "chunked_prefill", "decode", "ragged", "ragged_training"])
def test_opcheck_cuda(regime, dtype):
    c = _to(make_case(regime, 5, torch.float32), "cuda", dtype)
    training = all(P == 0 for _, _, P in c["seqs"])
    for n in ("q", "q_out", "k_cache", "v_cache"):
        c[n].requires_grad_(training)
    torch.library.opcheck(torch.ops.orthros.attention.default, op_args(c) + (None, True))


@gpu
def test_opcheck_cuda_append_and_layer():
    c = _to(make_case("ragged", 6, torch.float32), "cuda", torch.bfloat16)
    k_new = torch.randn(c["q"].shape[0], 2, 16, device="cuda", dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.orthros.rope_append_kv.default,
                          (k_new, k_new.clone(), c["k_cache"], c["v_cache"], c["q"], c["q_out"], c["cu_seqlens_q"],
                           c["cu_seqlens_out"], c["cache_seqlens"], 1e4, 0))
    layer = ot.OrthrosAttention(64, 4, 2, 16, 8, deterministic=True, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(20, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    x_out = torch.randn(5, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    torch.library.opcheck(torch.ops.orthros.layer.default,
                          (x, x_out, *layer._weights(), ot.cu_seqlens([12, 8]), ot.cu_seqlens([4, 1]),
                           *layer._scalars()))


@gpu
@pytest.mark.parametrize("grad", [False, True], ids=["forward", "grad"])
@pytest.mark.parametrize("config", ["tiny", "qwen3-8b"])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_operator_suite_through_the_torch_op(tmp_path, dtype, config, grad):
    args = ["--dtype", dtype, "--config", config] + (["--grad"] if grad else [])
    d = write_golden(tmp_path / "suite", *args)
    r = orthros.testing.assert_matches_golden(attention_port("cuda", DTYPES[dtype]), d, grad=grad)
    assert r["passed"] and not r["failed"]


@gpu
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_layer_suite_through_orthros_attention(tmp_path, dtype):
    d = write_golden(tmp_path / "layer", "--level", "layer", "--dtype", dtype)
    r = orthros.testing.assert_matches_golden(layer_port("cuda", DTYPES[dtype]), d)
    assert len(r["passed"]) == 35 and not r["failed"]


def regimes_agree_bitwise(device, dtype, H_q, H_kv, D, w, N):
    """One sequence of N positions through the attention op with deterministic=True as PT (every
    position has its output query), SFT (the last N/3), prefill (the last), chunked prefill (3
    chunks, the last with its output query) and decode (the last 4 positions one pair at a time),
    plus a ragged batch mixing them: every base row and output row equals PT's bitwise."""
    g = torch.Generator().manual_seed(77)
    q = torch.randn(N, H_q, D, generator=g).to(device=device, dtype=dtype)
    q_out = torch.randn(N, H_q, D, generator=g).to(device=device, dtype=dtype)
    k = torch.randn(1, N, H_kv, D, generator=g).to(device=device, dtype=dtype)
    v = torch.randn(1, N, H_kv, D, generator=g).to(device=device, dtype=dtype)
    i32 = lambda *xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731

    def run(P, T, T_out, kk=k, vv=v):
        return ot.attention(q[P:P + T].contiguous(), q_out[P + T - T_out:P + T].contiguous(), kk, vv, i32(0, T),
                            i32(0, T_out), i32(P + T), w, deterministic=True)

    o, o_out, lse, lse_out = run(0, N, N)
    checks = []
    sft = run(0, N, N // 3)
    checks += [("sft o", sft[0], o), ("sft o_out", sft[1], o_out[N - N // 3:]), ("sft lse", sft[2], lse)]
    pre = run(0, N, 1)
    checks += [("prefill o", pre[0], o), ("prefill o_out", pre[1], o_out[N - 1:])]
    a, b = N // 3, 2 * N // 3
    for P, T, T_out in ((0, a, 0), (a, b - a, 0), (b, N - b, 1)):
        r = run(P, T, T_out)
        checks.append((f"chunk at {P} o", r[0], o[P:P + T]))
        if T_out:
            checks.append((f"chunk at {P} o_out", r[1], o_out[P + T - 1:P + T]))
    for t in range(N - 4, N):
        r = run(t, 1, 1)
        checks += [(f"decode {t} o", r[0], o[t:t + 1]), (f"decode {t} o_out", r[1], o_out[t:t + 1]),
                   (f"decode {t} lse_out", r[3], lse_out[t:t + 1])]
    # ragged: [chunk 0..a-1 (no output), decode at N-1, SFT-like whole sequence with 5 outputs]
    kb = torch.cat([k, k, k]).contiguous()
    vb = torch.cat([v, v, v]).contiguous()
    rq = torch.cat([q[:a], q[N - 1:], q]).contiguous()
    rqo = torch.cat([q_out[N - 1:], q_out[N - 5:]]).contiguous()
    r = ot.attention(rq, rqo, kb, vb, ot.cu_seqlens([a, 1, N]), ot.cu_seqlens([0, 1, 5]), i32(a, N, N), w,
                     deterministic=True)
    checks += [("ragged seq 0", r[0][:a], o[:a]), ("ragged seq 1", r[0][a:a + 1], o[N - 1:]),
               ("ragged seq 1 out", r[1][:1], o_out[N - 1:]), ("ragged seq 2", r[0][a + 1:], o),
               ("ragged seq 2 out", r[1][1:], o_out[N - 5:])]
    for name, got, want in checks:
        assert torch.equal(got, want), f"{name}: not bitwise equal to PT (max diff {(got - want).abs().max()})"


def test_regimes_agree_bitwise_cpu():
    regimes_agree_bitwise("cpu", torch.float32, 4, 2, 16, 7, 40)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "f16", "f32"])
def test_deterministic_regimes_agree_bitwise_cuda(dtype):
    regimes_agree_bitwise("cuda", dtype, 32, 8, 128, 128, 1100)


@gpu
def test_decode_step_in_a_cuda_graph():
    """A pair-decode step of OrthrosAttention (B = 4, bf16) captured in a CUDA graph: replayed on new
    inputs from the same cache state it equals the eager step bitwise (deterministic mode)."""
    torch.manual_seed(3)
    layer = ot.OrthrosAttention(128, 8, 2, 64, 32, deterministic=True, dtype=torch.bfloat16, device="cuda")
    B, P = 4, 50
    cache = layer.new_cache(B, 128)
    prompt = torch.randn(B * P, 128, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        layer(prompt, prompt[:B].clone(), ot.cu_seqlens([P] * B), ot.cu_seqlens([1] * B), cache=cache)
        cu = ot.cu_seqlens([1] * B)
        x = torch.randn(B, 128, device="cuda", dtype=torch.bfloat16)
        x_out = torch.randn(B, 128, device="cuda", dtype=torch.bfloat16)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # warm-up off the capture (allocator, cuBLAS handle, lazy init)
            for _ in range(2):
                cache.lengths = [P] * B
                layer(x, x_out, cu, cu, cache=cache)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        cache.lengths = [P] * B
        with torch.cuda.graph(graph):
            y_g, y_out_g = layer(x, x_out, cu, cu, cache=cache)
        for trial in range(3):
            x.copy_(torch.randn_like(x))
            x_out.copy_(torch.randn_like(x_out))
            graph.replay()
            torch.cuda.synchronize()
            k_after = cache.k[:, P].clone()
            cache.lengths = [P] * B
            y, y_out = layer(x, x_out, cu, cu, cache=cache)
            assert torch.equal(y_g, y) and torch.equal(y_out_g, y_out), f"trial {trial}"
            assert torch.equal(k_after, cache.k[:, P]), f"trial {trial}: the replayed append"


@gpu
def test_cuda_call_rejects_a_cpu_tensor():
    c = _to(make_case("pt", 1, torch.float32), "cuda", torch.bfloat16)
    with pytest.raises(orthros.Error, match=r"k_cache is on cpu but the call runs on cuda"):
        ot.attention(c["q"], c["q_out"], c["k_cache"].cpu(), c["v_cache"], c["cu_seqlens_q"], c["cu_seqlens_out"],
                     c["cache_seqlens"], c["window"])
    with pytest.raises(orthros.Error, match=r"q must be bfloat16, float16, float32 on cuda \(got float64\)"):
        ot.attention(c["q"].double(), c["q_out"], c["k_cache"], c["v_cache"], c["cu_seqlens_q"], c["cu_seqlens_out"],
                     c["cache_seqlens"], c["window"])


@gpu
def test_training_step_on_cuda_matches_cpu_oracle_layer():
    """A training step's gradients on the GPU (f32) against the CPU op (the float64 oracle on the
    same weights): the float32 layer is within SPEC §6's f32 relative bound 1e-5 of float64."""
    torch.manual_seed(4)
    cpu = ot.OrthrosAttention(64, 4, 2, 16, 8, dtype=torch.float64)
    gpu_layer = ot.OrthrosAttention(64, 4, 2, 16, 8, dtype=torch.float32, device="cuda")
    gpu_layer.load_state_dict({k: v.float() for k, v in cpu.state_dict().items()})
    x = torch.randn(30, 64, dtype=torch.float64)
    x_out = torch.randn(30, 64, dtype=torch.float64)
    outs = []
    for layer, dev, dt in ((cpu, "cpu", torch.float64), (gpu_layer, "cuda", torch.float32)):
        xx = x.detach().to(dev, dt, copy=True).requires_grad_()  # a new leaf per iteration (.to may return x)
        y, y_out = layer(xx, x_out.to(dev, dt))
        (y.square().sum() + y_out.sum()).backward()
        outs.append([xx.grad.double().cpu()] + [p.grad.double().cpu() for p in layer.parameters()])
    for a, b in zip(*outs):
        rel = (b - a).norm() / a.norm()
        assert rel <= 1e-5, rel
    assert np.isfinite(outs[1][0].numpy()).all()
