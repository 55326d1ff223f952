"""The Orthros attention layer (SPEC §2; paper Algorithm 1) as PyTorch custom ops:

- orthros::layer: a training call (every KV cache empty, P_b = 0: PT or SFT) over a ragged batch,
  functional, differentiable through orthros::layer_backward (the forward recomputed there);
- orthros::layer_with_cache: prefill, chunked prefill and (pair) decode over a KV cache
  [B, capacity, H_kv, D], writing this call's keys/values into it (mutates k_cache, v_cache;
  not differentiable).

CPU: the oracle's layer (orthros.layer_forward / orthros.layer_backward, float32/float64).
CUDA: orthros._cuda's layer_forward / layer_backward (cuBLAS projections, fused RoPE append).
The softmax scale is 1/sqrt(D) (the layer's, SPEC §2).
"""
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .. import _core
from . import _checks as C
from ._cuda_backend import cuda_module, device_guard, dlpack, stream_of, workspace

Error = _core.Error

WEIGHT_NAMES = ("w_q", "w_k", "w_v", "w_o", "alpha", "beta", "alpha_out", "beta_out", "q_norm", "k_norm")


def _config(num_q_heads, num_kv_heads, head_dim, window, rope_theta, qk_norm, rms_eps):
    return dict(num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, window=window,
                rope_theta=rope_theta, qk_norm=qk_norm, rms_eps=rms_eps)


def check_layer_args(x, x_out, weights, cfg):
    """Shapes, dtypes, devices and contiguity of a layer call's activations and weights (no data read)."""
    dev = x.device
    dts = C.activation_dtypes(dev)
    C.check_tensor(x, "x", 2, dev, dts)
    C.check_tensor(x_out, "x_out", 2, dev, dts)
    C.check_same_dtype(x, "x", (x_out, "x_out"))
    Hq, Hkv, D = cfg["num_q_heads"], cfg["num_kv_heads"], cfg["head_dim"]
    if Hq < 1 or Hkv < 1 or Hq % Hkv or D < 2 or D % 2:
        raise Error(f"need H_q a positive multiple of H_kv and an even head_dim >= 2 (got H_q = {Hq}, H_kv = {Hkv}, "
                    f"D = {D})")
    dm = x.shape[1]
    if x_out.shape[1] != dm:
        raise Error(f"x_out has shape {C.shape(x_out)}; expected [sum T_out_b, d_model = {dm}] (x is {C.shape(x)})")
    d, dkv = Hq * D, Hkv * D
    expect = {"w_q": (dm, d), "w_k": (dm, dkv), "w_v": (dm, dkv), "w_o": (d, dm), "alpha": (d,), "beta": (d,),
              "alpha_out": (d,), "beta_out": (d,), "q_norm": (D,), "k_norm": (D,)}
    for n in WEIGHT_NAMES:
        w = weights[n]
        if w is None:
            if n in ("q_norm", "k_norm") and not cfg["qk_norm"]:
                continue
            raise Error(f"{n} is required (qk_norm = {cfg['qk_norm']})")
        C.check_tensor(w, n, len(expect[n]), dev, dts)
        if tuple(w.shape) != expect[n]:
            raise Error(f"{n} has shape {C.shape(w)}; expected {list(expect[n])} (d_model {dm}, H_q {Hq}, H_kv {Hkv}, "
                        f"D {D})")
        C.check_same_dtype(x, "x", (w, n))


def _numpy_weights(weights):
    return {n: (None if w is None else w.detach().numpy()) for n, w in weights.items()}


def _weights(w_q, w_k, w_v, w_o, alpha, beta, alpha_out, beta_out, q_norm, k_norm):
    return dict(zip(WEIGHT_NAMES, (w_q, w_k, w_v, w_o, alpha, beta, alpha_out, beta_out, q_norm, k_norm)))


def _capsules(tensors):
    """name -> DLPack capsule (None stays None) of a dict of tensors, for orthros._cuda."""
    return {n: dlpack(t) for n, t in tensors.items()}


def _cuda_config(x, cfg, deterministic):
    return dict(dtype=C.CUDA_DTYPE_NAMES[x.dtype], d_model=x.shape[1], scale=None, deterministic=deterministic,
                num_splits=0, **cfg)


