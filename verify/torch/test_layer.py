"""OrthrosAttention and the layer ops on CPU: opcheck of orthros::layer, layer_backward and
layer_with_cache; the module's forward equals the oracle's layer (orthros.layer_forward)
bitwise and an independent float64 torch layer to rounding; gradients vs orthros.layer_backward
and by finite differences; chunked prefill and pair decode through OrthrosKVCache equal one
training-call forward; torch.compile(fullgraph=True) gives the eager result."""
import math

import pytest
import torch

import orthros
import orthros.torch as ot
from torch_cases import dense_reference

CONFIGS = {  # d_model, H_q, H_kv, D, window, qk_norm, theta
    "qknorm_gqa": (24, 4, 2, 8, 5, True, 1e4),
    "plain_mha": (16, 2, 2, 8, 3, False, 5e5),
    "tiny": (6, 2, 1, 4, 2, True, 1e4),  # for finite differences (every weight entry is perturbed)
}


def make_layer(cfg, seed, dtype=torch.float64):
    dm, Hq, Hkv, D, w, qk, theta = CONFIGS[cfg]
    torch.manual_seed(seed)
    layer = ot.OrthrosAttention(dm, Hq, Hkv, D, w, rope_theta=theta, qk_norm=qk, dtype=dtype)
    with torch.no_grad():  # away from the identity scale-offset, so a stream mix-up shows
        for p in (layer.alpha, layer.alpha_out):
            p.uniform_(0.5, 1.5)
        for p in (layer.beta, layer.beta_out):
            p.uniform_(-0.5, 0.5)
        if qk:
            layer.q_norm.uniform_(0.7, 1.3)
            layer.k_norm.uniform_(0.7, 1.3)
    return layer


def weights_dict(layer):
    return {n: (None if getattr(layer, n) is None else getattr(layer, n).detach().numpy())
            for n in ("w_q", "w_k", "w_v", "w_o", "alpha", "beta", "alpha_out", "beta_out", "q_norm", "k_norm")}


def cfg_kwargs(layer):
    return dict(num_q_heads=layer.num_q_heads, num_kv_heads=layer.num_kv_heads, head_dim=layer.head_dim,
                window=layer.window, rope_theta=layer.rope_theta, qk_norm=layer.qk_norm, rms_eps=layer.rms_eps)


