"""GPU tests of orthros._cuda (cuda/python/): the kernels called through DLPack arrays.

- attention_forward on torch CUDA tensors against the float64 oracle under SPEC §6
  (orthros.check_attention), every regime in one ragged batch, bf16/f16/f32, both kernel paths;
- deterministic mode bitwise equal across PT, SFT, prefill, chunked prefill, decode and batch
  composition, through the extension;
- the same call with raw DLPack capsules and with CuPy arrays gives the same bits;
- attention_backward against the oracle (orthros.check_attention_backward);
- rope_append_kv against orthros.rope; layer_forward / layer_backward reproducible, v = x W_V;
- bad CUDA input (non-contiguous, CUDA lengths, small workspace) raises orthros.Error.
Exits 77 (ctest: skipped) with the reason when torch with a usable CUDA device is missing.
Run: PYTHONPATH=<build>/python python3 test_cuda_module_gpu.py
"""
import os
import sys
import unittest

import numpy as np

try:
    import torch
    _REASON = None if torch.cuda.is_available() else "torch reports no usable CUDA device"
except ImportError:
    torch = None
    _REASON = "torch is not importable (the GPU tests use torch CUDA tensors)"
if _REASON is not None and __name__ == "__main__":
    print(f"SKIPPED: {_REASON}")
    sys.exit(77)

import orthros
import orthros._cuda as C

try:
    import cupy
except ImportError:
    cupy = None

SEED = int(os.environ.get("ORTHROS_TEST_SEED", "19"))
DT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32} if torch else {}


def stream():
    return torch.cuda.current_stream().cuda_stream


def rounded(shape, dtype, gen):
    """Random values in [-1, 1) rounded to `dtype`, as float32 CPU (exact)."""
    return (torch.rand(shape, generator=gen) * 2 - 1).to(DT[dtype]).float()


class Batch:
    """A ragged batch: seqs = [(P_b, T_b, T_out_b)], inputs rounded to dtype, kept on the host."""

    def __init__(self, seqs, dtype, hq, hkv, d, seed, capacity=None):
        g = torch.Generator().manual_seed(seed)
        self.seqs, self.dtype, self.hq, self.hkv, self.d = seqs, dtype, hq, hkv, d
        self.q_lens = [t for _, t, _ in seqs]
        self.out_lens = [to for _, _, to in seqs]
        self.cache_lens = [p + t for p, t, _ in seqs]
        self.cap = capacity or max(max(self.cache_lens), 1)
        self.q = rounded((sum(self.q_lens), hq, d), dtype, g)
        self.q_out = rounded((sum(self.out_lens), hq, d), dtype, g)
        self.k = rounded((len(seqs), self.cap, hkv, d), dtype, g)
        self.v = rounded((len(seqs), self.cap, hkv, d), dtype, g)

    def dev(self, t):
        return t.to(DT[self.dtype]).cuda().contiguous()

    def forward(self, window, deterministic=False, kernel="automatic", q=None, q_out=None):
        q = self.dev(self.q) if q is None else q
        q_out = self.dev(self.q_out) if q_out is None else q_out
        tq, to = q.shape[0], q_out.shape[0]
        o, o_out = torch.empty_like(q), torch.empty_like(q_out)
        lse = torch.empty((tq, self.hq), dtype=torch.float32, device="cuda")
        lse_out = torch.empty((to, self.hq), dtype=torch.float32, device="cuda")
        n = C.attention_workspace_bytes(dtype=self.dtype, num_q_heads=self.hq, num_kv_heads=self.hkv, head_dim=self.d,
                                        window=window, deterministic=deterministic, num_splits=0, q_lens=self.q_lens,
                                        out_lens=self.out_lens, cache_lens=self.cache_lens, kernel=kernel)
        ws = torch.empty(max(n, 16), dtype=torch.uint8, device="cuda")
        C.attention_forward(q=q, q_out=q_out if to else None, k_cache=self.dev(self.k), v_cache=self.dev(self.v), o=o,
                            o_out=o_out if to else None, lse=lse, lse_out=lse_out if to else None, workspace=ws,
                            q_lens=self.q_lens, out_lens=self.out_lens, cache_lens=self.cache_lens, window=window,
                            deterministic=deterministic, kernel=kernel, stream=stream())
        torch.cuda.synchronize()
        return dict(o=o, o_out=o_out, lse=lse, lse_out=lse_out)

    def per_sequence(self):
        """(b, row offset, out offset, P, T, T_out) of every sequence."""
        r = ro = 0
        for b, (p, t, to) in enumerate(self.seqs):
            yield b, r, ro, p, t, to
            r, ro = r + t, ro + to


