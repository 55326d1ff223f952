"""The compiled CUDA entry orthros._cuda (a CUDA build's extension, DLPack arrays; its interface is
in docs/torch.md), loaded on first use, and what the ops hand it: the current stream and a
workspace allocated by torch's caching allocator (so a CUDA graph can capture the call)."""
import torch

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


def stream_of(device):
    """cudaStream_t handle of torch's current stream on `device` (0 = the legacy default stream)."""
    return torch.cuda.current_stream(device).cuda_stream


def workspace(nbytes, device):
    """A uint8 buffer of at least `nbytes` bytes on `device` from torch's allocator (its blocks are
    512-byte aligned, beyond the 256 bytes the kernels need); never empty, so its pointer is valid."""
    return torch.empty(max(int(nbytes), 256), dtype=torch.uint8, device=device)
