"""The compiled CUDA entry orthros._cuda (a CUDA build's extension, DLPack arrays; its interface is
in docs/torch.md), loaded on first use, and what the ops hand it: the current stream and a
workspace allocated by torch's caching allocator (so a CUDA graph can capture the call)."""
import contextlib

import torch
from torch.utils.dlpack import to_dlpack

from .. import _core

_module = None
_import_error = None


def cuda_module():
    """orthros._cuda, or orthros.Error saying why a CUDA tensor cannot be served."""
    global _module, _import_error
    if _module is None and _import_error is None:
        try:
            from .. import _cuda  # noqa: PLC0415  (only a CUDA build has it)
            _module = _cuda
        except ImportError as e:
            _import_error = e
    if _module is None:
        raise _core.Error("orthros was built without CUDA kernels (no module orthros._cuda: "
                          f"{_import_error}); build it with -C cmake.define.ORTHROS_CUDA=ON, or call the op on CPU "
                          "tensors (float32/float64, the oracle)")
    return _module


def available():
    """True when orthros._cuda loads (a CUDA build) and torch sees a CUDA device."""
    try:
        cuda_module()
    except _core.Error:
        return False
    return torch.cuda.is_available()


# torch's current-stream query as a raw cudaStream_t int (the call torch.compile's generated code
# makes per kernel launch; ~0.1 us against ~2-5 us for torch.cuda.current_stream(), which builds a
# torch.cuda.Stream object). Absent from a torch build: the public call below.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream_of(device):
    """cudaStream_t handle of torch's current stream on `device` (0 = the legacy default stream)."""
    if _raw_stream is not None:
        return _raw_stream(device.index if device.index is not None else torch.cuda.current_device())
    return torch.cuda.current_stream(device).cuda_stream


def device_guard(device):
    """A context that makes `device` current for the extension call (the extension sets no device
    and rejects arrays off the current one); a no-op context when it is current already (the usual
    case: entering torch.cuda.device costs two device exchanges)."""
    if device.index is None or device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def dlpack(t):
    """The DLPack capsule of tensor `t` (None stays None), handed to orthros._cuda instead of the
    tensor: the extension then reads the capsule directly (~1 us) rather than calling the tensor's
    __dlpack_device__ and __dlpack__ methods (Python code in torch, ~6-12 us per tensor on the
    development machine). to_dlpack makes no stream synchronization, as the extension's own
    __dlpack__(stream=-1) export; the extension checks the capsule's dtype, shape, strides,
    alignment and device as it checks a tensor's, naming the argument."""
    return None if t is None else to_dlpack(t)


class SizeCache:
    """Workspace sizes by (config, lengths) key: a call with a layout seen before (a fixed training
    packing, a benchmark, a CUDA-graph batch) skips the extension's size query. Bounded: cleared
    when it holds `limit` keys (a decode loop's growing cache lengths give a new key per step)."""

    def __init__(self, limit=256):
        self.limit, self.sizes = limit, {}

    def get(self, key, compute):
        n = self.sizes.get(key)
        if n is None:
            n = compute()
            if len(self.sizes) >= self.limit:
                self.sizes.clear()
            self.sizes[key] = n
        return n


def workspace(nbytes, device):
    """A uint8 buffer of at least `nbytes` bytes on `device` from torch's allocator (its blocks are
    512-byte aligned, beyond the 256 bytes the kernels need); never empty, so its pointer is valid.
    A fresh buffer per call (the caching allocator makes it cheap, ~3 us): a buffer kept across
    calls would be shared by CUDA graphs replayed on different streams."""
    return torch.empty(max(int(nbytes), 256), dtype=torch.uint8, device=device)
