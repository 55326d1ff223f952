"""Convert a Hugging Face Llama/Qwen3 model to Orthros, train it, generate from it and check it against
the C++ oracle (docs/conversion.md). Every step reads and writes a run directory:

    python hf_conversion.py convert  --run RUN --arch qwen3 --shape tiny --window 16
    python hf_conversion.py train    --run RUN --steps 40 [--sft]
    python hf_conversion.py generate --run RUN --prompt "This program is " --new 40 [--sample]
    python hf_conversion.py check    --run RUN --orthros build/verify/cli/orthros

convert --pretrained DIR converts a downloaded checkpoint (transformers' from_pretrained on a local
directory) instead of a config with random weights. Token ids are the bytes of the text (the tiny
shapes have V = 256); a real checkpoint's tokenizer is the user's (pass ids). --device cuda and
--dtype bfloat16 run the kernels (a CUDA build of orthros); the CPU runs the oracle-backed ops.
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
import transformers

import orthros.torch as ot

TEXT = "/usr/share/common-licenses/GPL-3"

SHAPES = {  # published shapes (random weights); tiny for a CPU
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16),
    "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, rope_theta=1e6),
    "llama3.2-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                        num_attention_heads=32, num_key_value_heads=8, head_dim=64, rope_theta=5e5),
}


def build_original(arch, shape, dtype, device, seed=0):
    """A transformers model of a published shape with seeded random weights (Llama 3.2's llama3 RoPE
    scaling is left out: see docs/conversion.md, Limits)."""
    torch.manual_seed(seed)
    kw = dict(SHAPES[shape], rms_norm_eps=1e-6, max_position_embeddings=131072, attn_implementation="sdpa",
              tie_word_embeddings=True)
    kw.setdefault("rope_theta", 1e4)
    cls_cfg, cls = ((transformers.Qwen3Config, transformers.Qwen3ForCausalLM) if arch == "qwen3" else
                    (transformers.LlamaConfig, transformers.LlamaForCausalLM))
    with torch.device(device):
        return cls(cls_cfg(**kw)).to(dtype).eval()


def text_tokens(vocab):
    return torch.tensor(list(Path(TEXT).read_bytes()), dtype=torch.long) % vocab


def load(run, device=None):
    meta = json.loads((Path(run) / "run.json").read_text())
    device = device or meta["device"]
    dtype = getattr(torch, meta["dtype"])
    original = transformers.AutoModelForCausalLM.from_pretrained(Path(run) / "original", dtype=dtype).to(device)
    model = ot.convert(original, window=meta["window"], copy_model=False)
    state = Path(run) / "orthros.pt"
    if state.exists():
        model.load_state_dict(torch.load(state, map_location=device))
    return model, meta


def cmd_convert(a):
    run = Path(a.run)
    run.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, a.dtype)
    if a.pretrained:
        original = transformers.AutoModelForCausalLM.from_pretrained(a.pretrained, dtype=dtype).to(a.device)
    else:
        original = build_original(a.arch, a.shape, dtype, a.device, a.seed)
    original.save_pretrained(run / "original")
    model = ot.convert(original, window=a.window)
    (run / "run.json").write_text(json.dumps(dict(window=a.window, device=a.device, dtype=a.dtype)))
    n = sum(p.numel() for p in model.parameters())
    print(f"converted {type(original).__name__} ({n / 1e6:.2f} M parameters, window {a.window}) -> {run}")


def cmd_train(a):
    model, meta = load(a.run)
    device = next(model.parameters()).device
    data = text_tokens(model.config.vocab_size)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    g = torch.Generator().manual_seed(a.seed)
    model.train()
    for step in range(a.steps):
        starts = torch.randint(0, data.numel() - a.seq_len - 1, (a.batch,), generator=g)
        ids = torch.stack([data[s:s + a.seq_len] for s in starts.tolist()]).to(device)
        labels = ids.clone()
        if a.sft:  # supervised fine-tuning: the first half is the "prompt", no loss there
            labels[:, :a.seq_len // 2] = -100
        t0 = time.perf_counter()
        loss = model(ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % max(1, a.steps // 10) == 0 or step == a.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}  ({time.perf_counter() - t0:.2f} s)")
    torch.save(model.state_dict(), Path(a.run) / "orthros.pt")


def cmd_generate(a):
    model, _ = load(a.run)
    V = model.config.vocab_size
    prompt = [b % V for b in a.prompt.encode()]
    out = ot.generate(model, [prompt], a.new, do_sample=a.sample, temperature=a.temperature, top_k=a.top_k,
                      generator=torch.Generator().manual_seed(a.seed), prefill_chunk_size=a.chunk)
    text = bytes(t for t in out.tokens[0] if t < 256).decode("utf-8", errors="replace")
    print(f"{a.prompt!r} -> {text!r}")


def cmd_check(a):
    """The oracle on the run's weights: every regime bitwise equal to PT (orthros verify --weights),
    and the torch model's float32 PT logits within SPEC §6 of the float64 oracle (relative error
    <= 1e-5, max abs <= 2 E + 1e-6 with E the oracle-at-float32's max abs error)."""
    model, _ = load(a.run, device="cpu")
    model = model.float()
    weights = Path(a.run) / "oracle.safetensors"
    ot.save_for_oracle(model, weights)
    r = subprocess.run([a.orthros, "verify", "--weights", str(weights), "--seq-len", str(a.seq_len)],
                       capture_output=True, text=True)
    print(r.stdout.strip() or r.stderr.strip())
    ids = text_tokens(model.config.vocab_size)[:a.seq_len]
    with torch.no_grad():
        ours = model(ids[None]).logits[0].double()
    from orthros.torch.oracle_file import run_oracle_model
    ref = {dt: run_oracle_model(a.orthros, weights, ids.tolist(), Path(a.run) / f"oracle-{dt}.safetensors",
                                dtype=dt)["logits"].double() for dt in ("f64", "f32")}
    E = (ref["f32"] - ref["f64"]).abs().max().item()
    err = (ours - ref["f64"]).abs().max().item()
    rel = ((ours - ref["f64"]).norm() / ref["f64"].norm()).item()
    ok_logits = rel <= 1e-5 and err <= 2 * E + 1e-6
    print(f"torch float32 PT logits vs the float64 oracle on the same weights: rel {rel:.2e} (<= 1e-5), max abs "
          f"{err:.2e} (<= 2 E + 1e-6 = {2 * E + 1e-6:.2e}) -> {'ok' if ok_logits else 'FAIL'}")
    ok = r.returncode == 0 and ok_logits
    print("check:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert")
    c.add_argument("--arch", choices=["qwen3", "llama"], default="qwen3")
    c.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    c.add_argument("--pretrained", help="a local transformers checkpoint directory (instead of --arch/--shape)")
    c.add_argument("--window", type=int, default=128)
    c.add_argument("--device", default="cpu")
    c.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16"])
    c.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("train")
    t.add_argument("--steps", type=int, default=40)
    t.add_argument("--batch", type=int, default=4)
    t.add_argument("--seq-len", type=int, default=64)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--sft", action="store_true")
    t.add_argument("--seed", type=int, default=0)
    g = sub.add_parser("generate")
    g.add_argument("--prompt", default="This program is ")
    g.add_argument("--new", type=int, default=40)
    g.add_argument("--sample", action="store_true")
    g.add_argument("--temperature", type=float, default=0.8)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--chunk", type=int, default=None, help="prefill chunk size (default: one chunk)")
    g.add_argument("--seed", type=int, default=0)
    k = sub.add_parser("check")
    k.add_argument("--orthros", default="build/verify/cli/orthros", help="the orthros command (the C++ oracle)")
    k.add_argument("--seq-len", type=int, default=48)
    for p in (c, t, g, k):
        p.add_argument("--run", required=True, help="run directory")
    a = ap.parse_args()
    return {"convert": cmd_convert, "train": cmd_train, "generate": cmd_generate, "check": cmd_check}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main())
