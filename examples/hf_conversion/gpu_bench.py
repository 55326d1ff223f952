"""Benchmarks of a converted Qwen3-0.6B-shaped model (published config, random weights, bf16, w = 128)
on one GPU against the original transformers model on PyTorch SDPA (docs/conversion.md):

  prefill   time of a T-token prompt (T = 32K, 128K): ours (one output query at the last token,
            the KV cache filled) vs the original (use_cache=True, logits of the last token), SDPA
            flash and cuDNN backends;
  decode    time per generated token over a T-token context (after that prefill), median of steps;
  train     tokens/s of one forward + backward at T = 8K (PT: every position predicts; ours runs
            2T rows through the token-wise modules) vs the original on SDPA;
  loss      a pre-training run on the GPL-3 text (--text; docs/*.md where it is missing; byte tokens, V = 256, Qwen3-0.6B layer shapes with
            fewer layers): the converted model's loss curve beside the original's, same initial
            weights, batches and optimizer (CSV, and a PNG when matplotlib is present).

    python gpu_bench.py --out OUT [--only prefill,decode,train,loss] [--small --device cpu]
Each part catches its own failure (logged), so one part cannot hide the others' numbers.
"""
import argparse
import sys
import time
from pathlib import Path

import torch

from gpu_common import QWEN3_06B, TINY, Log, env_line, ot, qwen3, sync, timed

TEXT = "/usr/share/common-licenses/GPL-3"


def sdpa_backends(device):
    if device == "cpu":
        return {"sdpa": None}
    from torch.nn.attention import SDPBackend
    return {"sdpa flash": [SDPBackend.FLASH_ATTENTION], "sdpa cuDNN": [SDPBackend.CUDNN_ATTENTION]}


def with_backend(backend, fn):
    if backend is None:
        return fn()
    from torch.nn.attention import sdpa_kernel
    with sdpa_kernel(backend):
        return fn()