def rand(seed, *shape, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def dense_layer(layer, x, x_out, T_out):
    """One training sequence through SPEC §2 written in plain float64 torch (not the oracle)."""
    Hq, Hkv, D, theta = layer.num_q_heads, layer.num_kv_heads, layer.head_dim, layer.rope_theta
    W = {n: (getattr(layer, n).detach().double() if getattr(layer, n) is not None else None)
         for n in ("w_q", "w_k", "w_v", "w_o", "alpha", "beta", "alpha_out", "beta_out", "q_norm", "k_norm")}
    T = x.shape[0]

    def norm(a, g, H):
        if not layer.qk_norm:
            return a
        h = a.reshape(a.shape[0], H, D)
        return (h / torch.sqrt((h * h).mean(-1, keepdim=True) + layer.rms_eps) * g).reshape(a.shape)

    def rope(a, pos, H):
        h = a.reshape(a.shape[0], H, D)
        ang = pos.double()[:, None, None] * theta ** (-2.0 * torch.arange(D // 2, dtype=torch.float64) / D)
        a1, a2 = h[..., :D // 2], h[..., D // 2:]
        return torch.cat([a1 * ang.cos() - a2 * ang.sin(), a2 * ang.cos() + a1 * ang.sin()], -1)

    x, x_out = x.double(), x_out.double()
    pos, pos_out = torch.arange(T), torch.arange(T - T_out, T)
    k = rope(norm(x @ W["w_k"], W["k_norm"], Hkv), pos, Hkv)
    v = (x @ W["w_v"]).reshape(T, Hkv, D)
    q = rope(W["alpha"] * norm(x @ W["w_q"], W["q_norm"], Hq) + W["beta"], pos, Hq)
    q_out = rope(W["alpha_out"] * norm(x_out @ W["w_q"], W["q_norm"], Hq) + W["beta_out"], pos_out, Hq)
    r = dense_reference(q, q_out, k[None], v[None], [(T, T_out, 0)], layer.window)
    return r["o"].reshape(T, -1) @ W["w_o"], r["o_out"].reshape(T_out, -1) @ W["w_o"]


@pytest.mark.parametrize("cfg", sorted(CONFIGS))
def test_layer_ops_opcheck(cfg):
    layer = make_layer(cfg, 1)
    dm = layer.d_model
    x, x_out = rand(2, 17, dm).requires_grad_(), rand(3, 6, dm).requires_grad_()
    cu, cu_out = ot.cu_seqlens([10, 7]), ot.cu_seqlens([4, 2])
    scal = (layer.num_q_heads, layer.num_kv_heads, layer.head_dim, layer.window, layer.rope_theta, layer.qk_norm,
            layer.rms_eps, False)
    torch.library.opcheck(torch.ops.orthros.layer.default, (x, x_out, *layer._weights(), cu, cu_out, *scal))
    dy, dy_out = rand(4, 17, dm), rand(5, 6, dm)
    ws = tuple(None if w is None else w.detach() for w in layer._weights())
    torch.library.opcheck(torch.ops.orthros.layer_backward.default,
                          (x.detach(), x_out.detach(), dy, dy_out, *ws, cu, cu_out, *scal))
    cache = layer.new_cache(2, 30)
    cache.k.copy_(rand(6, *cache.k.shape))
    cache.v.copy_(rand(7, *cache.v.shape))
    torch.library.opcheck(torch.ops.orthros.layer_with_cache.default,
                          (x.detach(), x_out.detach(), *ws, cache.k, cache.v, cu, cu_out,
                           torch.tensor([10 + 4, 7 + 11], dtype=torch.int32), *scal))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("cfg", sorted(CONFIGS))
def test_module_forward_is_the_oracle_layer(cfg, dtype):
    """Ragged training batch: y, y_out bitwise orthros.layer_forward (the C++ layer, layer.hpp)."""
    layer = make_layer(cfg, 2, dtype)
    lens, outs = [9, 1, 14], [9, 1, 3]
    x, x_out = rand(8, sum(lens), layer.d_model, dtype=dtype), rand(9, sum(outs), layer.d_model, dtype=dtype)
    y, y_out = layer(x, x_out, ot.cu_seqlens(lens), ot.cu_seqlens(outs))
    empty = [torch.empty(0, layer.num_kv_heads, layer.head_dim, dtype=dtype).numpy()] * 3
    r = orthros.layer_forward(x.numpy(), x_out.numpy(), weights_dict(layer), empty, empty, lens, outs,
                              **cfg_kwargs(layer))
    assert y.dtype == dtype
    assert torch.equal(y, torch.from_numpy(r["y"])) and torch.equal(y_out, torch.from_numpy(r["y_out"]))


@pytest.mark.parametrize("cfg", sorted(CONFIGS))
def test_module_forward_matches_dense_layer(cfg):
    """float64 vs the plain-torch layer above: rounding only (~1e-15 relative per stage, a few
    dozen stages); 1e-11 keeps a wide margin and any stage mistake (positions, norms, streams)
    moves outputs by O(0.1)."""
    layer = make_layer(cfg, 3)
    x, x_out = rand(10, 19, layer.d_model), rand(11, 5, layer.d_model)
    y, y_out = layer(x, x_out)
    ry, ry_out = dense_layer(layer, x, x_out, 5)
    torch.testing.assert_close(y, ry, rtol=1e-11, atol=1e-11)
    torch.testing.assert_close(y_out, ry_out, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("cfg", sorted(CONFIGS))
def test_module_gradients_are_the_oracle_layer_backward(cfg, dtype):
    layer = make_layer(cfg, 4, dtype)
    lens, outs = [8, 12], [8, 2]
    x = rand(12, 20, layer.d_model, dtype=dtype).requires_grad_()
    x_out = rand(13, 10, layer.d_model, dtype=dtype).requires_grad_()
    y, y_out = layer(x, x_out, ot.cu_seqlens(lens), ot.cu_seqlens(outs))
    dy, dy_out = rand(14, *y.shape, dtype=dtype), rand(15, *y_out.shape, dtype=dtype)
    ((y * dy).sum() + (y_out * dy_out).sum()).backward()
    r = orthros.layer_backward(x.detach().numpy(), x_out.detach().numpy(), weights_dict(layer), dy.numpy(),
                               dy_out.numpy(), lens, outs, **cfg_kwargs(layer))
    assert torch.equal(x.grad, torch.from_numpy(r["dx"])) and torch.equal(x_out.grad, torch.from_numpy(r["dx_out"]))
    for n, p in layer.named_parameters():
        assert torch.equal(p.grad, torch.from_numpy(r[n])), n


@pytest.mark.parametrize("cfg", ["tiny", "plain_mha"])
def test_module_gradcheck(cfg):
    """Finite differences of the whole layer (float64), inputs and every parameter."""
    layer = make_layer(cfg, 5)
    x = rand(16, 7, layer.d_model).requires_grad_()
    x_out = rand(17, 3, layer.d_model).requires_grad_()
    params = [p for p in layer.parameters()]
    names = [n for n, _ in layer.named_parameters()]

    def f(x, x_out, *ps):
        return torch.func.functional_call(layer, dict(zip(names, ps)), (x, x_out, ot.cu_seqlens([4, 3]),
                                                                          ot.cu_seqlens([2, 1])))

    assert torch.autograd.gradcheck(f, (x, x_out, *params), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("cfg", sorted(CONFIGS))
def test_chunked_prefill_and_pair_decode_through_the_cache(cfg):
    """Prefill in chunks, then pair decode steps: each step's y_out and the cache equal the ones
    of a single training call over the whole sequence (the oracle's regimes agree bitwise, SPEC
    §4.2), for two sequences in one ragged batch."""
    layer = make_layer(cfg, 6)
    dm, N = layer.d_model, 15
    xs = [rand(20 + b, N, dm) for b in range(2)]
    xs_out = [rand(30 + b, N, dm) for b in range(2)]  # an output token per position
    full = [layer(xs[b], xs_out[b]) for b in range(2)]  # PT: every position has its output token
    cache = layer.new_cache(2, N + 2)
    with torch.no_grad():
        # chunks: seq 0 = 4 + 6 rows, seq 1 = 7 + 3 rows; the last chunk has one output token
        for sizes, last in (((4, 7), False), ((6, 3), True)):
            x = torch.cat([xs[b][cache.lengths[b]:cache.lengths[b] + sizes[b]] for b in range(2)])
            x_out = torch.cat([xs_out[b][cache.lengths[b] + sizes[b] - 1:cache.lengths[b] + sizes[b]]
                               for b in range(2)]) if last else x.new_empty(0, dm)
            starts = list(cache.lengths)
            y, y_out = layer(x, x_out, ot.cu_seqlens(list(sizes)), ot.cu_seqlens([int(last)] * 2), cache=cache)
            for b in range(2):
                row0 = sum(sizes[:b])
                assert torch.equal(y[row0:row0 + sizes[b]], full[b][0][starts[b]:starts[b] + sizes[b]]), (b, sizes)
                if last:
                    assert torch.equal(y_out[b], full[b][1][starts[b] + sizes[b] - 1])
        for _ in range(3):  # pair decode: one base token and its output token per sequence
            t = list(cache.lengths)
            x = torch.stack([xs[b][t[b]] for b in range(2)])
            x_out = torch.stack([xs_out[b][t[b]] for b in range(2)])
            y, y_out = layer(x, x_out, ot.cu_seqlens([1, 1]), ot.cu_seqlens([1, 1]), cache=cache)
            for b in range(2):
                assert torch.equal(y[b], full[b][0][t[b]]) and torch.equal(y_out[b], full[b][1][t[b]]), (b, t)
    assert cache.lengths == [13, 13]


def test_cache_path_refuses_grad_and_overflow():
    layer = make_layer("plain_mha", 7)
    cache = layer.new_cache(1, 4)
    x = rand(1, 3, layer.d_model)
    with pytest.raises(orthros.Error, match="no backward.*torch.no_grad"):
        layer(x, x[:1], cache=cache)
    with torch.no_grad():
        layer(x, x[:1], cache=cache)
        with pytest.raises(orthros.Error, match="3 cached \\+ 3 new positions exceed the cache capacity 4"):
            layer(x, x[:1], cache=cache)
    assert cache.lengths == [3]


class _TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = make_layer("qknorm_gqa", 8), make_layer("qknorm_gqa", 9)

    def forward(self, x, x_out, cu, cu_out):
        y, y_out = self.a(x, x_out, cu, cu_out)
        y, y_out = self.b(x + y, x_out + y_out, cu, cu_out)
        q = y.reshape(y.shape[0], 4, 6)  # the bare attention op on the layer's output (d_model 24 = 4 x 6)
        k = q[None, :, :2].contiguous()
        o, o_out, _, _ = ot.attention(q.contiguous(), q[:2].contiguous(), k, k,
                                      torch.tensor([0, y.shape[0]], dtype=torch.int32),
                                      torch.tensor([0, 2], dtype=torch.int32),
                                      torch.tensor([y.shape[0]], dtype=torch.int32), 3)
        return o.sum() + o_out.square().sum() + y_out.sum()


# inductor compiles C++ kernels for the glue: ~2 minutes on a 2-core CI machine, so it is marked
# `slow` (left out of ctest, run with `-m slow` or on the GPU machine); aot_eager traces the same
# graph through dynamo (fullgraph), the fake implementations and AOT autograd in seconds.
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_torch_compile_fullgraph_equals_eager(backend):
    """torch.compile(fullgraph=True) of a module using the layer and attention ops: the loss and
    every gradient equal eager mode's bitwise (the ops are opaque to the compiler; only the glue
    around them is compiled, and it is elementwise adds and sums of a few dozen values, which
    inductor may reorder: compared to 1e-12 relative in float64 there)."""
    torch._dynamo.reset()
    m = _TwoLayers()
    x, x_out = rand(40, 9, 24).requires_grad_(), rand(41, 2, 24).requires_grad_()
    cu, cu_out = ot.cu_seqlens([9]), ot.cu_seqlens([2])
    eager = m(x, x_out, cu, cu_out)
    ge = torch.autograd.grad(eager, [x, x_out, *m.parameters()])
    cm = torch.compile(m, fullgraph=True, backend=backend)
    comp = cm(x, x_out, cu, cu_out)
    gc = torch.autograd.grad(comp, [x, x_out, *m.parameters()])
    tol = dict(rtol=0, atol=0) if backend == "aot_eager" else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(comp, eager, **tol)
    for a, b in zip(gc, ge):
        torch.testing.assert_close(a, b, **tol)
