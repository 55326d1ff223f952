"""The attention operator and the cache append as PyTorch custom ops (torch.library.custom_op):
orthros::attention, orthros::attention_backward and orthros::rope_append_kv, each with a fake
(meta) implementation; orthros::attention's autograd goes through orthros::attention_backward.

CPU: the float32/float64 oracle (orthros.attention, orthros.attention_backward, orthros.rope),
one sequence at a time. CUDA: orthros._cuda (docs/torch.md), outputs and workspace allocated by
torch on the current stream.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import _core
from . import _checks as C
from ._cuda_backend import SizeCache, cuda_module, device_guard, dlpack, stream_of, workspace

Error = _core.Error


def _lse_dtype(q):
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _layout(q, q_out, k_cache, cu_seqlens_q, cu_seqlens_out, cache_seqlens):
    lens = C.lengths(cu_seqlens_q, cu_seqlens_out, cache_seqlens, q.shape[0], q_out.shape[0], k_cache.shape[1])
    if len(lens[0]) != k_cache.shape[0]:
        raise Error(f"cu_seqlens_q describes B = {len(lens[0])} sequences but k_cache has B = {k_cache.shape[0]} "
                    f"(shape {C.shape(k_cache)})")
    return lens


def _np(t):
    return t.detach().numpy()


# ---- orthros::attention -----------------------------------------------------------------

@torch.library.custom_op("orthros::attention", mutates_args=())
def attention_op(q: Tensor, q_out: Tensor, k_cache: Tensor, v_cache: Tensor, cu_seqlens_q: Tensor,
                 cu_seqlens_out: Tensor, cache_seqlens: Tensor, window: int, scale: Optional[float],
                 deterministic: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    if q.is_cuda:
        return _attention_cuda(q, q_out, k_cache, v_cache, cu_seqlens_q, cu_seqlens_out, cache_seqlens, window, scale,
                               deterministic)
    C.check_attention_shapes(q, q_out, k_cache, v_cache)
    q_lens, out_lens, cache_lens = _layout(q, q_out, k_cache, cu_seqlens_q, cu_seqlens_out, cache_seqlens)
    H_q = q.shape[1]
    o, o_out = torch.zeros_like(q), torch.zeros_like(q_out)
    lse = q.new_zeros((q.shape[0], H_q), dtype=_lse_dtype(q))
    lse_out = q.new_zeros((q_out.shape[0], H_q), dtype=_lse_dtype(q))
    b0 = o0 = 0
    for b, (T, T_out, L) in enumerate(zip(q_lens, out_lens, cache_lens)):
        if T:
            r = _core.attention(_np(q[b0:b0 + T]), _np(k_cache[b, :L]), _np(v_cache[b, :L]),
                                _np(q_out[o0:o0 + T_out]), window=window, scale=scale)
            o[b0:b0 + T] = torch.from_numpy(r["o"])
            o_out[o0:o0 + T_out] = torch.from_numpy(r["o_out"])
            lse[b0:b0 + T] = torch.from_numpy(r["lse"])
            lse_out[o0:o0 + T_out] = torch.from_numpy(r["lse_out"])
        b0, o0 = b0 + T, o0 + T_out
    return o, o_out, lse, lse_out


# The CUDA path's host work per call is what a decode step waits for (a 128K-token decode is
# ~0.15 ms of GPU time), so it checks in Python only what orthros._cuda cannot see (the
# cu_seqlens tensors: int32, 1-d, B+1 entries, starting at 0, non-decreasing; T_out_b <= T_b;
# cache_seqlens >= T_b) and leaves dtypes, shapes against the lengths, contiguity, alignment,
# devices and the capacity to the extension, which checks each before any CUDA call. When the
# call fails, the op's own checks (check_attention_shapes, _layout: the CPU path's, with the
# messages of the torch argument names) run and raise if they find the fault; otherwise the
# extension's error propagates.
_forward_sizes = SizeCache()
_backward_sizes = SizeCache()


def _attention_cuda(q, q_out, k_cache, v_cache, cu_seqlens_q, cu_seqlens_out, cache_seqlens, window, scale,
                    deterministic):
    try:
        cu = cuda_module()
        q_lens, out_lens, cache_lens = C.lengths(cu_seqlens_q, cu_seqlens_out, cache_seqlens)
        n, H_q = q.shape[0], q.shape[1]
        o = torch.empty_like(q)
        o_out = torch.empty_like(q_out)
        lse = torch.empty((n, H_q), dtype=torch.float32, device=q.device)
        lse_out = torch.empty((q_out.shape[0], H_q), dtype=torch.float32, device=q.device)
        has_out = q_out.shape[0] > 0
        with device_guard(q.device):
            key = (q.dtype, q.device.index, H_q, k_cache.shape[2], q.shape[2], window, deterministic, tuple(q_lens),
                   tuple(out_lens), tuple(cache_lens))
            nbytes = _forward_sizes.get(key, lambda: cu.attention_workspace_bytes(
                dtype=C.CUDA_DTYPE_NAMES[q.dtype], num_q_heads=H_q, num_kv_heads=k_cache.shape[2],
                head_dim=q.shape[2], window=window, deterministic=deterministic, num_splits=0, q_lens=q_lens,
                out_lens=out_lens, cache_lens=cache_lens))
            cu.attention_forward(
                q=dlpack(q), q_out=dlpack(q_out) if has_out else None, k_cache=dlpack(k_cache),
                v_cache=dlpack(v_cache), o=dlpack(o), o_out=dlpack(o_out) if has_out else None, lse=dlpack(lse),
                lse_out=dlpack(lse_out) if has_out else None, workspace=dlpack(workspace(nbytes, q.device)),
                q_lens=q_lens, out_lens=out_lens, cache_lens=cache_lens, window=window, scale=scale,
                deterministic=deterministic, num_splits=0, stream=stream_of(q.device))
    except Exception:
        C.check_attention_shapes(q, q_out, k_cache, v_cache)
        _layout(q, q_out, k_cache, cu_seqlens_q, cu_seqlens_out, cache_seqlens)
        raise
    return o, o_out, lse, lse_out


@attention_op.register_fake
def _attention_fake(q, q_out, k_cache, v_cache, cu_seqlens_q, cu_seqlens_out, cache_seqlens, window, scale,
                    deterministic):
    C.check_attention_shapes(q, q_out, k_cache, v_cache)
    H_q = q.shape[1]
    return (q.new_empty(q.shape), q_out.new_empty(q_out.shape), q.new_empty((q.shape[0], H_q), dtype=_lse_dtype(q)),
            q.new_empty((q_out.shape[0], H_q), dtype=_lse_dtype(q)))


# ---- orthros::attention_backward --------------------------------------------------------

@torch.library.custom_op("orthros::attention_backward", mutates_args=())
def attention_backward_op(q: Tensor, q_out: Tensor, k_cache: Tensor, v_cache: Tensor, o: Tensor, o_out: Tensor,
                          lse: Tensor, lse_out: Tensor, d_o: Tensor, d_o_out: Tensor, cu_seqlens_q: Tensor,
                          cu_seqlens_out: Tensor, cache_seqlens: Tensor, window: int, scale: Optional[float],
                          deterministic: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    if q.is_cuda:
        return _attention_backward_cuda(q, q_out, k_cache, v_cache, o, o_out, lse, lse_out, d_o, d_o_out, cu_seqlens_q,
                                        cu_seqlens_out, cache_seqlens, window, scale, deterministic)
    q_lens, out_lens, cache_lens = _check_backward(q, q_out, k_cache, v_cache, o, o_out, d_o, d_o_out, cu_seqlens_q,
                                                   cu_seqlens_out, cache_seqlens)
    dq, dq_out = torch.zeros_like(q), torch.zeros_like(q_out)
    dk, dv = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    b0 = o0 = 0
    for b, (T, T_out) in enumerate(zip(q_lens, out_lens)):
        if T:
            g = _core.attention_backward(_np(q[b0:b0 + T]), _np(k_cache[b, :T]), _np(v_cache[b, :T]),
                                         _np(q_out[o0:o0 + T_out]), _np(d_o[b0:b0 + T]), _np(d_o_out[o0:o0 + T_out]),
                                         window=window, scale=scale)
            dq[b0:b0 + T] = torch.from_numpy(g["dq"])
            dq_out[o0:o0 + T_out] = torch.from_numpy(g["dq_out"])
            dk[b, :T] = torch.from_numpy(g["dk"])
            dv[b, :T] = torch.from_numpy(g["dv"])
        b0, o0 = b0 + T, o0 + T_out
    return dq, dq_out, dk, dv


def _require_training(q_lens, cache_lens):
    if cache_lens != q_lens:
        b = next(i for i, (T, L) in enumerate(zip(q_lens, cache_lens)) if L != T)
        T, L = q_lens[b], cache_lens[b]
        raise Error(f"the attention backward needs an empty KV-cache prefix (P_b = 0: training, PT or SFT); "
                    f"sequence {b} has P = cache_seqlens[{b}] - T = {L} - {T} = {L - T} cached positions. "
                    f"Run prefill/decode under torch.no_grad(), or pass the whole sequence with cache_seqlens = T")


def _check_backward(q, q_out, k_cache, v_cache, o, o_out, d_o, d_o_out, cu_seqlens_q, cu_seqlens_out, cache_seqlens):
    """Every check of the backward's arguments; returns (q_lens, out_lens, cache_lens)."""
    C.check_attention_shapes(q, q_out, k_cache, v_cache)
    dts = C.activation_dtypes(q.device)
    for t, n, like in ((o, "o", q), (o_out, "o_out", q_out), (d_o, "d_o", q), (d_o_out, "d_o_out", q_out)):
        C.check_tensor(t, n, 3, q.device, dts)
        if t.shape != like.shape:
            raise Error(f"{n} has shape {C.shape(t)}; expected {C.shape(like)}")
    C.check_same_dtype(q, "q", (o, "o"), (o_out, "o_out"), (d_o, "d_o"), (d_o_out, "d_o_out"))
    q_lens, out_lens, cache_lens = _layout(q, q_out, k_cache, cu_seqlens_q, cu_seqlens_out, cache_seqlens)
    _require_training(q_lens, cache_lens)
    return q_lens, out_lens, cache_lens