def _forward_cuda(x, x_out, weights, k_cache, v_cache, q_lens, out_lens, cache_lens, cfg, deterministic):
    cu = cuda_module()
    y, y_out = torch.empty_like(x), torch.empty_like(x_out)
    has_out = x_out.shape[0] > 0
    lc = _cuda_config(x, cfg, deterministic)
    with device_guard(x.device):
        nbytes = cu.layer_workspace_bytes(**lc, q_lens=q_lens, out_lens=out_lens, cache_lens=cache_lens)
        cu.layer_forward(**lc, x=dlpack(x), x_out=dlpack(x_out) if has_out else None, **_capsules(weights),
                         k_cache=dlpack(k_cache), v_cache=dlpack(v_cache), y=dlpack(y),
                         y_out=dlpack(y_out) if has_out else None, workspace=dlpack(workspace(nbytes, x.device)),
                         q_lens=q_lens, out_lens=out_lens, cache_lens=cache_lens, stream=stream_of(x.device))
    return y, y_out


# ---- orthros::layer (training, P = 0) ---------------------------------------------------

@torch.library.custom_op("orthros::layer", mutates_args=())
def layer_op(x: Tensor, x_out: Tensor, w_q: Tensor, w_k: Tensor, w_v: Tensor, w_o: Tensor, alpha: Tensor,
             beta: Tensor, alpha_out: Tensor, beta_out: Tensor, q_norm: Optional[Tensor], k_norm: Optional[Tensor],
             cu_seqlens_q: Tensor, cu_seqlens_out: Tensor, num_q_heads: int, num_kv_heads: int, head_dim: int,
             window: int, rope_theta: float, qk_norm: bool, rms_eps: float,
             deterministic: bool) -> Tuple[Tensor, Tensor]:
    cfg = _config(num_q_heads, num_kv_heads, head_dim, window, rope_theta, qk_norm, rms_eps)
    weights = _weights(w_q, w_k, w_v, w_o, alpha, beta, alpha_out, beta_out, q_norm, k_norm)
    check_layer_args(x, x_out, weights, cfg)
    q_lens, out_lens, cache_lens = C.lengths(cu_seqlens_q, cu_seqlens_out, None, x.shape[0], x_out.shape[0])
    if x.device.type == "cuda":
        B, cap = len(q_lens), max(q_lens + [1])
        Hkv, D = num_kv_heads, head_dim
        k_cache = torch.empty((B, cap, Hkv, D), dtype=x.dtype, device=x.device)  # scratch: the call's own keys
        v_cache = torch.empty_like(k_cache)
        return _forward_cuda(x, x_out, weights, k_cache, v_cache, q_lens, out_lens, cache_lens, cfg, deterministic)
    H_kv, D = num_kv_heads, head_dim
    empty = [x.new_empty((0, H_kv, D)).numpy() for _ in q_lens]
    r = _core.layer_forward(x.detach().numpy(), x_out.detach().numpy(), _numpy_weights(weights), empty, empty, q_lens,
                            out_lens, **cfg)
    return torch.from_numpy(r["y"]), torch.from_numpy(r["y_out"])


@layer_op.register_fake
def _layer_fake(x, x_out, w_q, w_k, w_v, w_o, alpha, beta, alpha_out, beta_out, q_norm, k_norm, cu_seqlens_q,
                cu_seqlens_out, num_q_heads, num_kv_heads, head_dim, window, rope_theta, qk_norm, rms_eps,
                deterministic):
    cfg = _config(num_q_heads, num_kv_heads, head_dim, window, rope_theta, qk_norm, rms_eps)
    check_layer_args(x, x_out, _weights(w_q, w_k, w_v, w_o, alpha, beta, alpha_out, beta_out, q_norm, k_norm), cfg)
    return x.new_empty(x.shape), x_out.new_empty(x_out.shape)