def npf(t):
    return t.detach().float().cpu().numpy()


class Forward(unittest.TestCase):
    def test_hopper_kernels_available_matches_the_device(self):
        self.assertEqual(C.hopper_kernels_available(), torch.cuda.get_device_capability() == (9, 0))

    def check_batch(self, batch, window, **kw):
        out = batch.forward(window, **kw)
        for b, r, ro, p, t, to in batch.per_sequence():
            if t == 0:
                continue
            res = dict(o=npf(out["o"][r:r + t]), lse=npf(out["lse"][r:r + t]),
                       o_out=npf(out["o_out"][ro:ro + to]), lse_out=npf(out["lse_out"][ro:ro + to]))
            L = p + t
            rep = orthros.check_attention(res, npf(batch.q[r:r + t]), npf(batch.k[b, :L]), npf(batch.v[b, :L]),
                                          npf(batch.q_out[ro:ro + to]), window=window, dtype=batch.dtype)
            bad = {n: (x["rel_fro"], x["max_abs"], x["bad_rows"][:5])
                   for n, x in rep["tensors"].items() if not x["pass"]}
            self.assertTrue(rep["pass"], f"seq {b} (P={p}, T={t}, T_out={to}) {batch.dtype} {kw}: {bad} seed {SEED}")

    def test_every_regime_against_the_oracle(self):
        # PT, SFT, prefill, chunked prefill, decode, an idle sequence: one ragged batch.
        # Each dtype on the tensor-core D (128, 64; Hopper and mma.sync paths) and the SIMT one (48),
        # both modes; the generic kernels where automatic would pick the Hopper one.
        seqs = [(0, 300, 300), (0, 200, 50), (0, 257, 1), (300, 100, 20), (900, 1, 1), (0, 0, 0)]
        configs = [("bf16", 128, "automatic", False), ("bf16", 128, "automatic", True), ("bf16", 128, "generic", False),
                   ("bf16", 48, "automatic", True), ("f16", 64, "automatic", False), ("f16", 64, "generic", True),
                   ("f32", 128, "automatic", False), ("f32", 48, "automatic", True)]
        for dtype, d, kernel, det in configs:
            batch = Batch(seqs, dtype, 8, 2, d, SEED + d)
            self.check_batch(batch, 64, deterministic=det, kernel=kernel)


