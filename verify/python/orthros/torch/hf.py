"""Conversion of a Hugging Face `transformers` Llama or Qwen3 causal LM to Orthros attention
(paper §4.3; SPEC §2-3; docs/conversion.md), and the converted model.

    import orthros.torch as ot
    model = ot.convert(hf_model, window=128)          # LlamaForCausalLM or Qwen3ForCausalLM
    out = model(input_ids, labels=labels)             # PT (labels None or all ids) / SFT (-100 on the prompt)
    out.loss.backward()
    tokens = ot.generate(model, prompt_ids, max_new_tokens=32)

How the output stream goes through the decoder (docs/conversion.md): the base tokens and the output
tokens (copies of the last T_out embeddings of each sequence) are packed along the sequence axis
of ONE hidden-state tensor [1, N + N_out, d_model]; every Hugging Face decoder layer runs its own
forward on it unchanged (its RMSNorms and SwiGLU MLP are token-wise, so they act on both streams
with the same weights), and only `self_attn` is replaced: `OrthrosDecoderAttention` splits the
rows back into x [N, d_model] and x_out [N_out, d_model], runs `OrthrosAttention` (orthros.torch)
and packs y, y_out again. The final norm and the LM head run on the output rows only.
"""
import copy
from dataclasses import dataclass
from typing import List, Optional

import torch

from .. import _core
from .module import OrthrosAttention, OrthrosKVCache

Error = _core.Error

IGNORE_INDEX = -100  # the labels value Hugging Face's loss ignores

_SUPPORTED = ("LlamaForCausalLM", "Qwen3ForCausalLM")


@dataclass
class PackedBatch:
    """Where the streams sit in the packed hidden states, passed to every decoder layer.

    n_base: rows 0..n_base-1 are the base tokens (sequences concatenated), rows n_base.. the output
    tokens; cu_seqlens / cu_seqlens_out int32 [B+1] (FlashAttention's varlen convention);
    caches: None (training, P = 0) or one OrthrosKVCache per decoder layer."""
    n_base: int
    cu_seqlens: torch.Tensor
    cu_seqlens_out: torch.Tensor
    caches: Optional[List[OrthrosKVCache]] = None


@dataclass
class OrthrosCausalLMOutput:
    """loss: mean next-token cross-entropy over the labelled output positions (None without labels);
    logits [B, T_out, V]: the output stream's logits at the last T_out positions of each sequence."""
    loss: Optional[torch.Tensor]
    logits: torch.Tensor


class OrthrosDecoderAttention(torch.nn.Module):
    """Replaces a Hugging Face decoder layer's `self_attn`. Called by the (unchanged) decoder layer
    with hidden_states [1, N + N_out, d_model] (the packed base and output rows, already through
    the layer's input RMSNorm) and the keyword `orthros_batch` (a PackedBatch); returns
    (y [1, N + N_out, d_model], None) as a Hugging Face attention module does. The layer's
    position embeddings and attention mask are not used: RoPE is applied inside OrthrosAttention at
    each token's position in its sequence (the output token at its base token's position)."""

    def __init__(self, attn: OrthrosAttention, layer_idx: int):
        super().__init__()
        self.attn = attn
        self.layer_idx = layer_idx

    def forward(self, hidden_states, orthros_batch: Optional[PackedBatch] = None, **_unused):
        if orthros_batch is None:
            raise Error("OrthrosDecoderAttention needs the packed-batch layout (orthros_batch=...): call the "
                        "converted model (OrthrosForCausalLM), not the Hugging Face model's forward")
        if hidden_states.dim() != 3 or hidden_states.shape[0] != 1:
            raise Error(f"hidden_states must be [1, N + N_out, d_model]; got {list(hidden_states.shape)}")
        x = hidden_states[0]
        n = orthros_batch.n_base
        cache = None if orthros_batch.caches is None else orthros_batch.caches[self.layer_idx]
        y, y_out = self.attn(x[:n], x[n:], orthros_batch.cu_seqlens, orthros_batch.cu_seqlens_out, cache=cache)
        return torch.cat([y, y_out]).unsqueeze(0), None


