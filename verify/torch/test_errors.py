"""Bad input from Python raises orthros.Error (a ValueError) naming the argument and the values,
before any oracle or kernel call: wrong dtype, non-contiguous, a tensor on the wrong device,
wrong cu_seqlens / cache_seqlens, mismatched heads, window 0 / 2.5, bad layer arguments."""
import pytest
import torch

import orthros
import orthros.torch as ot
from torch_cases import make_case, op_args


def call(c, **over):
    a = dict(zip(("q", "q_out", "k_cache", "v_cache", "cu_seqlens_q", "cu_seqlens_out", "cache_seqlens", "window"),
                 op_args(c)))
    a.update(over)
    return ot.attention(**a)


@pytest.fixture
def c():
    return make_case("ragged", 3, torch.float32)


@pytest.mark.parametrize("over, match", [
    (lambda c: dict(window=0), r"window must be >= 1 .*got 0"),
    (lambda c: dict(window=2.5), r"window must be an int >= 1 .*got 2.5 \(float\)"),
    (lambda c: dict(window=True), r"window must be an int"),
    (lambda c: dict(q=c["q"].half()), r"q must be float32, float64 on cpu \(got float16\)"),
    (lambda c: dict(q=c["q"].double()), r"q_out has dtype float32 but q has float64"),
    (lambda c: dict(k_cache=c["k_cache"].transpose(1, 2).contiguous().transpose(1, 2)),
     r"k_cache must be contiguous \(shape \[4, 34, 2, 16\], strides"),
    (lambda c: dict(q=c["q"][:, :2].contiguous()), r"q_out has shape \[17, 4, 16\]; expected \[sum T_out_b, H_q = 2, D = 16\]"),
    (lambda c: dict(q=c["q"].reshape(39, 8, 8).contiguous(), q_out=c["q_out"].reshape(17, 8, 8).contiguous()),
     r"k_cache has shape \[4, 34, 2, 16\]; expected \[B, capacity, H_kv, D = 8\]"),
    (lambda c: dict(k_cache=c["k_cache"][:, :, :1].contiguous()), r"v_cache has shape .* expected k_cache's"),
    (lambda c: dict(k_cache=torch.zeros(4, 34, 3, 16), v_cache=torch.zeros(4, 34, 3, 16)),
     r"num_q_heads \(q axis 1\) = 4 must be a positive multiple of num_kv_heads \(k_cache axis 2\) = 3"),
    (lambda c: dict(cu_seqlens_q=c["cu_seqlens_q"].long()), r"cu_seqlens_q must be int32 \(got int64\)"),
    (lambda c: dict(cu_seqlens_q=torch.tensor([0, 13, 14, 22, 40], dtype=torch.int32)),
     r"cu_seqlens_q\[-1\] = 40 must equal the rows of q \(39\)"),
    (lambda c: dict(cu_seqlens_q=torch.tensor([1, 13, 14, 22, 39], dtype=torch.int32)), r"cu_seqlens_q\[0\] must be 0"),
    (lambda c: dict(cu_seqlens_q=torch.tensor([0, 13, 12, 22, 39], dtype=torch.int32)),
     r"cu_seqlens_q must be non-decreasing; cu_seqlens_q\[2\] = 12 < cu_seqlens_q\[1\] = 13"),
    (lambda c: dict(cu_seqlens_out=torch.tensor([0, 13, 14, 17], dtype=torch.int32)),
     r"cu_seqlens_out must have 5 entries; got 4"),
    (lambda c: dict(cu_seqlens_out=torch.tensor([0, 2, 4, 4, 17], dtype=torch.int32)),
     r"sequence 1: T_out = 2 \(cu_seqlens_out\) exceeds T = 1"),
    (lambda c: dict(cache_seqlens=torch.tensor([13, 31, 13, 10], dtype=torch.int32)),
     r"cache_seqlens\[3\] = 10 must be >= T_3 = 17"),
    (lambda c: dict(cache_seqlens=torch.tensor([13, 31, 13, 35], dtype=torch.int32)),
     r"cache_seqlens\[3\] = 35 exceeds the cache capacity 34"),
    (lambda c: dict(k_cache=c["k_cache"][:3].contiguous(), v_cache=c["v_cache"][:3].contiguous()),
     r"cu_seqlens_q describes B = 4 sequences but k_cache has B = 3"),
    (lambda c: dict(q=c["q"][None]), r"q must be a 3-d tensor; got shape \[1, 39, 4, 16\]"),
    (lambda c: dict(q=c["q"].numpy()), r"q must be a torch.Tensor \(got ndarray\)"),
])
def test_attention_rejects(c, over, match):
    with pytest.raises(orthros.Error, match=match):
        call(c, **over(c))


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf"), "0.5"])
def test_attention_rejects_scale(c, scale):
    with pytest.raises(orthros.Error, match="scale must be None or a finite float > 0"):
        call(c, scale=scale)


def test_import_orthros_does_not_import_torch():
    """`import orthros` works without torch: it never imports it (orthros.torch does, on request)."""
    import subprocess
    import sys
    code = "import sys, orthros, orthros.testing; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_error_is_a_value_error():
    assert issubclass(orthros.Error, ValueError) and ot.Error is orthros.Error


