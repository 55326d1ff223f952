"""Tiny seeded Llama / Qwen3 models, the C++ oracle run on their weights, and the tolerance rule the
conversion tests judge by.

The rule (SPEC §6, applied to whole-model outputs): the float64 oracle on the same weights is the
exact function F; a float32 implementation passes when its relative Frobenius error against F is
<= 1e-5 AND its max abs error is <= 2 E + 1e-6, where E is the max abs error of the oracle itself
run in float32 against F (the naive float32 evaluation of the same function). Two float32
implementations that both pass differ by at most 4 E + 2e-6 (triangle inequality), which is the
bound on every "A equals B" that is not bitwise by construction.
"""
import os
import tempfile
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import orthros.torch as ot  # noqa: E402
from orthros.torch import oracle_file  # noqa: E402

ARCHS = ("llama", "qwen3")


def tiny_model(arch, seed, *, vocab=96, layers=2, tie=None, dtype=torch.float32):
    """A tiny transformers model with seeded weights at scales that make every logit matter: matrices
    ~ N(0, 1/fan_in) (unit-variance propagation), RMSNorm gains 1 + U(-0.2, 0.2), embeddings ~ N(0, 1).
    llama: hidden 32, H_q 4, H_kv 2, D 8 (d = d_model), untied; qwen3: hidden 24, H_q 4, H_kv 2,
    D 8 (d = 32 != d_model, QK-norm), tied embeddings."""
    common = dict(vocab_size=vocab, intermediate_size=40, num_hidden_layers=layers, num_attention_heads=4,
                  num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=4096,
                  attn_implementation="eager")
    if arch == "llama":
        cfg = transformers.LlamaConfig(hidden_size=32, rope_theta=1e4, tie_word_embeddings=bool(tie), **common)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.Qwen3Config(hidden_size=24, head_dim=8, rope_theta=1e6,
                                       tie_word_embeddings=True if tie is None else tie, **common)
        model = transformers.Qwen3ForCausalLM(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.4 * (torch.rand(p.shape, generator=g) - 0.5))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
    return model.to(dtype).eval()


def tokens(seed, shape, vocab=96):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def orthros_exe():
    exe = os.environ.get("ORTHROS")
    if not exe or not Path(exe).exists():
        pytest.skip("ORTHROS (the orthros command) is not set: run through ctest")
    return exe


class Oracle:
    """The C++ oracle on a converted model's weights (saved as its model file)."""

    def __init__(self, model):
        self.dir = tempfile.TemporaryDirectory(prefix="orthros-hf-")
        self.weights = Path(self.dir.name) / "model.safetensors"
        oracle_file.save_for_oracle(model, self.weights)
        self.exe = orthros_exe()
        self.model = model

    def run(self, ids, *, t_out=None, targets=None, dtype="f64"):
        out = Path(self.dir.name) / f"result-{dtype}.safetensors"
        return oracle_file.run_oracle_model(self.exe, self.weights, list(ids), out, t_out=t_out, targets=targets,
                                            dtype=dtype)

    def logits(self, ids, t_out=None):
        """(F, E): float64 logits [T_out, V] of `ids` and the oracle-at-float32 max abs error."""
        f = self.run(ids, t_out=t_out)["logits"]
        e = (self.run(ids, t_out=t_out, dtype="f32")["logits"].double() - f).abs().max().item()
        return f, e


def spec6(name, got, ref, e_x):
    """Asserts the rule of the module docstring for float32 `got` against float64 `ref`; returns the
    max abs error. Failure messages give both criteria's values."""
    got, ref = got.detach().double(), ref.detach().double()
    assert got.shape == ref.shape, f"{name}: shape {list(got.shape)} != {list(ref.shape)}"
    assert torch.isfinite(got).all(), f"{name}: non-finite values"
    err = (got - ref).abs().max().item()
    rel = ((got - ref).norm() / ref.norm()).item() if ref.norm() > 0 else 0.0
    tol = 2 * e_x + 1e-6
    assert rel <= 1e-5 and err <= tol, (f"{name}: rel_fro {rel:.3g} (<= 1e-5), max_abs {err:.3g} "
                                        f"(<= 2 E + 1e-6 = {tol:.3g}, E = {e_x:.3g})")
    return err


def pair_bound(e_x):
    """Bound on |A - B| for two float32 evaluations that both pass spec6 against the same F."""
    return 4 * e_x + 2e-6


def converted(arch, seed, window, **kw):
    return ot.convert(tiny_model(arch, seed, **kw), window=window)
