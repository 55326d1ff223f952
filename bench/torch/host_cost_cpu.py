"""Host cost of the Python part of orthros.torch's CUDA attention path, on CPU tensors: the op
body of an earlier commit (--before REV, default eae9158: before the host-cost changes) and of the
working tree, with a stand-in for orthros._cuda that does at the Python boundary
what the real extension does (a tensor argument: its __dlpack_device__() and __dlpack__() methods; a
capsule: nothing in Python) and no C++ work (the same in both). Device context and stream lookup
need a GPU: not timed here (old: torch.cuda.device enter/exit + torch.cuda.current_stream).
Usage: PYTHONPATH=<build>/python python3 bench/torch/host_cost_cpu.py [--before REV]
(a benchmark, not a test; prints microseconds per call, the minimum of 7 runs of 4000 calls)."""
import argparse
import contextlib, subprocess, sys, time, types, importlib.util
import torch
import orthros.torch as ot
from orthros.torch import _attention as NEW, _cuda_backend as CB

def tm(f, n=4000, reps=7):
    for _ in range(200): f()
    best = 1e9
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(n): f()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    return best

class FakeExt:
    calls = 0
    def attention_workspace_bytes(self, **kw):
        FakeExt.calls += 1
        return 1 << 16
    attention_backward_workspace_bytes = attention_workspace_bytes
    def attention_forward(self, **kw):
        for v in kw.values():
            if isinstance(v, torch.Tensor):
                v.__dlpack_device__(); v.__dlpack__()
    attention_backward = attention_forward

ap = argparse.ArgumentParser()
ap.add_argument("--before", default="eae9158")
BEFORE = ap.parse_args().before
fake = FakeExt()
# the old package, from git HEAD, under other op names
root = subprocess.check_output(["git", "rev-parse", "--show-toplevel"], text=True).strip()
def old_module(name, path, repl):
    src = subprocess.check_output(["git", "show", f"{BEFORE}:{path}"], text=True, cwd=root)
    for a, b in repl: src = src.replace(a, b)
    m = types.ModuleType("orthros.torch." + name); m.__package__ = "orthros.torch"
    sys.modules[m.__name__] = m
    exec(compile(src, path, "exec"), m.__dict__)
    return m
OC = old_module("_old_checks", "reference/python/orthros/torch/_checks.py", [])
OLD = old_module("_old_attention", "reference/python/orthros/torch/_attention.py",
                 [("orthros::", "orthros_old::"), ("from . import _checks as C", "from . import _old_checks as C")])
OLD.cuda_module = lambda: fake
OLD.stream_of = lambda d: 0
NEW.cuda_module = lambda: fake
NEW.stream_of = lambda d: 0
NEW.device_guard = lambda d: contextlib.nullcontext()
torch.cuda.device = lambda d: contextlib.nullcontext()  # the old code's context (GPU-only)

def old_body(q, q_out, k, v, cq, co, cs, w):
    OC.check_attention_shapes(q, q_out, k, v)
    ql, ol, cl = OLD._layout(q, q_out, k, cq, co, cs)
    return OLD._attention_cuda(q, q_out, k, v, ql, ol, cl, w, None, False)

def new_body(q, q_out, k, v, cq, co, cs, w):
    return NEW._attention_cuda(q, q_out, k, v, cq, co, cs, w, None, False)

rows = []
for name, B, T, T_out, P in (("decode B=1", 1, 1, 1, 63), ("decode B=16", 16, 1, 1, 63), ("prefill", 1, 256, 1, 0)):
    Hq, Hkv, D = 32, 8, 128
    q = torch.randn(B * T, Hq, D); qo = torch.randn(B * T_out, Hq, D)
    k = torch.randn(B, P + T, Hkv, D); v = torch.randn(B, P + T, Hkv, D)
    cq, co = ot.cu_seqlens([T] * B), ot.cu_seqlens([T_out] * B)
    cs = torch.tensor([P + T] * B, dtype=torch.int32)
    args = (q, qo, k, v, cq, co, cs, 128)
    t_old, t_new = tm(lambda: old_body(*args)), tm(lambda: new_body(*args))
    t_chk_old = tm(lambda: (OC.check_attention_shapes(q, qo, k, v), OLD._layout(q, qo, k, cq, co, cs)))
    t_chk_new = tm(lambda: NEW.C.lengths(cq, co, cs))
    rows.append((name, t_old, t_new, t_chk_old, t_chk_new))
print("| case | op body before us | after us | checks+lengths before | after |")
print("|---|---|---|---|---|")
for r in rows:
    print(f"| {r[0]} | {r[1]:.1f} | {r[2]:.1f} | {r[3]:.1f} | {r[4]:.1f} |")
q = torch.randn(1, 32, 128)
print(f"export per tensor: __dlpack_device__ + __dlpack__ {tm(lambda: (q.__dlpack_device__(), q.__dlpack__())):.2f} us, "
      f"to_dlpack {tm(lambda: CB.dlpack(q)):.2f} us")
