"""The SM clock and power while a backward runs back to back: cuDNN's causal backward (PyTorch
SDPA, cuDNN backend) at T = 32K, qwen3-8b shape, bf16, N timed runs after 3 warm-ups, each run's
time printed with the wall-clock window, so nvidia-smi's samples can be matched to it.
  python3 clock_probe.py [N]"""
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

n = int(sys.argv[1]) if len(sys.argv) > 1 else 30
T, HQ, HKV, D = 32768, 32, 8, 128
torch.manual_seed(7)
q = torch.randn(1, HQ, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
k = torch.randn(1, HKV, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
v = torch.randn(1, HKV, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
do = torch.randn_like(o)
times = []
t_start = time.time()
for i in range(n + 3):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    b.record()
    b.synchronize()
    if i >= 3:
        times.append(a.elapsed_time(b))
t_end = time.time()
times.sort()
print(f"cudnn causal bwd 32K: median {times[len(times) // 2]:.3f} ms over {n}; window {t_start:.3f} {t_end:.3f}")
