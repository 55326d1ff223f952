"""Training-throughput peer: the same converted Orthros model with its attention layers computed by
FlexAttention (the streams of examples/pytorch_port/torch_port.py: a sliding-window block mask for
the base queries, a causal one over the base keys for the output queries) instead of the orthros
ops; projections, QK-norm, scale-offset and RoPE in plain torch. Forward + backward at T = 8K, bf16;
appended to OUT/bench.json as part "train fwd+bwd", impl "orthros on FlexAttention".

    python gpu_flex.py --out OUT [--small --device cpu]
"""
import argparse
import copy
import json
import sys
from pathlib import Path

import torch

from gpu_common import QWEN3_06B, TINY, env_line, ot, qwen3, timed


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
        key = (n, n_out, window)
        if key not in self.masks:
            from torch.nn.attention.flex_attention import create_block_mask
            off = n - n_out
            base = create_block_mask(lambda b, h, q, k: (k <= q) & (k > q - window), None, None, n, n, device=device)
            out = create_block_mask(lambda b, h, q, k: k <= q + off, None, None, n_out, n, device=device)
            self.masks[key] = (base, out)
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
        base, out = self._mask(n, n_out, a.window, x.device)
        th = lambda t: t.permute(1, 0, 2)[None]  # noqa: E731  [1, heads, rows, D]
        o = self.flex(th(q), th(k), th(v), block_mask=base, enable_gqa=True)
        o_out = self.flex(th(qo), th(k), th(v), block_mask=out, enable_gqa=True)
        un = lambda t: t[0].permute(1, 0, 2).reshape(t.shape[2], H * D)  # noqa: E731
        return un(o) @ a.w_o, un(o_out) @ a.w_o


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
    with torch.no_grad():  # the peer computes the same function (a loose sanity bound, not a proof)
        d = (flex_model(ids[:, :512]).logits.float() - model(ids[:, :512]).logits.float()).abs().max().item()
    flex_model.train()

    def step():
        flex_model.zero_grad(set_to_none=True)
        flex_model(ids, labels=ids).loss.backward()

    t = timed(step, a.device, warmup=2, reps=3)
    row = dict(part="train fwd+bwd", T=T, impl="orthros on FlexAttention", ms=t * 1e3, tokens_per_s=T / t,
               max_abs_logits_vs_ours_T512=d)
    print(json.dumps(row))
    path = Path(a.out) / "bench.json"
    rows = json.loads(path.read_text()) if path.exists() else []
    path.write_text(json.dumps(rows + [row], indent=1))
    print(f"| train fwd+bwd | {T} | orthros on FlexAttention | {t * 1e3:.4g} | {T / t:.4g} | "
          f"(max |logits - ours| at T=512: {d:.3g}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