class Deterministic(unittest.TestCase):
    """SPEC §4.3 through the extension: o/o_out/lse of a position are the same bits in every regime."""

    def test_bitwise_across_regimes(self):
        N, W, H, HKV, D = 2500, 128, 8, 2, 128
        for kernel in ("automatic", "generic"):
            full = Batch([(0, N, N)], "bf16", H, HKV, D, SEED)
            q, qo = full.dev(full.q), full.dev(full.q_out)
            pt = full.forward(W, True, kernel)

            def sub(P, T, TO):
                b = Batch([(P, T, TO)], "bf16", H, HKV, D, SEED, capacity=full.cap)
                b.k, b.v = full.k, full.v
                return b.forward(W, True, kernel, q=q[P:P + T].contiguous(), q_out=qo[P + T - TO:P + T].contiguous())

            def same(a, b, what):
                self.assertTrue(torch.equal(a, b), f"{kernel}: {what}: max diff {(a.float() - b.float()).abs().max()}")

            sft = sub(0, N, 700)
            same(sft["o"], pt["o"], "SFT o")
            same(sft["o_out"], pt["o_out"][N - 700:], "SFT o_out")
            pre = sub(0, N, 1)
            same(pre["o_out"], pt["o_out"][N - 1:], "prefill o_out")
            same(pre["lse_out"], pt["lse_out"][N - 1:], "prefill lse_out")
            for P in range(0, N, 900):  # chunked prefill, chunks of 900 (crossing the 1024-key chunks)
                T = min(900, N - P)
                c = sub(P, T, T)
                same(c["o"], pt["o"][P:P + T], f"chunk at {P} o")
                same(c["lse"], pt["lse"][P:P + T], f"chunk at {P} lse")
                same(c["o_out"], pt["o_out"][P:P + T], f"chunk at {P} o_out")
            for t in (1024, 2048, N):  # decode of position t (P = t - 1)
                dcd = sub(t - 1, 1, 1)
                same(dcd["o"], pt["o"][t - 1:t], f"decode {t} o")
                same(dcd["o_out"], pt["o_out"][t - 1:t], f"decode {t} o_out")

    def test_bitwise_across_batch_composition(self):
        seqs = [(0, 700, 700), (1500, 30, 5), (2100, 1, 1)]
        batch = Batch(seqs, "f16", 8, 2, 64, SEED)
        together = batch.forward(128, True)
        for b, r, ro, p, t, to in batch.per_sequence():
            one = Batch([seqs[b]], "f16", 8, 2, 64, SEED, capacity=batch.cap)
            one.k, one.v = batch.k[b:b + 1], batch.v[b:b + 1]
            alone = one.forward(128, True, q=batch.dev(batch.q[r:r + t]), q_out=batch.dev(batch.q_out[ro:ro + to]))
            for k, rows in (("o", slice(r, r + t)), ("lse", slice(r, r + t)), ("o_out", slice(ro, ro + to))):
                self.assertTrue(torch.equal(alone[k], together[k][rows]), f"sequence {b} {k}")