def _attention_backward_cuda(q, q_out, k_cache, v_cache, o, o_out, lse, lse_out, d_o, d_o_out, cu_seqlens_q,
                             cu_seqlens_out, cache_seqlens, window, scale, deterministic):
    """As _attention_cuda: the cu_seqlens checks and P_b = 0 here, the rest in the extension, the
    full checks when the call fails."""
    try:
        cu = cuda_module()
        q_lens, out_lens, cache_lens = C.lengths(cu_seqlens_q, cu_seqlens_out, cache_seqlens)
        _require_training(q_lens, cache_lens)
        H_q, H_kv, D = q.shape[1], k_cache.shape[2], q.shape[2]
        has_out = q_out.shape[0] > 0
        dq, dq_out = torch.empty_like(q), torch.empty_like(q_out)
        dk_packed = torch.empty((q.shape[0], H_kv, D), dtype=q.dtype, device=q.device)  # [sum T_b, H_kv, D]
        dv_packed = torch.empty_like(dk_packed)
        with device_guard(q.device):
            key = (q.dtype, q.device.index, H_q, H_kv, D, window, deterministic, tuple(q_lens), tuple(out_lens))
            nbytes = _backward_sizes.get(key, lambda: cu.attention_backward_workspace_bytes(
                dtype=C.CUDA_DTYPE_NAMES[q.dtype], num_q_heads=H_q, num_kv_heads=H_kv, head_dim=D, window=window,
                deterministic=deterministic, q_lens=q_lens, out_lens=out_lens, cache_lens=cache_lens))
            opt = (lambda t: dlpack(t) if has_out else None)
            cu.attention_backward(
                q=dlpack(q), q_out=opt(q_out), k_cache=dlpack(k_cache), v_cache=dlpack(v_cache), o=dlpack(o),
                o_out=opt(o_out), lse=dlpack(lse), lse_out=opt(lse_out), d_o=dlpack(d_o), d_o_out=opt(d_o_out),
                dq=dlpack(dq), dq_out=opt(dq_out), dk=dlpack(dk_packed), dv=dlpack(dv_packed),
                workspace=dlpack(workspace(nbytes, q.device)), q_lens=q_lens, out_lens=out_lens,
                cache_lens=cache_lens, window=window, scale=scale, deterministic=deterministic,
                stream=stream_of(q.device))
    except Exception:
        _check_backward(q, q_out, k_cache, v_cache, o, o_out, d_o, d_o_out, cu_seqlens_q, cu_seqlens_out,
                        cache_seqlens)
        raise
    # dk/dv come packed per sequence; the gradient of k_cache/v_cache [B, capacity, H_kv, D] holds
    # sequence b's rows at cache rows 0..T_b-1 and zeros elsewhere (rows no call reads). When every
    # T_b is the capacity, the packed rows are that layout already (sequence b's at b * capacity).
    capacity = k_cache.shape[1]
    if all(T == capacity for T in q_lens):
        return dq, dq_out, dk_packed.view(k_cache.shape), dv_packed.view(v_cache.shape)
    dk, dv = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    b0 = 0
    for b, T in enumerate(q_lens):
        dk[b, :T] = dk_packed[b0:b0 + T]
        dv[b, :T] = dv_packed[b0:b0 + T]
        b0 += T
    return dq, dq_out, dk, dv


