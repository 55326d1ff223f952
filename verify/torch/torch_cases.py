"""Seeded random inputs of the attention op in every regime, an independent dense float64
reference of Orthros attention written from SPEC §2 in plain torch, and the golden-suite helper.
Every case carries its seed in its name (printed by pytest on failure)."""
import math
import os
import subprocess

import torch

import orthros.torch as ot

# name -> (per-sequence (T, T_out, P), H_q, H_kv, D, window). The regimes the GPU tests run
# (test_gpu.py) have D = 16, a head dim the CUDA kernels take (a multiple of 16 in [16, 256]);
# D = 8 stays covered on the CPU by prefill, window_1 and window_beyond_context.
REGIMES = {
    "pt": ([(37, 37, 0)], 4, 2, 16, 8),
    "sft": ([(29, 6, 0)], 4, 1, 16, 5),
    "prefill": ([(33, 1, 0)], 2, 2, 8, 7),
    "chunked_prefill": ([(11, 0, 22)], 4, 2, 16, 9),
    "chunked_prefill_last": ([(9, 1, 24)], 4, 2, 16, 9),
    "decode": ([(1, 1, 40)], 6, 2, 16, 12),
    "ragged": ([(13, 13, 0), (1, 1, 30), (8, 0, 5), (17, 3, 9)], 4, 2, 16, 6),
    "ragged_training": ([(13, 13, 0), (7, 2, 0), (21, 21, 0)], 4, 2, 16, 4),
    "window_1": ([(10, 4, 0)], 2, 1, 8, 1),
    "window_beyond_context": ([(12, 12, 3)], 2, 2, 8, 100),
}
# small enough for finite differences (torch.autograd.gradcheck perturbs every input entry)
GRAD_REGIMES = {
    "grad_sft": ([(7, 3, 0)], 2, 1, 4, 3),
    "grad_ragged": ([(6, 6, 0), (1, 1, 0), (5, 2, 0)], 4, 2, 4, 2),
}
REGIMES_ALL = {**REGIMES, **GRAD_REGIMES}


def make_case(regime, seed, dtype=torch.float64, device="cpu", capacity_extra=3):
    """Inputs of a regime: q, q_out, k_cache, v_cache (rows 0..P_b+T_b-1 filled, the rest random
    too: rows beyond cache_seqlens must never be read), lengths, window."""
    seqs, Hq, Hkv, D, w = REGIMES_ALL[regime]
    g = torch.Generator().manual_seed(seed)
    B = len(seqs)
    cap = max(T + P for T, _, P in seqs) + capacity_extra
    n, n_out = sum(T for T, _, _ in seqs), sum(To for _, To, _ in seqs)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)

    return dict(q=rnd(n, Hq, D), q_out=rnd(n_out, Hq, D), k_cache=rnd(B, cap, Hkv, D), v_cache=rnd(B, cap, Hkv, D),
                cu_seqlens_q=ot.cu_seqlens([T for T, _, _ in seqs]),
                cu_seqlens_out=ot.cu_seqlens([To for _, To, _ in seqs]),
                cache_seqlens=torch.tensor([T + P for T, _, P in seqs], dtype=torch.int32), window=w, seqs=seqs)


def op_args(c):
    return (c["q"], c["q_out"], c["k_cache"], c["v_cache"], c["cu_seqlens_q"], c["cu_seqlens_out"], c["cache_seqlens"],
            c["window"])


def dense_reference(q, q_out, k_cache, v_cache, seqs, window, scale=None):
    """Orthros attention from SPEC §2 in float64 torch, one sequence at a time: the base query of
    absolute position t attends to keys max(1, t-w+1)..t, the output query of position t to 1..t;
    GQA: query head h reads KV head h // (H_q / H_kv). Returns o, o_out, lse, lse_out."""
    Hq, D, Hkv = q.shape[1], q.shape[2], k_cache.shape[2]
    s = (1.0 / math.sqrt(D)) if scale is None else scale
    outs = {n: [] for n in ("o", "o_out", "lse", "lse_out")}
    b0 = o0 = 0
    for b, (T, T_out, P) in enumerate(seqs):
        k = k_cache[b, :P + T].double().repeat_interleave(Hq // Hkv, dim=1)  # [L, H_q, D]
        v = v_cache[b, :P + T].double().repeat_interleave(Hq // Hkv, dim=1)
        key = torch.arange(P + T)
        for name, qq, pos, w in (("", q[b0:b0 + T], P + torch.arange(T), window),
                                 ("_out", q_out[o0:o0 + T_out], P + T - T_out + torch.arange(T_out), None)):
            sc = torch.einsum("thd,jhd->htj", qq.double(), k) * s
            allowed = key[None, :] <= pos[:, None]
            if w is not None:
                allowed &= key[None, :] > pos[:, None] - w
            sc = sc.masked_fill(~allowed[None], float("-inf"))
            lse = torch.logsumexp(sc, dim=-1)  # [H, rows]
            p = torch.exp(sc - lse[..., None])
            outs["o" + name].append(torch.einsum("htj,jhd->thd", p, v))
            outs["lse" + name].append(lse.T)
        b0, o0 = b0 + T, o0 + T_out
    return {n: torch.cat(v) if v else None for n, v in outs.items()}


def orthros_binary():
    """Path of the `orthros` command (ORTHROS, else <build>/verify/cli/orthros next to the package)."""
    path = os.environ.get("ORTHROS")
    if path:
        return path
    import orthros
    build = os.path.dirname(os.path.dirname(os.path.dirname(orthros.__file__)))
    return os.path.join(build, "verify", "cli", "orthros")


def write_golden(out_dir, *args):
    subprocess.run([orthros_binary(), "golden", "--out", str(out_dir), *args], check=True, capture_output=True)
    return str(out_dir)
