"""Argument checks shared by the orthros.torch ops: every violation raises orthros.Error (a
ValueError) naming the argument and the values, before any kernel or oracle call."""
import math
import operator

import torch

from .. import _core

Error = _core.Error

CPU_DTYPES = (torch.float32, torch.float64)
CUDA_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
CUDA_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}


def shape(t):
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def check_tensors(optional=False, **tensors):
    """Each keyword is a torch.Tensor (or None when `optional`)."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) and not (optional and t is None):
            raise Error(f"{name} must be a torch.Tensor (got {type(t).__name__})")


def check_window(window):
    """window: a Python int >= 1 (keys, the current token included)."""
    if isinstance(window, bool) or not isinstance(window, int):
        raise Error(f"window must be an int >= 1 (keys, the current token included); got {window!r} "
                    f"({type(window).__name__})")
    if window < 1:
        raise Error(f"window must be >= 1 (keys, the current token included); got {window}")


def check_scale(scale):
    """scale: None (1/sqrt(D)) or a finite float > 0."""
    if scale is None:
        return
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise Error(f"scale must be None or a finite float > 0; got {scale!r} ({type(scale).__name__})")
    if not (math.isfinite(scale) and scale > 0):
        raise Error(f"scale must be None or a finite float > 0; got {scale!r}")


def check_float(value, name, minimum=None, strictly=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise Error(f"{name} must be a finite float; got {value!r}")
    if minimum is not None and (value <= minimum if strictly else value < minimum):
        raise Error(f"{name} must be {'>' if strictly else '>='} {minimum}; got {value!r}")


def check_tensor(t, name, ndim, device, dtypes):
    """A tensor of `ndim` dims, on `device`, of one of `dtypes`, C-contiguous."""
    if not isinstance(t, torch.Tensor):
        raise Error(f"{name} must be a torch.Tensor (got {type(t).__name__})")
    if t.dim() != ndim:
        raise Error(f"{name} must be a {ndim}-d tensor; got shape {shape(t)}")
    if t.device != device:
        raise Error(f"{name} is on {t.device} but the call runs on {device} (q's device): every tensor "
                    f"must be on the same device (cu_seqlens and cache_seqlens may be on the CPU)")
    if t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise Error(f"{name} must be {names} on {device.type} (got {str(t.dtype).replace('torch.', '')})")
    if not t.is_contiguous():
        raise Error(f"{name} must be contiguous (shape {shape(t)}, strides {list(t.stride())}); call .contiguous()")


def activation_dtypes(device):
    if device.type == "cpu":
        return CPU_DTYPES
    if device.type == "cuda":
        return CUDA_DTYPES
    raise Error(f"orthros.torch ops run on cpu or cuda tensors (got {device})")


def check_same_dtype(ref, ref_name, *pairs):
    for t, name in pairs:
        if t is not None and t.dtype != ref.dtype:
            raise Error(f"{name} has dtype {str(t.dtype).replace('torch.', '')} but {ref_name} has "
                        f"{str(ref.dtype).replace('torch.', '')}: the activations must share one dtype")


def check_attention_shapes(q, q_out, k_cache, v_cache):
    """Shapes, devices, dtypes and contiguity of the attention op's activations (no data read).
    Returns (H_q, H_kv, D)."""
    dev = q.device
    dts = activation_dtypes(dev)
    check_tensor(q, "q", 3, dev, dts)
    check_tensor(q_out, "q_out", 3, dev, dts)
    check_tensor(k_cache, "k_cache", 4, dev, dts)
    check_tensor(v_cache, "v_cache", 4, dev, dts)
    check_same_dtype(q, "q", (q_out, "q_out"), (k_cache, "k_cache"), (v_cache, "v_cache"))
    H_q, D = q.shape[1], q.shape[2]
    B, cap, H_kv = k_cache.shape[0], k_cache.shape[1], k_cache.shape[2]
    if q_out.shape[1] != H_q or q_out.shape[2] != D:
        raise Error(f"q_out has shape {shape(q_out)}; expected [sum T_out_b, H_q = {H_q}, D = {D}] (q is {shape(q)})")
    if k_cache.shape[3] != D:
        raise Error(f"k_cache has shape {shape(k_cache)}; expected [B, capacity, H_kv, D = {D}] (D from q {shape(q)})")
    if tuple(v_cache.shape) != (B, cap, H_kv, D):
        raise Error(f"v_cache has shape {shape(v_cache)}; expected k_cache's {shape(k_cache)}")
    if H_kv < 1 or H_q < 1 or H_q % H_kv != 0:
        raise Error(f"num_q_heads (q axis 1) = {H_q} must be a positive multiple of num_kv_heads (k_cache axis 2) "
                    f"= {H_kv} (GQA)")
    if D < 1:
        raise Error(f"head_dim must be >= 1 (q has shape {shape(q)})")
    return H_q, H_kv, D


def _int_list(t, name, n=None):
    if not isinstance(t, torch.Tensor):
        raise Error(f"{name} must be an int32 torch.Tensor (got {type(t).__name__})")
    if t.dtype != torch.int32:
        raise Error(f"{name} must be int32 (got {str(t.dtype).replace('torch.', '')})")
    if t.dim() != 1:
        raise Error(f"{name} must be 1-d; got shape {shape(t)}")
    if n is not None and t.shape[0] != n:
        raise Error(f"{name} must have {n} entries; got {t.shape[0]}")
    return t.tolist()  # Python ints; a CUDA tensor: a device -> host copy (a sync)


def _first(pairs, bad):
    """Index of the first pair (a, b) with bad(a, b); the loop runs only when one is known to exist."""
    return next(i for i, (a, b) in enumerate(pairs) if bad(a, b))


def lengths(cu_seqlens_q, cu_seqlens_out, cache_seqlens, n_q=None, n_out=None, capacity=None):
    """Per-sequence lengths from FlashAttention-style cumulative sequence lengths.

    cu_seqlens_q [B+1] (int32, 0 = first, last = n_q = sum T_b, non-decreasing), cu_seqlens_out
    [B+1] (last = n_out = sum T_out_b, T_out_b <= T_b), cache_seqlens [B] (P_b + T_b, at least T_b,
    at most `capacity`; None: P_b = 0). n_q / n_out / capacity None: that comparison is left to
    the caller (the CUDA extension checks the row counts and the capacity against the arrays'
    shapes itself). Returns (q_lens, out_lens, cache_lens) as lists of ints. The checks run as
    list operations in C (min, map, ==); a failing one locates the offending sequence for the
    message."""
    cq = _int_list(cu_seqlens_q, "cu_seqlens_q")
    if len(cq) < 2:
        raise Error(f"cu_seqlens_q must have B+1 >= 2 entries; got {len(cq)}")
    B = len(cq) - 1
    co = _int_list(cu_seqlens_out, "cu_seqlens_out", B + 1)
    lens = {}
    for name, cu, total, rows in (("cu_seqlens_q", cq, n_q, "q"), ("cu_seqlens_out", co, n_out, "q_out")):
        if cu[0] != 0:
            raise Error(f"{name}[0] must be 0; got {cu[0]} ({name} = {cu})")
        diff = list(map(operator.sub, cu[1:], cu[:-1]))
        if min(diff) < 0:
            b = next(i for i, d in enumerate(diff) if d < 0)
            raise Error(f"{name} must be non-decreasing; {name}[{b + 1}] = {cu[b + 1]} < {name}[{b}] = {cu[b]}")
        if total is not None and cu[B] != total:
            raise Error(f"{name}[-1] = {cu[B]} must equal the rows of {rows} ({total})")
        lens[name] = diff
    q_lens, out_lens = lens["cu_seqlens_q"], lens["cu_seqlens_out"]
    if any(map(operator.gt, out_lens, q_lens)):
        b = _first(zip(out_lens, q_lens), operator.gt)
        raise Error(f"sequence {b}: T_out = {out_lens[b]} (cu_seqlens_out) exceeds T = {q_lens[b]} (cu_seqlens_q)")
    if cache_seqlens is None:
        return q_lens, out_lens, list(q_lens)
    cache_lens = _int_list(cache_seqlens, "cache_seqlens", B)
    if any(map(operator.lt, cache_lens, q_lens)):
        b = _first(zip(cache_lens, q_lens), operator.lt)
        raise Error(f"cache_seqlens[{b}] = {cache_lens[b]} must be >= T_{b} = {q_lens[b]} (it counts the "
                    f"cached positions P_b plus this call's T_b tokens)")
    if capacity is not None and max(cache_lens) > capacity:
        b = next(i for i, n in enumerate(cache_lens) if n > capacity)
        raise Error(f"cache_seqlens[{b}] = {cache_lens[b]} exceeds the cache capacity {capacity} "
                    f"(k_cache axis 1)")
    return q_lens, out_lens, cache_lens