@attention_backward_op.register_fake
def _attention_backward_fake(q, q_out, k_cache, v_cache, o, o_out, lse, lse_out, d_o, d_o_out, cu_seqlens_q,
                             cu_seqlens_out, cache_seqlens, window, scale, deterministic):
    C.check_attention_shapes(q, q_out, k_cache, v_cache)
    return q.new_empty(q.shape), q_out.new_empty(q_out.shape), k_cache.new_empty(k_cache.shape), \
        v_cache.new_empty(v_cache.shape)


def _attention_setup_context(ctx, inputs, output):
    q, q_out, k_cache, v_cache, cu_q, cu_out, cache_seqlens, window, scale, deterministic = inputs
    o, o_out, lse, lse_out = output
    ctx.save_for_backward(q, q_out, k_cache, v_cache, o, o_out, lse, lse_out, cu_q, cu_out, cache_seqlens)
    ctx.window, ctx.scale, ctx.deterministic = window, scale, deterministic
    ctx.mark_non_differentiable(lse, lse_out)


def _attention_grad(ctx, d_o, d_o_out, _d_lse, _d_lse_out):
    q, q_out, k_cache, v_cache, o, o_out, lse, lse_out, cu_q, cu_out, cache_seqlens = ctx.saved_tensors
    dq, dq_out, dk, dv = attention_backward_op(q, q_out, k_cache, v_cache, o, o_out, lse, lse_out, d_o.contiguous(),
                                               d_o_out.contiguous(), cu_q, cu_out, cache_seqlens, ctx.window,
                                               ctx.scale, ctx.deterministic)
    return dq, dq_out, dk, dv, None, None, None, None, None, None