@torch.library.custom_op("orthros::layer_backward", mutates_args=())
def layer_backward_op(x: Tensor, x_out: Tensor, dy: Tensor, dy_out: Tensor, w_q: Tensor, w_k: Tensor, w_v: Tensor,
                      w_o: Tensor, alpha: Tensor, beta: Tensor, alpha_out: Tensor, beta_out: Tensor,
                      q_norm: Optional[Tensor], k_norm: Optional[Tensor], cu_seqlens_q: Tensor,
                      cu_seqlens_out: Tensor, num_q_heads: int, num_kv_heads: int, head_dim: int, window: int,
                      rope_theta: float, qk_norm: bool, rms_eps: float, deterministic: bool) -> List[Tensor]:
    """Returns [dx, dx_out, dw_q, dw_k, dw_v, dw_o, dalpha, dbeta, dalpha_out, dbeta_out, dq_norm, dk_norm]
    (dq_norm/dk_norm zeros [D] when qk_norm is off)."""
    cfg = _config(num_q_heads, num_kv_heads, head_dim, window, rope_theta, qk_norm, rms_eps)
    weights = _weights(w_q, w_k, w_v, w_o, alpha, beta, alpha_out, beta_out, q_norm, k_norm)
    check_layer_args(x, x_out, weights, cfg)
    for t, n, like in ((dy, "dy", x), (dy_out, "dy_out", x_out)):
        C.check_tensor(t, n, 2, x.device, C.activation_dtypes(x.device))
        C.check_same_dtype(x, "x", (t, n))
        if t.shape != like.shape:
            raise Error(f"{n} has shape {C.shape(t)}; expected {C.shape(like)}")
    q_lens, out_lens, cache_lens = C.lengths(cu_seqlens_q, cu_seqlens_out, None, x.shape[0], x_out.shape[0])
    D = head_dim
    if x.device.type == "cuda":
        cu = cuda_module()
        grads = [torch.empty_like(x), torch.empty_like(x_out)] + [torch.empty_like(weights[n]) for n in WEIGHT_NAMES[:8]]
        grads += [x.new_zeros((D,)), x.new_zeros((D,))]
        has_out = x_out.shape[0] > 0
        g = dict(zip(("dx", "dx_out", "dw_q", "dw_k", "dw_v", "dw_o", "dalpha", "dbeta", "dalpha_out", "dbeta_out",
                      "dq_norm", "dk_norm"), grads))
        if not has_out:
            g["dx_out"] = None
        if not qk_norm:
            g["dq_norm"] = g["dk_norm"] = None
        lc = _cuda_config(x, cfg, deterministic)
        with device_guard(x.device):
            nbytes = cu.layer_backward_workspace_bytes(**lc, q_lens=q_lens, out_lens=out_lens, cache_lens=cache_lens)
            cu.layer_backward(**lc, x=dlpack(x), x_out=dlpack(x_out) if has_out else None, dy=dlpack(dy),
                              dy_out=dlpack(dy_out) if has_out else None, **_capsules(weights), **_capsules(g),
                              workspace=dlpack(workspace(nbytes, x.device)), q_lens=q_lens, out_lens=out_lens,
                              cache_lens=cache_lens, stream=stream_of(x.device))
        return grads
    r = _core.layer_backward(x.detach().numpy(), x_out.detach().numpy(), _numpy_weights(weights), dy.detach().numpy(),
                             dy_out.detach().numpy(), q_lens, out_lens, **cfg)
    return [torch.from_numpy(r["dx"]), torch.from_numpy(r["dx_out"])] + [torch.from_numpy(r[n]) for n in WEIGHT_NAMES]


@layer_backward_op.register_fake
def _layer_backward_fake(x, x_out, dy, dy_out, w_q, w_k, w_v, w_o, alpha, beta, alpha_out, beta_out, q_norm, k_norm,
                         cu_seqlens_q, cu_seqlens_out, num_q_heads, num_kv_heads, head_dim, window, rope_theta,
                         qk_norm, rms_eps, deterministic):
    ws = (w_q, w_k, w_v, w_o, alpha, beta, alpha_out, beta_out)
    return [x.new_empty(x.shape), x_out.new_empty(x_out.shape)] + [w.new_empty(w.shape) for w in ws] + \
        [x.new_empty((head_dim,)), x.new_empty((head_dim,))]


def _layer_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:14])  # x, x_out, the ten weights, cu_seqlens_q, cu_seqlens_out
    ctx.scalars = inputs[14:]


def _layer_grad(ctx, dy, dy_out):
    x, x_out, *ws, cu_q, cu_out = ctx.saved_tensors
    g = layer_backward_op(x, x_out, dy.contiguous(), dy_out.contiguous(), *ws, cu_q, cu_out, *ctx.scalars)
    dq_norm = g[10] if ws[8] is not None else None
    dk_norm = g[11] if ws[9] is not None else None
    return tuple(g[:10]) + (dq_norm, dk_norm) + (None,) * 10


layer_op.register_autograd(_layer_grad, setup_context=_layer_setup_context)


# ---- orthros::layer_with_cache (inference) ------------------------------------------------