def free():
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def bench_prefill_decode(a, log, orig, model, lengths, steps):
    dev = a.device
    cu = lambda n: torch.tensor([0, n], dtype=torch.int32)  # noqa: E731
    for T in lengths:
        ids = torch.randint(0, orig.config.vocab_size, (T,), device=dev)
        caches = model.new_cache(1, T + steps + 1)

        def ours_prefill():
            for c in caches:
                c.reset()
            return model.forward_packed(ids, cu(T), [1], caches)

        with torch.no_grad():
            t = timed(ours_prefill, dev, warmup=1, reps=3 if T <= 32768 else 2)
            log.add(part="prefill", T=T, impl="orthros (ours)", ms=t * 1e3)
            logits = ours_prefill()
            tok = logits.argmax(-1)
            ts = []
            for _ in range(steps):
                sync(dev)
                t0 = time.perf_counter()
                tok = model.forward_packed(tok, cu(1), [1], caches).argmax(-1)
                sync(dev)
                ts.append(time.perf_counter() - t0)
            log.add(part="decode", T=T, impl="orthros (ours)", ms=sorted(ts)[len(ts) // 2] * 1e3)
        del caches
        free()
        for name, backend in sdpa_backends(dev).items():
            try:
                with torch.no_grad():
                    run = lambda: orig(input_ids=ids[None], use_cache=True, logits_to_keep=1)  # noqa: E731
                    t = with_backend(backend, lambda: timed(run, dev, warmup=1, reps=2 if T <= 32768 else 1))
                    log.add(part="prefill", T=T, impl=f"original, {name}", ms=t * 1e3)
                    out = with_backend(backend, run)
                    cache, tok = out.past_key_values, out.logits[0, -1:].argmax(-1)[None]
                    ts = []
                    for _ in range(steps):
                        sync(dev)
                        t0 = time.perf_counter()
                        out = with_backend(backend, lambda: orig(input_ids=tok, past_key_values=cache, use_cache=True))
                        tok = out.logits[:, -1:].argmax(-1)
                        sync(dev)
                        ts.append(time.perf_counter() - t0)
                    log.add(part="decode", T=T, impl=f"original, {name}", ms=sorted(ts)[len(ts) // 2] * 1e3)
                    del out, cache
            except Exception as e:  # a backend that cannot run this shape is reported, not fatal
                log.add(part="prefill/decode", T=T, impl=f"original, {name}", error=f"{type(e).__name__}: {e}"[:200])
            free()


def bench_train(a, log, orig, model, T):
    dev = a.device
    ids = torch.randint(0, orig.config.vocab_size, (1, T), device=dev)

    def step(m):
        def run():
            m.zero_grad(set_to_none=True)
            m(ids, labels=ids).loss.backward()
        return run

    model.train()
    t = timed(step(model), dev, warmup=2, reps=3)
    log.add(part="train fwd+bwd", T=T, impl="orthros (ours)", ms=t * 1e3, tokens_per_s=T / t)
    model.zero_grad(set_to_none=True)
    model.eval()
    free()
    orig.train()
    for name, backend in sdpa_backends(dev).items():
        try:
            t = with_backend(backend, lambda: timed(step(orig), dev, warmup=2, reps=3))
            log.add(part="train fwd+bwd", T=T, impl=f"original, {name}", ms=t * 1e3, tokens_per_s=T / t)
        except Exception as e:
            log.add(part="train fwd+bwd", T=T, impl=f"original, {name}", error=f"{type(e).__name__}: {e}"[:200])
        orig.zero_grad(set_to_none=True)
        free()
    orig.eval()


def write_csv(path, curves):
    names = list(curves)
    with open(path, "w") as f:
        f.write("step," + ",".join(names) + "\n")
        for s in range(len(curves[names[0]])):
            f.write(f"{s}," + ",".join(f"{curves[n][s]:.6f}" for n in names) + "\n")


def loss_curves(a, log, shape):
    dev = a.device
    dtype = torch.bfloat16 if dev != "cpu" else torch.float32
    text = Path(a.text)
    if text.exists():
        raw, source = text.read_bytes(), a.text
    else:  # the device image may lack Debian's license texts: the repository's own docs are real text too
        root = Path(__file__).resolve().parents[2]
        raw = b"".join(p.read_bytes() for p in sorted((root / "docs").glob("*.md")) + [root / "README.md"])
        source = "docs/*.md + README.md"
    data = torch.tensor(list(raw), dtype=torch.long)
    orig = qwen3(shape, layers=a.loss_layers, vocab=256, dtype=dtype, device=dev, seed=11)
    model = ot.convert(orig, window=128)
    g = torch.Generator().manual_seed(12)
    batches = [torch.stack([data[s:s + a.loss_seq] for s in
                            torch.randint(0, data.numel() - a.loss_seq, (a.loss_batch,), generator=g).tolist()])
               for _ in range(a.loss_steps)]
    curves = {}
    for name, m in (("orthros (converted)", model), ("original (SDPA)", orig)):
        m.train()
        opt = torch.optim.AdamW(m.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))
        losses, t0 = [], time.perf_counter()
        for ids in batches:
            ids = ids.to(dev)
            loss = m(ids, labels=ids).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
        curves[name] = losses
        log.add(part="loss curve", impl=name, text=f"{source} ({len(raw)} bytes)", steps=len(losses), first=losses[0],
                last10_mean=sum(losses[-10:]) / len(losses[-10:]), s=time.perf_counter() - t0)
        del opt
        free()
        write_csv(Path(a.out) / "loss_curve.csv", curves)   # after each model: a timeout keeps the first
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6.4, 4))
        for n in curves:
            ax.plot(curves[n], label=n, lw=1)
        ax.set_xlabel("step")
        ax.set_ylabel("next-token loss (nats)")
        ax.set_title(f"{Path(source).name} bytes; Qwen3-0.6B layers x{a.loss_layers}; T {a.loss_seq} x {a.loss_batch}; "
                     f"w 128", fontsize=9)
        ax.legend()
        fig.tight_layout()
        fig.savefig(Path(a.out) / "loss_curve.png", dpi=120)
    except ImportError:
        print("matplotlib missing: plot loss_curve.csv with examples/hf_conversion/plot_loss.py")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="tiny shapes and lengths (a CPU dry run)")
    ap.add_argument("--only", default="prefill,train,loss")
    ap.add_argument("--loss-steps", type=int, default=300)
    ap.add_argument("--loss-layers", type=int, default=8)
    ap.add_argument("--loss-seq", type=int, default=1024)
    ap.add_argument("--loss-batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--text", default=TEXT, help="the loss curve's training text (orthros verify's GPL-3 text)")
    a = ap.parse_args()
    print(env_line())
    log = Log(a.out, "bench")
    shape = TINY if a.small else QWEN3_06B
    parts = a.only.split(",")
    dtype = torch.bfloat16 if a.device != "cpu" else torch.float32
    if "prefill" in parts or "train" in parts:
        orig = qwen3(shape, dtype=dtype, device=a.device, seed=1, layers=2 if a.small else None)
        model = ot.convert(orig, window=128)
        if "prefill" in parts:
            try:
                bench_prefill_decode(a, log, orig, model, [256, 512] if a.small else [32768, 131072],
                                     4 if a.small else 16)
            except Exception as e:
                log.add(part="prefill/decode", error=f"{type(e).__name__}: {e}"[:300])
        if "train" in parts:
            try:
                bench_train(a, log, orig, model, 256 if a.small else 8192)
            except Exception as e:
                log.add(part="train", error=f"{type(e).__name__}: {e}"[:300])
        del orig, model
        free()
    if "loss" in parts:
        try:
            loss_curves(a, log, shape)
        except Exception as e:
            log.add(part="loss curve", error=f"{type(e).__name__}: {e}"[:300])
    print(log.table(["part", "T", "impl", "ms", "tokens_per_s", "steps", "first", "last10_mean", "s", "error"]))
    return 1 if any("error" in r for r in log.rows) else 0


if __name__ == "__main__":
    sys.exit(main())