attention_op.register_autograd(_attention_grad, setup_context=_attention_setup_context)


def attention(q, q_out, k_cache, v_cache, cu_seqlens_q, cu_seqlens_out, cache_seqlens, window, scale=None,
              deterministic=False):
    """Orthros attention over a ragged batch with a KV cache (paper Eq. 2; SPEC §2, §5): every base
    query attends to the last `window` keys (its own included), every output query to all keys up
    to its position (full causal), both over the same cache.

    q [sum T_b, H_q, D] base queries, q_out [sum T_out_b, H_q, D] output-specific queries (the last
    T_out_b positions of each sequence), k_cache / v_cache [B, capacity, H_kv, D] with rows
    0..cache_seqlens[b]-1 of sequence b holding its P_b cached keys/values followed by this call's
    T_b (append first: rope_append_kv). cu_seqlens_q, cu_seqlens_out int32 [B+1] (FlashAttention's
    varlen convention), cache_seqlens int32 [B] = P_b + T_b. window: int >= 1; scale: None
    (1/sqrt(D)) or > 0; deterministic: bitwise reproducible and batch-invariant (CUDA; the CPU
    oracle always is). dtypes: float32/float64 on CPU, bfloat16/float16/float32 on CUDA, one dtype
    for q, q_out, k_cache, v_cache; contiguous; one device (the int32 lengths may be CPU tensors).

    Returns (o [sum T_b, H_q, D], o_out [sum T_out_b, H_q, D], lse [sum T_b, H_q], lse_out
    [sum T_out_b, H_q]); lse natural-log, float32 (float64 for float64 inputs), not differentiable.
    Differentiable in q, q_out, k_cache, v_cache when every P_b = 0 (training); a backward where
    some P_b > 0 raises orthros.Error. Raises orthros.Error on bad input, naming the argument."""
    C.check_tensors(q=q, q_out=q_out, k_cache=k_cache, v_cache=v_cache, cu_seqlens_q=cu_seqlens_q,
                    cu_seqlens_out=cu_seqlens_out, cache_seqlens=cache_seqlens)
    C.check_window(window)
    C.check_scale(scale)
    if not isinstance(deterministic, bool):
        raise Error(f"deterministic must be a bool; got {deterministic!r}")
    return attention_op(q, q_out, k_cache, v_cache, cu_seqlens_q, cu_seqlens_out, cache_seqlens, window,
                        None if scale is None else float(scale), deterministic)


