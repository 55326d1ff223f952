"""orthros.torch.convert on tiny Llama / Qwen3 models: weights taken over, unsupported models refused,
and with window >= T the converted model's logits equal the original transformers model's.

Why they are equal (SPEC §4.4): with alpha = alpha' = 1, beta = beta' = 0 both query streams are
the original queries, and with w >= T the sliding window is full causal attention, so both
streams compute the original attention; the token-wise modules are the original ones.

The bound (hf_cases module docstring): the converted model (float32) and the original (float32)
are each judged against the float64 oracle on the same weights by SPEC §6 (relative error <= 1e-5,
max abs <= 2 E + 1e-6 with E the oracle-at-float32 error); so |converted - original| <= 4 E + 2e-6.
The original model computes its RoPE angles in float32 (angle error up to pos * theta^(-2i/D) *
2^-23 rad, i.e. ~2e-6 rad at position 31: the size of the whole f32 budget), the oracle and
OrthrosAttention in float64; the comparison gives the original model float64 RoPE tables
(hf.exact_rope_tables, its modules otherwise untouched) so it measures the attention replacement,
and prints the difference to the unmodified model for information.
"""
import pytest
import torch

from hf_cases import ARCHS, Oracle, pair_bound, spec6, tiny_model, tokens

import orthros.torch as ot
from orthros.torch.hf import exact_rope_tables


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("seed", [11, 12])
def test_window_covering_the_context_gives_the_original_logits(arch, seed):
    T = 24
    original = tiny_model(arch, seed)
    ids = tokens(seed, (2, T))
    with torch.no_grad():
        unmodified = original(ids).logits
        model = ot.convert(original, window=T + 3 * (seed % 2))  # w = T and w > T
        ours = model(ids).logits
        exact_rope_tables(original)
        theirs = original(ids).logits
    oracle = Oracle(model)
    for b in range(ids.shape[0]):
        F, E = oracle.logits(ids[b].tolist())
        spec6(f"converted, sequence {b} (seed {seed})", ours[b], F, E)
        spec6(f"original, sequence {b} (seed {seed})", theirs[b], F, E)
        diff = (ours[b] - theirs[b]).abs().max().item()
        assert diff <= pair_bound(E), f"converted vs original: {diff:.3g} > 4 E + 2e-6 = {pair_bound(E):.3g}"
    print(f"{arch} seed {seed}: max |converted - original| {(ours - theirs).abs().max().item():.3g}, "
          f"vs the original with its float32 RoPE angles {(ours - unmodified).abs().max().item():.3g}")


@pytest.mark.parametrize("arch", ARCHS)
def test_conversion_takes_over_the_weights_and_starts_at_identity_scale_offset(arch):
    original = tiny_model(arch, 5)
    before = {n: p.detach().clone() for n, p in original.named_parameters()}
    model = ot.convert(original, window=7)
    for n, p in original.named_parameters():  # copy_model=True leaves the original untouched
        assert torch.equal(p, before[n]), n
    for layer, src in zip(model.layers, original.model.layers):
        a, s = layer.self_attn.attn, src.self_attn
        assert a.window == 7
        assert torch.equal(a.w_q, s.q_proj.weight.t()) and torch.equal(a.w_k, s.k_proj.weight.t())
        assert torch.equal(a.w_v, s.v_proj.weight.t()) and torch.equal(a.w_o, s.o_proj.weight.t())
        assert torch.equal(a.alpha, torch.ones_like(a.alpha)) and torch.equal(a.alpha_out, torch.ones_like(a.alpha))
        assert torch.equal(a.beta, torch.zeros_like(a.beta)) and torch.equal(a.beta_out, torch.zeros_like(a.beta))
        assert a.qk_norm == (arch == "qwen3")
        if a.qk_norm:
            assert torch.equal(a.q_norm, s.q_norm.weight) and torch.equal(a.k_norm, s.k_norm.weight)
            assert a.rms_eps == s.q_norm.variance_epsilon
        assert a.rope_theta == original.config.rope_parameters["rope_theta"]
        assert torch.equal(layer.mlp.gate_proj.weight, src.mlp.gate_proj.weight)
    # every parameter of the converted model is trainable and reachable from the wrapper
    names = dict(model.named_parameters())
    assert "hf.model.layers.0.self_attn.attn.alpha_out" in names
    assert not any(n.endswith("q_proj.weight") for n in names)


