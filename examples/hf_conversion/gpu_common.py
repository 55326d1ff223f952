"""Shared by gpu_proofs.py and gpu_bench.py: Qwen3-shaped models with seeded weights, the oracle on
their weights, timing, and a JSON/markdown log under the output folder."""
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import transformers

import orthros.torch as ot
from orthros.torch import oracle_file

# Qwen3-0.6B (published config) and reduced variants of it (same layer shapes).
QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6,
                 tie_word_embeddings=True, max_position_embeddings=262144)
TINY = dict(QWEN3_06B, vocab_size=512, hidden_size=64, intermediate_size=96, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16)


def qwen3(shape, *, layers=None, vocab=None, dtype=torch.bfloat16, device="cuda", seed=0, attn="sdpa",
          test_scales=False):
    """A Qwen3ForCausalLM of `shape` (dict), optionally fewer layers / another vocabulary. Weights:
    transformers' init (N(0, 0.02)), or with test_scales the scales of verify/hf (matrices
    N(0, 1/fan_in), norm gains 1 + U(-0.2, 0.2), embeddings N(0, 1)) so every logit matters."""
    kw = dict(shape)
    if layers is not None:
        kw["num_hidden_layers"] = layers
    if vocab is not None:
        kw["vocab_size"] = vocab
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(attn_implementation=attn, **kw))
    if test_scales:
        g = torch.Generator(device=device).manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 1:
                    p.copy_(1 + 0.4 * (torch.rand(p.shape, generator=g, device=device) - 0.5))
                elif "embed_tokens" in name:
                    p.copy_(torch.randn(p.shape, generator=g, device=device))
                else:
                    p.copy_(torch.randn(p.shape, generator=g, device=device) / p.shape[1] ** 0.5)
    return model.to(dtype).eval()


def oracle_exe():
    for c in (os.environ.get("ORTHROS"), os.environ.get("ORTHROS_ORACLE")):
        if c and Path(c).exists():
            return c
    raise RuntimeError("set ORTHROS to the `orthros` command (the CPU oracle; build/verify/cli/orthros)")


class Oracle:
    """The float64 / float32 C++ oracle on a converted model's weights."""

    def __init__(self, model):
        self.dir = tempfile.TemporaryDirectory(prefix="orthros-gpu-")
        self.weights = Path(self.dir.name) / "model.safetensors"
        oracle_file.save_for_oracle(model, self.weights)
        self.exe = oracle_exe()

    def run(self, ids, dtype="f64", **kw):
        return oracle_file.run_oracle_model(self.exe, self.weights, list(ids), Path(self.dir.name) / f"r-{dtype}.st",
                                            dtype=dtype, **kw)


def compare(got, ref):
    """(relative Frobenius error, max abs error) of `got` against float64 `ref`."""
    got, ref = got.detach().double().cpu(), ref.detach().double().cpu()
    return ((got - ref).norm() / ref.norm()).item(), (got - ref).abs().max().item()


def sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device, *, warmup=1, reps=3):
    """Median wall time (s) of fn() over `reps` calls after `warmup`, synchronizing the device."""
    for _ in range(warmup):
        fn()
    sync(device)
    ts = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts) // 2]


class Log:
    """Rows of results (dicts) written to OUT/<name>.json as they come, and a markdown table."""

    def __init__(self, out, name):
        self.path = Path(out) / f"{name}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rows = []

    def add(self, **row):
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        self.path.write_text(json.dumps(self.rows, indent=1))

    def table(self, cols):
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for r in self.rows:
            lines.append("| " + " | ".join(_fmt(r.get(c, "")) for c in cols) + " |")
        return "\n".join(lines)


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def env_line():
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return f"{dev}, torch {torch.__version__}, transformers {transformers.__version__}, commit {git or '?'}"


__all__ = ["QWEN3_06B", "TINY", "qwen3", "Oracle", "compare", "timed", "sync", "Log", "env_line", "ot"]