# ---- orthros::rope_append_kv -----------------------------------------------------------

@torch.library.custom_op("orthros::rope_append_kv", mutates_args=("k_cache", "v_cache", "q", "q_out"))
def rope_append_kv_op(k_new: Tensor, v_new: Tensor, k_cache: Tensor, v_cache: Tensor, q: Optional[Tensor],
                      q_out: Optional[Tensor], cu_seqlens_q: Tensor, cu_seqlens_out: Tensor, cache_seqlens: Tensor,
                      theta: float, position_offset: int) -> None:
    _check_append(k_new, v_new, k_cache, v_cache, q, q_out)
    n_out = q_out.shape[0] if q_out is not None else int(cu_seqlens_out[-1])
    q_lens, out_lens, cache_lens = C.lengths(cu_seqlens_q, cu_seqlens_out, cache_seqlens, k_new.shape[0], n_out,
                                             k_cache.shape[1])
    if len(q_lens) != k_cache.shape[0]:
        raise Error(f"cu_seqlens_q describes B = {len(q_lens)} sequences but k_cache has B = {k_cache.shape[0]}")
    if k_new.device.type == "cuda":
        cu = cuda_module()
        with device_guard(k_new.device):
            cu.rope_append_kv(k_new=dlpack(k_new), v_new=dlpack(v_new), k_cache=dlpack(k_cache),
                              v_cache=dlpack(v_cache), q=dlpack(q),
                              q_out=dlpack(q_out) if q_out is not None and q_out.shape[0] else None, q_lens=q_lens,
                              out_lens=out_lens, cache_lens=cache_lens, theta=theta, position_offset=position_offset,
                              num_q_heads=q.shape[1] if q is not None else k_new.shape[1],
                              stream=stream_of(k_new.device))
        return
    b0 = o0 = 0
    for b, (T, T_out, L) in enumerate(zip(q_lens, out_lens, cache_lens)):
        P = L - T
        pos = list(range(P + position_offset, L + position_offset))
        k = k_new[b0:b0 + T]
        if theta > 0 and T:
            k = torch.from_numpy(_core.rope(_np(k), pos, theta)).to(k_cache.dtype)
            if q is not None:
                q[b0:b0 + T] = torch.from_numpy(_core.rope(_np(q[b0:b0 + T]), pos, theta)).to(q.dtype)
            if q_out is not None and T_out:
                q_out[o0:o0 + T_out] = torch.from_numpy(
                    _core.rope(_np(q_out[o0:o0 + T_out]), pos[T - T_out:], theta)).to(q_out.dtype)
        k_cache[b, P:L] = k
        v_cache[b, P:L] = v_new[b0:b0 + T]
        b0, o0 = b0 + T, o0 + T_out


