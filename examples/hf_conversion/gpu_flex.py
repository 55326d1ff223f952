"""Training-throughput peer: the same converted Orthros model with its attention layers computed by
FlexAttention with the block mask of examples/ports/flex_port.py (both streams in ONE call: the
queries [q; q_out] over the base keys, base row i sees keys i-w+1 .. i, output row i keys 0 .. i)
instead of the orthros ops; projections, QK-norm, scale-offset and RoPE in plain torch. Forward +
backward at T = 8K, bf16; appended to OUT/bench.json as part "train fwd+bwd", impl "orthros on
FlexAttention". The loss of its first step is compared with the orthros ops' loss on the same
batch (a sanity check that it computes the same function, not a proof).

    python gpu_flex.py --out OUT [--small --device cpu]
"""
import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

from gpu_common import QWEN3_06B, TINY, env_line, ot, qwen3, sync, timed


class FlexOrthrosAttention(torch.nn.Module):
    """SPEC §2 for one sequence (P = 0, training) with FlexAttention, reading the parameters of an
    OrthrosAttention `a` (x @ W layout)."""

    def __init__(self, a):
        super().__init__()
        self.a = a
        self.masks = {}
        from torch.nn.attention.flex_attention import flex_attention
        self.flex = torch.compile(flex_attention, dynamic=False)

    def _mask(self, n, n_out, window, device):
        """One block mask for the rows [base 0..n-1; output 0..n_out-1] over n keys (P = 0)."""
        key = (n, n_out, window)
        if key not in self.masks:
            from torch.nn.attention.flex_attention import create_block_mask
            pos = torch.cat([torch.arange(n, device=device), torch.arange(n - n_out, n, device=device)])
            lo = torch.cat([(torch.arange(n, device=device) - window + 1).clamp(min=0),
                            torch.zeros(n_out, dtype=torch.long, device=device)])

            def mask_mod(b, h, q_idx, kv_idx):
                return (kv_idx >= lo[q_idx]) & (kv_idx <= pos[q_idx])

            self.masks[key] = create_block_mask(mask_mod, None, None, n + n_out, n, device=device)
        return self.masks[key]

    def _rope(self, x, pos):
        D = x.shape[-1]
        inv = self.a.rope_theta ** (-torch.arange(0, D, 2, dtype=torch.float64, device=x.device) / D)
        ang = pos.to(torch.float64)[:, None] * inv
        cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None].to(x.dtype), torch.cat([ang.sin()] * 2, -1)[:, None].to(x.dtype)
        x1, x2 = x[..., :D // 2], x[..., D // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def _norm(self, x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.a.rms_eps)).to(x.dtype) * w

    def forward(self, x, x_out, cu_seqlens=None, cu_seqlens_out=None, cache=None):
        a = self.a
        if cache is not None or (cu_seqlens is not None and cu_seqlens.numel() != 2):
            raise RuntimeError("FlexOrthrosAttention: one sequence, training (P = 0) only")
        H, Hkv, D = a.num_q_heads, a.num_kv_heads, a.head_dim
        n, n_out = x.shape[0], x_out.shape[0]
        q, qo = (x @ a.w_q).view(n, H, D), (x_out @ a.w_q).view(n_out, H, D)
        k, v = (x @ a.w_k).view(n, Hkv, D), (x @ a.w_v).view(n, Hkv, D)
        if a.qk_norm:
            q, qo, k = self._norm(q, a.q_norm), self._norm(qo, a.q_norm), self._norm(k, a.k_norm)
        q = q * a.alpha.view(H, D) + a.beta.view(H, D)
        qo = qo * a.alpha_out.view(H, D) + a.beta_out.view(H, D)
        pos = torch.arange(n, device=x.device)
        q, k, qo = self._rope(q, pos), self._rope(k, pos), self._rope(qo, pos[n - n_out:])
        mask = self._mask(n, n_out, a.window, x.device)
        th = lambda t: t.permute(1, 0, 2)[None]  # noqa: E731  [1, heads, rows, D]
        o = self.flex(th(torch.cat([q, qo])), th(k), th(v), block_mask=mask, enable_gqa=True)
        o = o[0].permute(1, 0, 2).reshape(n + n_out, H * D)
        return o[:n] @ a.w_o, o[n:] @ a.w_o


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true")
    a = ap.parse_args()
    print(env_line())
    dtype = torch.bfloat16 if a.device != "cpu" else torch.float32
    T = 256 if a.small else 8192
    orig = qwen3(TINY if a.small else QWEN3_06B, dtype=dtype, device=a.device, seed=1, layers=2 if a.small else None)
    model = ot.convert(orig, window=128, copy_model=False)
    flex_model = copy.deepcopy(model)
    for layer in flex_model.layers:
        layer.self_attn.attn = FlexOrthrosAttention(layer.self_attn.attn)
    ids = torch.randint(0, orig.config.vocab_size, (1, T), device=a.device)
    model.train()
    flex_model.train()
    with torch.no_grad():
        ours = model(ids, labels=ids).loss.item()
    model.zero_grad(set_to_none=True)
    del model
    losses = []

    def step():
        flex_model.zero_grad(set_to_none=True)
        loss = flex_model(ids, labels=ids).loss
        loss.backward()
        losses.append(loss.detach())

    t0 = time.perf_counter()
    step()
    sync(a.device)
    first = time.perf_counter() - t0
    t = timed(step, a.device, warmup=1, reps=3)
    d = abs(losses[0].item() - ours)
    row = dict(part="train fwd+bwd", T=T, impl="orthros on FlexAttention", ms=t * 1e3, tokens_per_s=T / t,
               first_step_s=first, loss=losses[0].item(), loss_orthros_ops=ours, loss_diff=d)
    print(json.dumps(row))
    path = Path(a.out) / "bench.json"
    rows = json.loads(path.read_text()) if path.exists() else []
    path.write_text(json.dumps(rows + [row], indent=1))
    print(f"| train fwd+bwd | {T} | orthros on FlexAttention | {t * 1e3:.4g} | {T / t:.4g} | "
          f"(first step with compile {first:.1f} s; loss {losses[0].item():.5f} vs orthros ops {ours:.5f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
