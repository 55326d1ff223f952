"""Orthros attention for PyTorch (docs/torch.md): custom ops with fake (meta) implementations and
autograd, so eager mode, torch.compile, CUDA graphs and torch.library.opcheck work, and the layer
as a torch.nn.Module.

    import orthros.torch as ot
    o, o_out, lse, lse_out = ot.attention(q, q_out, k_cache, v_cache, cu_seqlens_q, cu_seqlens_out,
                                          cache_seqlens, window=128)
    layer = ot.OrthrosAttention(d_model, num_q_heads=32, num_kv_heads=8, head_dim=128, window=128)
    y, y_out = layer(x, x_out)                          # training call (P = 0), differentiable
    cache = layer.new_cache(batch_size=1, capacity=4096)
    with torch.no_grad():
        y, y_out = layer(x, x_out, cache=cache)         # prefill / decode, appends to the cache

Ops (torch.ops.orthros.*): attention, attention_backward, rope_append_kv (mutates its cache
arguments), layer (training), layer_backward, layer_with_cache (mutates the cache). CPU tensors
(float32/float64) run the oracle (orthros._core); CUDA tensors (bfloat16/float16/float32) run the
kernels of orthros._cuda, present in a CUDA build. Importing this module needs torch; `import
orthros` does not.
"""
try:
    import torch as _torch  # noqa: F401
except ImportError as _e:  # pragma: no cover - exercised only without torch
    raise ImportError("orthros.torch needs PyTorch (pip install torch); `import orthros` works without it") from _e

from .. import _core
from ._attention import attention, attention_backward_op, attention_op, rope_append_kv, rope_append_kv_op
from ._cuda_backend import available as cuda_available
from ._layer import layer_backward_op, layer_op, layer_with_cache_op
from .module import OrthrosAttention, OrthrosKVCache, cu_seqlens

Error = _core.Error

__all__ = ["attention", "rope_append_kv", "OrthrosAttention", "OrthrosKVCache", "cu_seqlens", "cuda_available",
           "attention_op", "attention_backward_op", "rope_append_kv_op", "layer_op", "layer_backward_op",
           "layer_with_cache_op", "Error"]

# Hugging Face conversion (docs/conversion.md): needs transformers only for the model passed in.
from .generation import GenerationOutput, generate  # noqa: E402
from .hf import OrthrosForCausalLM, convert  # noqa: E402
from .oracle_file import save_for_oracle  # noqa: E402

__all__ += ["convert", "generate", "OrthrosForCausalLM", "GenerationOutput", "save_for_oracle"]