def _check_convertible(model, window):
    name = type(model).__name__
    if name not in _SUPPORTED:
        raise Error(f"convert: model must be one of {', '.join(_SUPPORTED)} (got {name})")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise Error(f"convert: window must be an int >= 1 (keys per base query, the current one included); got "
                    f"{window!r}")
    cfg = model.config
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    rope_type = rope.get("rope_type", "default")
    if rope_type != "default":
        raise Error(f"convert: rope_type '{rope_type}' is not supported: Orthros's kernels and oracle apply plain "
                    f"rotate-half RoPE with one theta (SPEC §2); a '{rope_type}' model would change its function")
    if float(rope.get("partial_rotary_factor", 1.0)) != 1.0:
        raise Error(f"convert: partial_rotary_factor {rope['partial_rotary_factor']} is not supported (RoPE rotates "
                    "the whole head)")
    for flag in ("attention_bias", "mlp_bias"):
        if getattr(cfg, flag, False):
            raise Error(f"convert: {flag} = True is not supported (Orthros projections have no bias)")
    if getattr(cfg, "hidden_act", "silu") != "silu":
        raise Error(f"convert: hidden_act '{cfg.hidden_act}' is not supported (the oracle's FFN is SwiGLU with silu)")
    layer_types = getattr(cfg, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        raise Error(f"convert: every layer must be full attention before conversion (layer_types = {layer_types})")
    for layer in model.model.layers:
        a = layer.self_attn
        if isinstance(a, OrthrosDecoderAttention):
            raise Error("convert: the model is already converted")
        if a.head_dim % 2:
            raise Error(f"convert: head_dim must be even for RoPE (got {a.head_dim})")


def _orthros_attention_from(a, cfg, window, deterministic):
    """An OrthrosAttention whose W_Q/W_K/W_V/W_O and QK-norm are the Hugging Face module `a`'s
    (a torch.nn.Linear weight is [out, in]; OrthrosAttention uses x @ W, so W = weight^T) and
    whose scale-offsets start at alpha = alpha' = 1, beta = beta' = 0 (paper §4.3)."""
    w = a.q_proj.weight
    qk_norm = hasattr(a, "q_norm") and hasattr(a, "k_norm")
    rms_eps = float(a.q_norm.variance_epsilon) if qk_norm else float(cfg.rms_norm_eps)
    H_q, H_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    o = OrthrosAttention(int(cfg.hidden_size), int(H_q), int(H_kv), int(a.head_dim), window,
                         rope_theta=float(cfg.rope_parameters["rope_theta"]), qk_norm=qk_norm, rms_eps=rms_eps,
                         deterministic=deterministic, dtype=w.dtype, device=w.device)
    if abs(a.scaling - a.head_dim ** -0.5) > 1e-12 * a.scaling:
        raise Error(f"convert: attention scaling {a.scaling} is not 1/sqrt(head_dim) = {a.head_dim ** -0.5}")
    with torch.no_grad():
        o.w_q.copy_(a.q_proj.weight.t())
        o.w_k.copy_(a.k_proj.weight.t())
        o.w_v.copy_(a.v_proj.weight.t())
        o.w_o.copy_(a.o_proj.weight.t())
        o.alpha.fill_(1), o.alpha_out.fill_(1), o.beta.zero_(), o.beta_out.zero_()
        if qk_norm:
            o.q_norm.copy_(a.q_norm.weight)
            o.k_norm.copy_(a.k_norm.weight)
    return o


def convert(model, window=128, *, deterministic=False, copy_model=True):
    """Converts a Hugging Face LlamaForCausalLM or Qwen3ForCausalLM to Orthros attention (paper
    §4.3; SPEC §2-3): every decoder layer's attention becomes an OrthrosAttention with the original
    W_Q, W_K, W_V, W_O (and Qwen3's per-head QK RMSNorm gains), alpha = alpha' = 1, beta = beta' = 0,
    RoPE theta and epsilons from the config; embeddings, RMSNorms, MLPs and LM head are kept (and
    shared by both streams). With window >= T every position's logits equal the original model's
    (SPEC §4.4: both streams reduce to full causal attention).

    model: the transformers model (from a config or `from_pretrained`), on CPU in float32/float64
    (the oracle-backed ops) or on CUDA in bfloat16/float16/float32 (the kernels).
    window: the base stream's sliding window, keys per query including the current one (int >= 1).
    deterministic: batch-invariant, bitwise reproducible kernels (CUDA; the CPU oracle always is).
    copy_model: True converts a deep copy and leaves `model` untouched; False converts in place.
    Returns an OrthrosForCausalLM. Raises orthros.Error for an unsupported model or config (other
    architectures, rope_type other than "default", biases, non-silu MLPs, sliding-window layers)."""
    _check_convertible(model, window)
    hf = copy.deepcopy(model) if copy_model else model
    for i, layer in enumerate(hf.model.layers):
        layer.self_attn = OrthrosDecoderAttention(
            _orthros_attention_from(layer.self_attn, hf.config, window, deterministic), i)
    return OrthrosForCausalLM(hf, window)


def _output_tokens(labels, T):
    """T_out of a labelled batch: the last position whose next label is not IGNORE_INDEX, counted
    back to the first such position of any sequence (every position from there on gets an output
    token; positions whose next label is ignored do not enter the loss)."""
    predicting = labels[:, 1:] != IGNORE_INDEX                  # [B, T-1]: position t predicts labels[t+1]
    if not bool(predicting.any()):
        raise Error("labels select no token: every next-token label is -100")
    first = int(torch.nonzero(predicting.any(dim=0))[0, 0])
    return T - first


class OrthrosForCausalLM(torch.nn.Module):
    """A converted Llama/Qwen3 causal LM (see `convert`). The wrapped transformers model is
    `self.hf` (its decoder layers' `self_attn` are OrthrosDecoderAttention); its parameters are this
    module's, so optimizers, `state_dict`, `.to()` and autocast behave as usual.

    forward(input_ids [B, T] int64, labels=None [B, T], num_output_tokens=None) ->
    OrthrosCausalLMOutput(loss, logits [B, T_out, V]):
      - PT: labels None or the ids themselves: T_out = T (every position predicts; with labels the
        loss is the mean cross-entropy of positions 1..T-1 predicting tokens 2..T, as Hugging Face's);
      - SFT: labels -100 on the prompt: the output tokens start at the first position of any
        sequence whose next label is kept (T_out = T - that position) and the loss averages over
        the kept labels; num_output_tokens overrides T_out (1 <= T_out <= T).
    Training call (no cache, P = 0): differentiable through the orthros ops' autograd.
    Raises orthros.Error on bad shapes or labels."""

    def __init__(self, hf_model, window):
        super().__init__()
        self.hf = hf_model
        self.window = window

    @property
    def config(self):
        return self.hf.config

    @property
    def layers(self):
        return self.hf.model.layers

    def orthros_attention(self, layer_idx):
        """The OrthrosAttention of decoder layer `layer_idx`."""
        return self.layers[layer_idx].self_attn.attn

    def new_cache(self, batch_size, capacity):
        """One empty OrthrosKVCache per decoder layer for `batch_size` sequences of up to `capacity`
        positions (prompt + generated tokens), in the model's dtype and device (never evicted)."""
        return [layer.self_attn.attn.new_cache(batch_size, capacity) for layer in self.layers]

    def forward_packed(self, tokens, cu_seqlens, out_lens, caches=None):
        """The model on a packed (varlen) batch, the one function every regime calls.

        tokens int64 [N]: the base tokens of B sequences concatenated; cu_seqlens int32 [B+1];
        out_lens: B ints, sequence b's output tokens at its last out_lens[b] positions; caches: None
        (training: positions 1..T_b) or new_cache()'s list (prefill / chunked prefill / decode: the
        sequences continue after their cached positions, and this call's keys/values are appended).
        Returns logits [sum out_lens, V] (float in the model's dtype), sequences in order."""
        if tokens.dim() != 1:
            raise Error(f"tokens must be 1-d [N] (sequences concatenated); got shape {list(tokens.shape)}")
        bounds = [int(v) for v in cu_seqlens.tolist()]
        lens = [bounds[b + 1] - bounds[b] for b in range(len(bounds) - 1)]
        if bounds[0] != 0 or bounds[-1] != tokens.shape[0] or min(lens, default=0) < 0:
            raise Error(f"cu_seqlens {bounds} must rise from 0 to the token count {tokens.shape[0]}")
        if len(out_lens) != len(lens) or any(not 0 <= o <= t for o, t in zip(out_lens, lens)):
            raise Error(f"out_lens {list(out_lens)} must hold one value 0 <= T_out_b <= T_b per sequence "
                        f"(T_b = {lens})")
        out_index = torch.cat([torch.arange(bounds[b + 1] - o, bounds[b + 1]) for b, o in enumerate(out_lens)]
                              + [torch.zeros(0, dtype=torch.long)]).to(tokens.device)
        emb = self.hf.model.embed_tokens(tokens)                          # [N, d]
        hidden = torch.cat([emb, emb.index_select(0, out_index)]).unsqueeze(0)  # output stream = copies
        cu_out = [0]
        for o in out_lens:
            cu_out.append(cu_out[-1] + int(o))
        batch = PackedBatch(n_base=tokens.shape[0], cu_seqlens=cu_seqlens.to(torch.int32).cpu(),
                            cu_seqlens_out=torch.tensor(cu_out, dtype=torch.int32), caches=caches)
        for layer in self.layers:
            hidden = layer(hidden, attention_mask=None, position_embeddings=None, orthros_batch=batch)
        out_rows = hidden[0, tokens.shape[0]:]
        return self.hf.lm_head(self.hf.model.norm(out_rows))

    def forward(self, input_ids, labels=None, num_output_tokens=None):
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise Error("input_ids must be an int64 tensor [B, T]")
        B, T = input_ids.shape
        if T < 1:
            raise Error("input_ids must hold at least one token per sequence")
        if labels is not None and tuple(labels.shape) != (B, T):
            raise Error(f"labels must have input_ids' shape [{B}, {T}]; got {list(labels.shape)}")
        if num_output_tokens is None:
            T_out = T if labels is None else _output_tokens(labels, T)
        else:
            T_out = int(num_output_tokens)
            if not 1 <= T_out <= T:
                raise Error(f"num_output_tokens must be in [1, T = {T}] (got {num_output_tokens})")
        cu = torch.arange(B + 1, dtype=torch.int32) * T
        logits = self.forward_packed(input_ids.reshape(-1), cu, [T_out] * B).view(B, T_out, -1)
        loss = None
        if labels is not None:
            targets = torch.full((B, T_out), IGNORE_INDEX, dtype=torch.long, device=labels.device)
            targets[:, :T_out - 1] = labels[:, T - T_out + 1:]        # position t predicts labels[t+1]
            if not bool((targets != IGNORE_INDEX).any()):
                raise Error(f"labels select no token among the last T_out = {T_out} positions' next tokens")
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                     targets.reshape(-1).to(logits.device),
                                                     ignore_index=IGNORE_INDEX)
        return OrthrosCausalLMOutput(loss=loss, logits=logits)


def rope_theta(model):
    """RoPE base of a (converted or original) Llama/Qwen3 model's config."""
    return float(model.config.rope_parameters["rope_theta"])


def exact_rope_tables(model):
    """Replaces the original (unconverted) model's rotary embedding by one whose angles
    pos * theta^(-2i/D) are computed in float64, as the oracle's RoPE computes them (HF computes them
    in float32: an angle error up to ~pos * theta^(-2i/D) * 2^-23 rad). Used by the tests to compare
    the attention replacement alone; returns the model."""
    rot = model.model.rotary_emb
    theta = rope_theta(model)
    D = int(getattr(model.config, "head_dim", None) or model.config.hidden_size // model.config.num_attention_heads)
    inv = torch.tensor([theta ** (-2.0 * i / D) for i in range(D // 2)], dtype=torch.float64)
    scaling = float(getattr(rot, "attention_scaling", 1.0))

    def forward(x, position_ids):
        ang = position_ids.to(torch.float64)[..., None] * inv.to(x.device)
        emb = torch.cat([ang, ang], dim=-1)
        return (emb.cos() * scaling).to(x.dtype), (emb.sin() * scaling).to(x.dtype)

    rot.forward = forward
    return model