def test_unsupported_models_and_arguments_raise_a_clear_error():
    import transformers
    with pytest.raises(ot.Error, match="window must be an int >= 1"):
        ot.convert(tiny_model("llama", 1), window=0)
    with pytest.raises(ot.Error, match="model must be one of LlamaForCausalLM, Qwen3ForCausalLM"):
        ot.convert(torch.nn.Linear(2, 2), window=8)
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1,
                                   rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 32.0,
                                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 8192})
    with pytest.raises(ot.Error, match="rope_type 'llama3' is not supported"):
        ot.convert(transformers.LlamaForCausalLM(cfg), window=8)
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, attention_bias=True)
    with pytest.raises(ot.Error, match="attention_bias = True is not supported"):
        ot.convert(transformers.LlamaForCausalLM(cfg), window=8)
    model = ot.convert(tiny_model("qwen3", 1), window=8)
    with pytest.raises(ot.Error, match="already converted"):
        ot.convert(model.hf, window=8)
    with pytest.raises(ot.Error, match="call the converted model"):
        model.hf(tokens(1, (1, 4)))
    with pytest.raises(ot.Error, match="labels select no token"):
        model(tokens(1, (1, 4)), labels=torch.full((1, 4), -100))
    with pytest.raises(ot.Error, match="labels select no token among the last T_out = 1"):
        model(tokens(1, (1, 4)), labels=tokens(1, (1, 4)), num_output_tokens=1)
    with pytest.raises(ot.Error, match=r"num_output_tokens must be in \[1, T = 4\]"):
        model(tokens(1, (1, 4)), num_output_tokens=5)


PUBLISHED = {  # config.json of Qwen/Qwen3-0.6B and meta-llama/Llama-3.2-1B (Llama's llama3 RoPE scaling left out)
    "qwen3-0.6b": ("Qwen3", dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, rope_theta=1e6,
                                 rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=40960)),
    "llama3.2-1b": ("Llama", dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                  num_attention_heads=32, num_key_value_heads=8, head_dim=64, rope_theta=5e5,
                                  rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=131072)),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_shapes_convert(name):
    """The conversion of the full published shapes (on the meta device: shapes only, no memory)."""
    import transformers
    arch, kw = PUBLISHED[name]
    cfg = getattr(transformers, arch + "Config")(**kw)
    with torch.device("meta"):
        original = getattr(transformers, arch + "ForCausalLM")(cfg)
    model = ot.convert(original, window=128)
    d = kw["num_attention_heads"] * kw["head_dim"]
    n_orig = sum(p.numel() for p in original.parameters())
    n_conv = sum(p.numel() for p in model.parameters())
    # the original's parameters, minus nothing, plus alpha, beta, alpha', beta' per layer
    assert n_conv == n_orig + 4 * d * kw["num_hidden_layers"], (n_orig, n_conv)
    a = model.orthros_attention(kw["num_hidden_layers"] - 1)
    assert (a.num_q_heads, a.num_kv_heads, a.head_dim, a.window) == (kw["num_attention_heads"],
                                                                    kw["num_key_value_heads"], kw["head_dim"], 128)
    assert a.w_q.shape == (kw["hidden_size"], d) and a.w_o.shape == (d, kw["hidden_size"])
    assert a.qk_norm == (arch == "Qwen3") and a.rope_theta == kw["rope_theta"] and a.rms_eps == kw["rms_norm_eps"]
