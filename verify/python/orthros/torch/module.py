"""OrthrosAttention, the attention layer of SPEC §2 as a torch.nn.Module, and OrthrosKVCache, its
never-evicted KV cache for prefill, chunked prefill and pair decode."""
import math

import torch

from .. import _core
from . import _checks as C
from ._layer import check_layer_scalars, layer_op, layer_with_cache_op

Error = _core.Error


def cu_seqlens(lengths, device="cpu"):
    """int32 [B+1] cumulative lengths [0, l_0, l_0+l_1, ...] of a list of per-sequence lengths."""
    out = [0]
    for n in lengths:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise Error(f"lengths must be ints >= 0; got {list(lengths)}")
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


class OrthrosKVCache:
    """KV cache of one OrthrosAttention layer for B sequences: k, v [B, capacity, H_kv, D]
    (post-RoPE keys and values of absolute positions 1..P_b of sequence b; only base tokens write
    it, nothing is evicted) and the cached lengths P_b (`lengths`, host ints). Each layer call with
    the cache appends its T_b base tokens to sequence b. A model keeps one cache per layer."""

    def __init__(self, batch_size, capacity, num_kv_heads, head_dim, *, dtype=torch.float32, device="cpu"):
        for v, n in ((batch_size, "batch_size"), (capacity, "capacity"), (num_kv_heads, "num_kv_heads"),
                     (head_dim, "head_dim")):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise Error(f"{n} must be an int >= 1; got {v!r}")
        self.k = torch.zeros((batch_size, capacity, num_kv_heads, head_dim), dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.lengths = [0] * batch_size

    @property
    def batch_size(self):
        return self.k.shape[0]

    @property
    def capacity(self):
        return self.k.shape[1]

    def reset(self):
        """Forget every cached position (the buffers are kept)."""
        self.lengths = [0] * self.batch_size


class OrthrosAttention(torch.nn.Module):
    """The Orthros attention layer (paper Eq. 2, Algorithm 1; SPEC §2): one W_Q, W_K, W_V shared by
    both streams, optional per-head QK RMSNorm, a scale-offset per stream (α, β for the base
    queries, α', β' for the output-specific ones), RoPE at the base token's position for both,
    sliding-window attention of `window` keys for the base stream and full causal attention for
    the output stream over the same keys, one W_O.

        k_i  = RoPE(norm_k(x_i W_K), i)                  v_i = x_i W_V      (base tokens only)
        q_i  = RoPE(α ⊙ norm_q(x_i W_Q) + β, i)         q'_i = RoPE(α' ⊙ norm_q(x'_i W_Q) + β', i)
        y = o W_O,  y' = o' W_O

    Parameters (used as `x @ W`, the oracle's layout): w_q [d_model, H_q*D], w_k and w_v
    [d_model, H_kv*D], w_o [H_q*D, d_model], alpha, beta, alpha_out, beta_out [H_q*D], q_norm and
    k_norm [D] (qk_norm only). Initialised as a conversion starts (paper §4.3): α = α' = 1,
    β = β' = 0, norm gains 1, projections N(0, 1/fan_in).

    forward(x, x_out, cu_seqlens=None, cu_seqlens_out=None, cache=None) -> (y, y_out):
      x [sum T_b, d_model] the base tokens' normed hidden states (sequences packed, varlen),
      x_out [sum T_out_b, d_model] the output tokens' (the last T_out_b positions of sequence b);
      cu_seqlens / cu_seqlens_out int32 [B+1] (None: one sequence of all rows);
      cache None: a training call (positions 1..T_b, differentiable; PT T_out = T, SFT T_out < T);
      cache an OrthrosKVCache: its sequences continue at P_b+1 and this call's keys/values are
      appended (prefill: T_out_b = 1; a chunk that is not the last: T_out_b = 0; pair decode:
      T_b = T_out_b = 1). The cache path has no backward: run it under torch.no_grad().
    CPU: float32/float64 through the oracle's layer; CUDA: bfloat16/float16/float32 kernels.
    Raises orthros.Error on bad input, naming the argument."""

    def __init__(self, d_model, num_q_heads, num_kv_heads, head_dim, window, *, rope_theta=1e4, qk_norm=True,
                 rms_eps=1e-6, deterministic=False, dtype=None, device=None):
        super().__init__()
        check_layer_scalars(num_q_heads, num_kv_heads, head_dim, window, float(rope_theta), qk_norm,
                            float(rms_eps), deterministic)
        if isinstance(d_model, bool) or not isinstance(d_model, int) or d_model < 1:
            raise Error(f"d_model must be an int >= 1; got {d_model!r}")
        if num_q_heads % num_kv_heads:
            raise Error(f"num_q_heads = {num_q_heads} must be a multiple of num_kv_heads = {num_kv_heads} (GQA)")
        if head_dim % 2:
            raise Error(f"head_dim must be even for RoPE; got {head_dim}")
        self.d_model, self.num_q_heads, self.num_kv_heads, self.head_dim = d_model, num_q_heads, num_kv_heads, head_dim
        self.window, self.rope_theta, self.qk_norm = window, float(rope_theta), qk_norm
        self.rms_eps, self.deterministic = float(rms_eps), deterministic
        f = dict(dtype=dtype, device=device)
        d, dkv = num_q_heads * head_dim, num_kv_heads * head_dim
        P = torch.nn.Parameter
        self.w_q = P(torch.randn(d_model, d, **f) / math.sqrt(d_model))
        self.w_k = P(torch.randn(d_model, dkv, **f) / math.sqrt(d_model))
        self.w_v = P(torch.randn(d_model, dkv, **f) / math.sqrt(d_model))
        self.w_o = P(torch.randn(d, d_model, **f) / math.sqrt(d))
        self.alpha, self.beta = P(torch.ones(d, **f)), P(torch.zeros(d, **f))
        self.alpha_out, self.beta_out = P(torch.ones(d, **f)), P(torch.zeros(d, **f))
        if qk_norm:
            self.q_norm, self.k_norm = P(torch.ones(head_dim, **f)), P(torch.ones(head_dim, **f))
        else:
            self.register_parameter("q_norm", None)
            self.register_parameter("k_norm", None)

    def new_cache(self, batch_size, capacity):
        """An empty OrthrosKVCache for this layer (its dtype and device)."""
        return OrthrosKVCache(batch_size, capacity, self.num_kv_heads, self.head_dim, dtype=self.w_q.dtype,
                              device=self.w_q.device)

    def _weights(self):
        return (self.w_q, self.w_k, self.w_v, self.w_o, self.alpha, self.beta, self.alpha_out, self.beta_out,
                self.q_norm, self.k_norm)

    def _scalars(self):
        return (self.num_q_heads, self.num_kv_heads, self.head_dim, self.window, self.rope_theta, self.qk_norm,
                self.rms_eps, self.deterministic)

    def forward(self, x, x_out, cu_seqlens=None, cu_seqlens_out=None, cache=None):
        if not isinstance(x, torch.Tensor) or not isinstance(x_out, torch.Tensor):
            raise Error("x and x_out must be torch.Tensors [rows, d_model]")
        if cu_seqlens is None:
            cu_seqlens = torch.tensor([0, x.shape[0]], dtype=torch.int32)
        if cu_seqlens_out is None:
            cu_seqlens_out = torch.tensor([0, x_out.shape[0]], dtype=torch.int32)
        if cache is None:
            return layer_op(x, x_out, *self._weights(), cu_seqlens, cu_seqlens_out, *self._scalars())
        if not isinstance(cache, OrthrosKVCache):
            raise Error(f"cache must be an OrthrosKVCache (got {type(cache).__name__})")
        if torch.is_grad_enabled() and (x.requires_grad or x_out.requires_grad or
                                        any(p is not None and p.requires_grad for p in self._weights())):
            raise Error("the KV-cache path (prefill, chunked prefill, decode) has no backward: run it under "
                        "torch.no_grad() or torch.inference_mode(); train with cache=None (P = 0)")
        q_lens = [int(v) for v in torch.diff(cu_seqlens.cpu()).tolist()] if cu_seqlens.dim() == 1 else None
        if q_lens is None or len(q_lens) != cache.batch_size:
            raise Error(f"cu_seqlens must be int32 [B+1] with B = the cache's batch size {cache.batch_size} "
                        f"(got shape {C.shape(cu_seqlens)})")
        new_lengths = [p + t for p, t in zip(cache.lengths, q_lens)]
        for b, n in enumerate(new_lengths):
            if n > cache.capacity:
                raise Error(f"sequence {b}: {cache.lengths[b]} cached + {q_lens[b]} new positions exceed the cache "
                            f"capacity {cache.capacity}")
        cache_seqlens = torch.tensor(new_lengths, dtype=torch.int32)
        y, y_out = layer_with_cache_op(x, x_out, *self._weights(), cache.k, cache.v, cu_seqlens, cu_seqlens_out,
                                       cache_seqlens, *self._scalars())
        cache.lengths = new_lengths
        return y, y_out