def test_rope_append_kv_rejects():
    c = make_case("ragged", 4, torch.float32)
    k_new = torch.randn(39, 2, 16)
    with pytest.raises(orthros.Error, match=r"v_new has shape \[39, 2, 8\]; expected k_new's"):
        ot.rope_append_kv(k_new, torch.randn(39, 2, 8), c["k_cache"], c["v_cache"], c["cu_seqlens_q"],
                          c["cache_seqlens"])
    with pytest.raises(orthros.Error, match=r"k_cache has shape \[4, 34, 2, 16\]; expected \[B, capacity, H_kv = 1"):
        ot.rope_append_kv(k_new[:, :1].contiguous(), k_new[:, :1].contiguous(), c["k_cache"], c["v_cache"],
                          c["cu_seqlens_q"], c["cache_seqlens"])
    with pytest.raises(orthros.Error, match="q_out is given but cu_seqlens_out is not"):
        ot.rope_append_kv(k_new, k_new, c["k_cache"], c["v_cache"], c["cu_seqlens_q"], c["cache_seqlens"],
                          q=c["q"], q_out=c["q_out"])
    with pytest.raises(orthros.Error, match="theta must be >= 0.0; got -1.0"):
        ot.rope_append_kv(k_new, k_new, c["k_cache"], c["v_cache"], c["cu_seqlens_q"], c["cache_seqlens"],
                          theta=-1.0)
    with pytest.raises(orthros.Error, match="q_out is given without q"):
        ot.rope_append_kv(k_new, k_new, c["k_cache"], c["v_cache"], c["cu_seqlens_q"], c["cache_seqlens"],
                          q_out=c["q_out"], cu_seqlens_out=c["cu_seqlens_out"])
    with pytest.raises(orthros.Error, match="theta must be a finite float"):
        ot.rope_append_kv(k_new, k_new, c["k_cache"], c["v_cache"], c["cu_seqlens_q"], c["cache_seqlens"],
                          theta=float("nan"))
    with pytest.raises(orthros.Error, match="position_offset must be an int >= 0; got -1"):
        ot.rope_append_kv(k_new, k_new, c["k_cache"], c["v_cache"], c["cu_seqlens_q"], c["cache_seqlens"],
                          position_offset=-1)
    before = c["k_cache"].clone()
    with pytest.raises(orthros.Error, match=r"cache_seqlens\[0\] = 2 must be >= T_0 = 13"):
        ot.rope_append_kv(k_new, k_new, c["k_cache"], c["v_cache"], c["cu_seqlens_q"],
                          torch.tensor([2, 31, 13, 26], dtype=torch.int32))
    assert torch.equal(before, c["k_cache"])  # nothing written on error


def test_layer_rejects():
    with pytest.raises(orthros.Error, match="window must be >= 1"):
        ot.OrthrosAttention(16, 2, 2, 8, 0)
    with pytest.raises(orthros.Error, match=r"window must be an int >= 1 .*got 2.5"):
        ot.OrthrosAttention(16, 2, 2, 8, 2.5)
    with pytest.raises(orthros.Error, match="num_q_heads = 3 must be a multiple of num_kv_heads = 2"):
        ot.OrthrosAttention(16, 3, 2, 8, 4)
    with pytest.raises(orthros.Error, match="head_dim must be even for RoPE; got 7"):
        ot.OrthrosAttention(14, 2, 2, 7, 4)
    with pytest.raises(orthros.Error, match="rope_theta must be > 0"):
        ot.OrthrosAttention(16, 2, 2, 8, 4, rope_theta=0.0)
    layer = ot.OrthrosAttention(16, 2, 2, 8, 4, dtype=torch.float32)
    x = torch.randn(5, 16)
    with pytest.raises(orthros.Error, match=r"x_out has shape \[2, 12\]; expected \[sum T_out_b, d_model = 16\]"):
        layer(x, torch.randn(2, 12))
    with pytest.raises(orthros.Error, match="x_out has dtype float64 but x has float32"):
        layer(x, torch.randn(2, 16, dtype=torch.float64))
    with pytest.raises(orthros.Error, match=r"w_q has dtype float32 but x has float64|x must be"):
        layer(x.double(), x[:2].double())
    with pytest.raises(orthros.Error, match=r"x must be contiguous"):
        layer(torch.randn(16, 5).T, x[:2])
    with pytest.raises(orthros.Error, match=r"cu_seqlens_q\[-1\] = 4 must equal the rows of q \(5\)"):
        layer(x, x[:2], torch.tensor([0, 4], dtype=torch.int32), torch.tensor([0, 2], dtype=torch.int32))
    with pytest.raises(orthros.Error, match=r"cache must be an OrthrosKVCache"):
        layer(x, x[:2], cache=object())


def test_cpu_call_of_a_bf16_tensor_names_the_cpu_dtypes():
    c = make_case("pt", 1, torch.float32)
    with pytest.raises(orthros.Error, match=r"q must be float32, float64 on cpu \(got bfloat16\)"):
        call(c, q=c["q"].bfloat16(), q_out=c["q_out"].bfloat16(), k_cache=c["k_cache"].bfloat16(),
             v_cache=c["v_cache"].bfloat16())