def _check_append(k_new, v_new, k_cache, v_cache, q, q_out):
    dev = k_new.device
    dts = C.activation_dtypes(dev)
    C.check_tensor(k_new, "k_new", 3, dev, dts)
    C.check_tensor(v_new, "v_new", 3, dev, dts)
    C.check_tensor(k_cache, "k_cache", 4, dev, dts)
    C.check_tensor(v_cache, "v_cache", 4, dev, dts)
    C.check_same_dtype(k_new, "k_new", (v_new, "v_new"), (k_cache, "k_cache"), (v_cache, "v_cache"), (q, "q"),
                       (q_out, "q_out"))
    if v_new.shape != k_new.shape:
        raise Error(f"v_new has shape {C.shape(v_new)}; expected k_new's {C.shape(k_new)}")
    if v_cache.shape != k_cache.shape:
        raise Error(f"v_cache has shape {C.shape(v_cache)}; expected k_cache's {C.shape(k_cache)}")
    H_kv, D = k_new.shape[1], k_new.shape[2]
    if k_cache.shape[2] != H_kv or k_cache.shape[3] != D:
        raise Error(f"k_cache has shape {C.shape(k_cache)}; expected [B, capacity, H_kv = {H_kv}, D = {D}] "
                    f"(k_new is {C.shape(k_new)})")
    if q_out is not None and q is None:
        raise Error("q_out is given without q: rope_append_kv rotates the output queries together with the base "
                    "queries (pass q too)")
    for t, n in ((q, "q"), (q_out, "q_out")):
        if t is None:
            continue
        C.check_tensor(t, n, 3, dev, dts)
        if t.shape[2] != D or t.shape[1] % H_kv != 0:
            raise Error(f"{n} has shape {C.shape(t)}; expected [rows, H_q (a multiple of H_kv = {H_kv}), D = {D}]")
    if q is not None and q.shape[0] != k_new.shape[0]:
        raise Error(f"q has {q.shape[0]} rows but k_new has {k_new.shape[0]} (one per base token)")
    if q is not None and q_out is not None and q_out.shape[1] != q.shape[1]:
        raise Error(f"q_out has {q_out.shape[1]} heads but q has {q.shape[1]}")


@rope_append_kv_op.register_fake
def _rope_append_kv_fake(k_new, v_new, k_cache, v_cache, q, q_out, cu_seqlens_q, cu_seqlens_out, cache_seqlens,
                         theta, position_offset):
    _check_append(k_new, v_new, k_cache, v_cache, q, q_out)


def rope_append_kv(k_new, v_new, k_cache, v_cache, cu_seqlens_q, cache_seqlens, *, q=None, q_out=None,
                   cu_seqlens_out=None, theta=1e4, position_offset=0):
    """KV-cache append fused with RoPE, in place: sequence b's new keys/values k_new, v_new
    [sum T_b, H_kv, D] go to cache rows cache_seqlens[b]-T_b .. cache_seqlens[b]-1 of k_cache,
    v_cache [B, capacity, H_kv, D]; keys are rotated (rotate-half RoPE, SPEC §2) at position =
    cache row + position_offset (0-based, as Hugging Face position_ids) when theta > 0, values
    copied. q [sum T_b, H_q, D] and q_out [sum T_out_b, H_q, D] (the last T_out_b positions; only
    with q), when given, are rotated in place at the same positions; cu_seqlens_out is then
    required (it defaults to zero output tokens per sequence). theta = 0: plain append, nothing
    rotated (theta >= 0, finite). cu_seqlens_q
    int32 [B+1], cache_seqlens int32 [B] (the lengths AFTER the append). Mutates k_cache, v_cache
    (and q, q_out): not differentiable. Raises orthros.Error on bad input."""
    C.check_tensors(k_new=k_new, v_new=v_new, k_cache=k_cache, v_cache=v_cache, cu_seqlens_q=cu_seqlens_q,
                    cache_seqlens=cache_seqlens)
    C.check_tensors(q=q, q_out=q_out, cu_seqlens_out=cu_seqlens_out, optional=True)
    C.check_float(theta, "theta", 0.0)
    if isinstance(position_offset, bool) or not isinstance(position_offset, int) or position_offset < 0:
        raise Error(f"position_offset must be an int >= 0; got {position_offset!r}")
    if cu_seqlens_out is None:
        if q_out is not None and q_out.shape[0]:
            raise Error("q_out is given but cu_seqlens_out is not: give the output tokens' cumulative lengths")
        cu_seqlens_out = torch.zeros_like(cu_seqlens_q)
    rope_append_kv_op(k_new, v_new, k_cache, v_cache, q, q_out, cu_seqlens_q, cu_seqlens_out, cache_seqlens,
                      float(theta), position_offset)