class OtherProducers(unittest.TestCase):
    """A raw DLPack capsule and a CuPy array through the same entry: the same bits as torch tensors."""

    def setUp(self):
        self.batch = Batch([(0, 96, 96), (500, 20, 3)], "f16", 4, 2, 64, SEED)
        self.ref = self.batch.forward(32, True)
        self.shapes = dict(o=self.ref["o"], o_out=self.ref["o_out"], lse=self.ref["lse"], lse_out=self.ref["lse_out"])

    def lens(self):
        b = self.batch
        return dict(q_lens=b.q_lens, out_lens=b.out_lens, cache_lens=b.cache_lens, window=32, deterministic=True)

    def test_raw_capsules(self):
        from torch.utils.dlpack import to_dlpack
        b = self.batch
        outs = {k: torch.full_like(v, 7) for k, v in self.shapes.items()}
        ins = dict(q=b.dev(b.q), q_out=b.dev(b.q_out), k_cache=b.dev(b.k), v_cache=b.dev(b.v))
        args = {k: to_dlpack(v) for k, v in list(ins.items()) + list(outs.items())}
        C.attention_forward(**args, **self.lens(), stream=stream())
        torch.cuda.synchronize()
        for k in outs:
            self.assertTrue(torch.equal(outs[k], self.ref[k]), k)

    @unittest.skipIf(cupy is None, "CuPy is not importable: the CuPy producer is not tested")
    def test_cupy_arrays(self):
        b = self.batch
        ins = {k: cupy.asarray(npf(getattr(b, a)).astype(np.float16))
               for k, a in (("q", "q"), ("q_out", "q_out"), ("k_cache", "k"), ("v_cache", "v"))}
        outs = {k: cupy.full(tuple(v.shape), 7, dtype=np.float16 if v.dtype == torch.float16 else np.float32)
                for k, v in self.shapes.items()}
        C.attention_forward(**ins, **outs, **self.lens(), stream=cupy.cuda.get_current_stream().ptr)
        cupy.cuda.get_current_stream().synchronize()
        for k in outs:
            got, ref = cupy.asnumpy(outs[k]), self.ref[k].cpu().numpy()
            self.assertEqual(got.dtype, ref.dtype, k)
            self.assertTrue(np.array_equal(got.view(np.uint8), ref.view(np.uint8)), f"{k}: not the same bits")

    def test_errors_on_cuda_arrays(self):
        b = self.batch
        base = dict(q=b.dev(b.q), q_out=b.dev(b.q_out), k_cache=b.dev(b.k), v_cache=b.dev(b.v),
                    **{k: torch.empty_like(v) for k, v in self.shapes.items()}, **self.lens())
        wide = torch.empty((b.q.shape[0], b.hq, 2 * b.d), dtype=torch.float16, device="cuda")
        for over, frag in ((dict(q=wide[..., ::2]), "q must be C-contiguous"),
                           (dict(q_lens=torch.tensor(b.q_lens, device="cuda")), "q_lens must be host-side"),
                           (dict(lse=base["lse"].half()), "lse must be a float32 array"),
                           (dict(workspace=torch.empty(16, dtype=torch.uint8, device="cuda"), num_splits=4,
                                 deterministic=False),  # 4 splits of the output rows need partial states
                            "workspace_bytes must be >= "),
                           (dict(kernel="hopper", k_cache=base["k_cache"].float(), v_cache=base["v_cache"].float()),
                            "k_cache must have dtype f16")):
            with self.assertRaises(orthros.Error) as cm:
                C.attention_forward(**dict(base, **over))
            self.assertIn(frag, str(cm.exception))
        torch.cuda.synchronize()  # nothing was left broken on the device


class Backward(unittest.TestCase):
    def test_against_the_oracle(self):
        seqs = [(0, 300, 300), (0, 200, 37), (0, 64, 0)]
        # One (dtype, D) per kernel family of the backward: mma.sync for bf16/f16, SIMT for f32.
        for dtype, d in (("bf16", 128), ("f16", 64), ("f32", 128)):
            b = Batch(seqs, dtype, 8, 2, d, SEED + 3)
            g = torch.Generator().manual_seed(SEED + 4)
            fwd = b.forward(64)
            d_o, d_o_out = rounded(b.q.shape, dtype, g), rounded(b.q_out.shape, dtype, g)
            tq = b.q.shape[0]
            dq, dq_out = torch.empty_like(fwd["o"]), torch.empty_like(fwd["o_out"])
            dk = torch.empty((tq, b.hkv, d), dtype=DT[dtype], device="cuda")
            dv = torch.empty_like(dk)
            n = C.attention_backward_workspace_bytes(dtype=dtype, num_q_heads=8, num_kv_heads=2, head_dim=d,
                                                     window=64, deterministic=False, q_lens=b.q_lens,
                                                     out_lens=b.out_lens, cache_lens=b.cache_lens)
            C.attention_backward(q=b.dev(b.q), q_out=b.dev(b.q_out), k_cache=b.dev(b.k), v_cache=b.dev(b.v),
                                 o=fwd["o"], o_out=fwd["o_out"], lse=fwd["lse"], lse_out=fwd["lse_out"],
                                 d_o=b.dev(d_o), d_o_out=b.dev(d_o_out), dq=dq, dq_out=dq_out, dk=dk, dv=dv,
                                 workspace=torch.empty(n, dtype=torch.uint8, device="cuda"), q_lens=b.q_lens,
                                 out_lens=b.out_lens, cache_lens=b.cache_lens, window=64, stream=stream())
            torch.cuda.synchronize()
            for bi, r, ro, p, t, tout in b.per_sequence():
                res = dict(dq=npf(dq[r:r + t]), dq_out=npf(dq_out[ro:ro + tout]), dk=npf(dk[r:r + t]),
                           dv=npf(dv[r:r + t]))
                rep = orthros.check_attention_backward(
                    res, npf(b.q[r:r + t]), npf(b.k[bi, :t]), npf(b.v[bi, :t]), npf(b.q_out[ro:ro + tout]),
                    npf(d_o[r:r + t]), npf(d_o_out[ro:ro + tout]), window=64, dtype=dtype)
                bad = {k: (x["rel_fro"], x["max_abs"]) for k, x in rep["tensors"].items() if not x["pass"]}
                self.assertTrue(rep["pass"], f"{dtype} D={d} seq {bi} (T={t}, T_out={tout}): {bad} seed {SEED}")