@torch.library.custom_op("orthros::layer_with_cache", mutates_args=("k_cache", "v_cache"))
def layer_with_cache_op(x: Tensor, x_out: Tensor, w_q: Tensor, w_k: Tensor, w_v: Tensor, w_o: Tensor, alpha: Tensor,
                        beta: Tensor, alpha_out: Tensor, beta_out: Tensor, q_norm: Optional[Tensor],
                        k_norm: Optional[Tensor], k_cache: Tensor, v_cache: Tensor, cu_seqlens_q: Tensor,
                        cu_seqlens_out: Tensor, cache_seqlens: Tensor, num_q_heads: int, num_kv_heads: int,
                        head_dim: int, window: int, rope_theta: float, qk_norm: bool, rms_eps: float,
                        deterministic: bool) -> Tuple[Tensor, Tensor]:
    cfg = _config(num_q_heads, num_kv_heads, head_dim, window, rope_theta, qk_norm, rms_eps)
    weights = _weights(w_q, w_k, w_v, w_o, alpha, beta, alpha_out, beta_out, q_norm, k_norm)
    _check_cache_args(x, x_out, weights, k_cache, v_cache, cfg)
    q_lens, out_lens, cache_lens = C.lengths(cu_seqlens_q, cu_seqlens_out, cache_seqlens, x.shape[0], x_out.shape[0],
                                             k_cache.shape[1])
    if len(q_lens) != k_cache.shape[0]:
        raise Error(f"cu_seqlens_q describes B = {len(q_lens)} sequences but k_cache has B = {k_cache.shape[0]}")
    if x.device.type == "cuda":
        return _forward_cuda(x, x_out, weights, k_cache, v_cache, q_lens, out_lens, cache_lens, cfg, deterministic)
    prefix_k = [k_cache[b, :L - T].numpy() for b, (T, L) in enumerate(zip(q_lens, cache_lens))]
    prefix_v = [v_cache[b, :L - T].numpy() for b, (T, L) in enumerate(zip(q_lens, cache_lens))]
    r = _core.layer_forward(x.detach().numpy(), x_out.detach().numpy(), _numpy_weights(weights), prefix_k, prefix_v,
                            q_lens, out_lens, **cfg)
    for b, (T, L) in enumerate(zip(q_lens, cache_lens)):
        k_cache[b, L - T:L] = torch.from_numpy(r["k_caches"][b][L - T:L])
        v_cache[b, L - T:L] = torch.from_numpy(r["v_caches"][b][L - T:L])
    return torch.from_numpy(r["y"]), torch.from_numpy(r["y_out"])


def _check_cache_args(x, x_out, weights, k_cache, v_cache, cfg):
    check_layer_args(x, x_out, weights, cfg)
    dts = C.activation_dtypes(x.device)
    C.check_tensor(k_cache, "k_cache", 4, x.device, dts)
    C.check_tensor(v_cache, "v_cache", 4, x.device, dts)
    C.check_same_dtype(x, "x", (k_cache, "k_cache"), (v_cache, "v_cache"))
    H_kv, D = cfg["num_kv_heads"], cfg["head_dim"]
    if k_cache.shape[2] != H_kv or k_cache.shape[3] != D:
        raise Error(f"k_cache has shape {C.shape(k_cache)}; expected [B, capacity, H_kv = {H_kv}, D = {D}]")
    if v_cache.shape != k_cache.shape:
        raise Error(f"v_cache has shape {C.shape(v_cache)}; expected k_cache's {C.shape(k_cache)}")


@layer_with_cache_op.register_fake
def _layer_with_cache_fake(x, x_out, w_q, w_k, w_v, w_o, alpha, beta, alpha_out, beta_out, q_norm, k_norm, k_cache,
                           v_cache, cu_seqlens_q, cu_seqlens_out, cache_seqlens, num_q_heads, num_kv_heads, head_dim,
                           window, rope_theta, qk_norm, rms_eps, deterministic):
    cfg = _config(num_q_heads, num_kv_heads, head_dim, window, rope_theta, qk_norm, rms_eps)
    _check_cache_args(x, x_out, _weights(w_q, w_k, w_v, w_o, alpha, beta, alpha_out, beta_out, q_norm, k_norm),
                      k_cache, v_cache, cfg)
    return x.new_empty(x.shape), x_out.new_empty(x_out.shape)


def check_layer_scalars(num_q_heads, num_kv_heads, head_dim, window, rope_theta, qk_norm, rms_eps, deterministic):
    """The layer ops' Python scalars (types and ranges), before the op is called."""
    for v, n in ((num_q_heads, "num_q_heads"), (num_kv_heads, "num_kv_heads"), (head_dim, "head_dim")):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise Error(f"{n} must be an int >= 1; got {v!r}")
    C.check_window(window)
    C.check_float(rope_theta, "rope_theta", 0.0, strictly=True)
    C.check_float(rms_eps, "rms_eps", 0.0)
    for v, n in ((qk_norm, "qk_norm"), (deterministic, "deterministic")):
        if not isinstance(v, bool):
            raise Error(f"{n} must be a bool; got {v!r}")
