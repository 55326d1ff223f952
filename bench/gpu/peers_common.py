"""Shared by the PyTorch-side benchmark scripts (peers.py, peers_backward.py,
peers_backward_interleaved.py, bench_torch_ops.py): the attention shape, the command line, CUDA-event
timing (timed_ms; sample_ms flushes the L2 before every sample, as the C++ benchmarks' GPU harness
does) and the row recorder.

Each runs as `python3 bench/gpu/<script>.py` (ci/gpu.sh, ci/gpu_backward.sh, ci/gpu_torch.sh), so this
directory is on sys.path and `import peers_common` finds this file.
"""
import argparse

import torch

HQ, HKV, D, W = 32, 8, 128, 128  # qwen3-8b attention shape, Orthros window


CALLS_PER_SAMPLE = [1]  # --b2b N: N calls back to back per timed sample (host work overlaps the GPU)


def parse_args():
    """--runs N (default 25), --json FILE, --quick, --b2b N (calls per timed sample, default 1)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=25)
    ap.add_argument("--json", default="")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--b2b", type=int, default=1)
    args = ap.parse_args()
    CALLS_PER_SAMPLE[0] = max(1, args.b2b)
    return args


_L2_FLUSH = []  # the flush buffer, allocated on first use


def flush_l2():
    """Overwrites a buffer of max(256 MiB, 4 x L2) bytes, evicting the previous call's data from the
    L2 (as triton's do_bench and nvbench do, and the C++ benchmarks' L2Flush: the same size)."""
    if not _L2_FLUSH:
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
        _L2_FLUSH.append(torch.empty(max(256 << 20, 4 * l2), dtype=torch.uint8, device="cuda"))
        print(f"L2 ({l2 >> 20} MiB) flushed before every timed sample by a memset of "
              f"{_L2_FLUSH[0].numel() >> 20} MiB", flush=True)
    _L2_FLUSH[0].zero_()


def sample_ms(fn):
    """One CUDA-event-timed sample of fn in ms per call: an L2 flush and a synchronization (neither
    timed), then CALLS_PER_SAMPLE[0] calls back to back. The interval includes the host's work
    before the first call's first kernel reaches the idle GPU; more calls per sample overlap it
    with the GPU's work."""
    flush_l2()
    torch.cuda.synchronize()
    return timed_ms(fn, CALLS_PER_SAMPLE[0])


def timed_ms(fn, calls):
    """`calls` calls of fn back to back between two CUDA events, in ms per call (no flush, no
    synchronization before: the caller's choice)."""
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(calls):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / calls


def median_ms(fn, runs, warm=3):
    """Median of `runs` samples of fn (sample_ms) after `warm` untimed calls, in ms per call."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = sorted(sample_ms(fn) for _ in range(runs))
    return ts[len(ts) // 2]


class Recorder:
    """rows (the JSON's "rows") and record(name, shape, fn[, runs]): times fn, appends a row and prints
    a line; a failure (a backend may refuse a shape) is recorded with its error instead. Column widths,
    how much of an error is kept/printed and whether the CUDA cache is emptied after each row are the
    caller's, so each script's output stays as it was."""

    def __init__(self, runs, name_width, shape_width, error_chars, print_chars, empty_cache):
        self.rows = []
        self.runs = runs
        self.name_width, self.shape_width = name_width, shape_width
        self.error_chars, self.print_chars = error_chars, print_chars
        self.empty_cache = empty_cache

    def record(self, name, shape, fn, runs=None):
        head = f"{name:{self.name_width}s} {shape:{self.shape_width}s}"
        try:
            ms = median_ms(fn, self.runs if runs is None else runs)
            self.rows.append({"name": name, "shape": shape, "median_ms": ms})
            print(f"{head} {ms:10.4f} ms", flush=True)
        except Exception as e:
            self.rows.append({"name": name, "shape": shape, "median_ms": None,
                              "error": f"{type(e).__name__}: {e}"[:self.error_chars]})
            print(f"{head} FAILED {type(e).__name__}: {str(e)[:self.print_chars]}", flush=True)
        if self.empty_cache:
            torch.cuda.empty_cache()