class RopeAppend(unittest.TestCase):
    def test_against_orthros_rope(self):
        seqs = [(5, 40, 3), (0, 17, 17)]
        for dtype, eps in (("f32", 2.0 ** -24), ("f16", 2.0 ** -11), ("bf16", 2.0 ** -8)):
            b = Batch(seqs, dtype, 4, 2, 64, SEED + 5)
            g = torch.Generator().manual_seed(SEED + 6)
            k_new, v_new = rounded((sum(b.q_lens), 2, 64), dtype, g), rounded((sum(b.q_lens), 2, 64), dtype, g)
            kc, vc, q, qo = b.dev(b.k), b.dev(b.v), b.dev(b.q), b.dev(b.q_out)
            theta, offset = 1e6, 3
            C.rope_append_kv(k_new=b.dev(k_new), v_new=b.dev(v_new), k_cache=kc, v_cache=vc, q=q, q_out=qo,
                             q_lens=b.q_lens, out_lens=b.out_lens, cache_lens=b.cache_lens, theta=theta,
                             position_offset=offset, num_q_heads=4, stream=stream())
            torch.cuda.synchronize()
            for bi, r, ro, p, t, to in b.per_sequence():
                pos = [p + j + offset for j in range(t)]
                # The kernel rotates in float32 from float32 cos/sin (attention.hpp): each output is
                # a*c - b*s with c, s, both products and the difference rounded (5 roundings of
                # relative 2^-24) and then once to the dtype (relative eps), so
                # |got - exact| <= eps |exact| + 6 * 2^-24 (|a| + |b|).
                for name, got, src, rows in (("k_cache", kc[bi, p:p + t], k_new[r:r + t], pos),
                                             ("q", q[r:r + t], b.q[r:r + t], pos),
                                             ("q_out", qo[ro:ro + to], b.q_out[ro:ro + to], pos[t - to:])):
                    exact = orthros.rope(npf(src).astype(np.float64), rows, theta)
                    a = np.abs(npf(src).astype(np.float64))
                    pair = a + np.concatenate([a[..., 32:], a[..., :32]], axis=-1)
                    err = np.abs(npf(got) - exact)
                    # (f16: plus half its subnormal spacing, 2^-25, where a result underflows.)
                    bound = eps * np.abs(exact) + 6 * 2.0 ** -24 * pair + (2.0 ** -25 if dtype == "f16" else 0)
                    self.assertTrue((err <= bound).all(), f"{dtype} {name} seq {bi}: worst {(err - bound).max()}")
                self.assertTrue(torch.equal(vc[bi, p:p + t].float().cpu(), v_new[r:r + t]), f"{dtype} v seq {bi}")


class Layer(unittest.TestCase):
    def test_forward_backward(self):
        dm, hq, hkv, d = 256, 4, 2, 64
        cfg = dict(dtype="bf16", d_model=dm, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, window=32,
                   rope_theta=1e4, qk_norm=True, rms_eps=1e-6, deterministic=True)
        lens = dict(q_lens=[70, 33], out_lens=[70, 5], cache_lens=[70, 33])
        g = torch.Generator().manual_seed(SEED + 7)

        def r(*shape, scale=1.0):
            return (rounded(shape, "bf16", g) * scale).to(torch.bfloat16).cuda()
        tq, to = 103, 75
        w = dict(w_q=r(dm, hq * d, scale=0.1), w_k=r(dm, hkv * d, scale=0.1), w_v=r(dm, hkv * d, scale=0.1),
                 w_o=r(hq * d, dm, scale=0.1), alpha=r(hq * d), beta=r(hq * d), alpha_out=r(hq * d),
                 beta_out=r(hq * d), q_norm=r(d), k_norm=r(d))
        x, x_out = r(tq, dm), r(to, dm)
        outs = []
        for _ in range(2):
            kc = torch.zeros((2, 80, hkv, d), dtype=torch.bfloat16, device="cuda")
            vc = torch.zeros_like(kc)
            y, y_out = torch.empty_like(x), torch.empty_like(x_out)
            C.layer_forward(**cfg, **lens, **w, x=x, x_out=x_out, k_cache=kc, v_cache=vc, y=y, y_out=y_out,
                            stream=stream())
            torch.cuda.synchronize()
            outs.append((y, y_out, kc, vc))
        y, y_out, kc, vc = outs[0]
        for a, b_ in zip(outs[0], outs[1]):
            self.assertTrue(torch.equal(a, b_), "layer_forward is not reproducible")
        self.assertTrue(torch.isfinite(y).all() and torch.isfinite(y_out).all() and y.abs().max() > 0)
        # v = x W_V appended (cuBLAS, float32 accumulation, one rounding to bf16). The bf16 x bf16
        # products are exact in float32; each float32 sum of n = 256 terms is within
        # n 2^-24 sum|x_i w_i| of the exact dot product in any order, so cuBLAS's and torch's
        # (TF32 off) differ by at most 2 n 2^-24 sum|x_i w_i|, plus the one rounding to bf16 (2^-8).
        torch.backends.cuda.matmul.allow_tf32 = False
        ref = x.float() @ w["w_v"].float()
        absdot = x.float().abs() @ w["w_v"].float().abs()
        got = torch.cat([vc[0, :70], vc[1, :33]]).reshape(tq, hkv * d).float()
        bound = 2.0 ** -8 * ref.abs() + 2 * dm * 2.0 ** -24 * absdot
        self.assertTrue(((got - ref).abs() <= bound).all(), f"v cache: worst {((got - ref).abs() - bound).max()}")
        grads = {k: torch.full_like(v, 3) for k, v in (("dx", x), ("dx_out", x_out))}
        grads.update({"d" + k: torch.full_like(v, 3) for k, v in w.items()})
        dy, dy_out = r(tq, dm), r(to, dm)
        ws = torch.empty(C.layer_backward_workspace_bytes(**cfg, **lens), dtype=torch.uint8, device="cuda")
        runs = []
        for _ in range(2):
            gr = {k: torch.empty_like(v) for k, v in grads.items()}
            C.layer_backward(**cfg, **lens, **w, **gr, x=x, x_out=x_out, dy=dy, dy_out=dy_out, workspace=ws,
                             stream=stream())
            torch.cuda.synchronize()
            runs.append(gr)
        for k in grads:
            self.assertTrue(torch.equal(runs[0][k], runs[1][k]), f"layer_backward {k} is not reproducible")
            self.assertTrue(torch.isfinite(runs[0][k]).all(), k)
        # dW_O = o^T dy + o'^T dy': nonzero for nonzero dy; dx is what flows to the previous layer.
        self.assertGreater(runs[0]["dw_o"].abs().max().item(), 0)
        self.assertGreater(runs[0]["dx"].abs().max().item(), 0)


if __name__ == "__main__":
    print(f"device: {torch.cuda.get_device_name()}, seed {SEED}, cupy: {cupy.__version__ if cupy else None}")
    unittest.main()
