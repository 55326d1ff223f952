"""The .safetensors reader of SPEC §5 on NumPy alone: the one implementation behind
`orthros.testing.read_safetensors` and the example ports' `st_io.read`
(examples/pytorch_port/st_io.py loads this file by its path in a checkout, so the examples keep
needing NumPy only, not the compiled `orthros._core` that `import orthros` loads). It imports
nothing from the package and must stay that way.
"""
import json
import math
import os
import stat
import struct

import numpy as np

__all__ = ["NP_DTYPES", "read_safetensors", "require_regular_file"]

NP_DTYPES = {"F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2")}
_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def require_regular_file(path, what="a .safetensors file"):
    """Raises ValueError unless `path` is a regular file (or a link to one), checked with stat
    before anything opens it: a FIFO would block open() and a device such as /dev/zero never ends."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ValueError(f"cannot open {os.fspath(path)!r}: no such file") from None
    if not stat.S_ISREG(mode):
        kind = next((k for test, k in _KINDS if test(mode)), "a special file")
        raise ValueError(f"{os.fspath(path)!r} is {kind}, not {what}")


def read_safetensors(path):
    """Reads a .safetensors file (SPEC §5; docs/file-format.md) with NumPy alone.

    Returns (tensors, metadata): tensors maps each name to a NumPy array of the stored shape
    (F64, F32, F16 keep their dtype; BF16, which NumPy lacks, is widened to float32 exactly), and
    metadata is the header's `__metadata__` dict of strings (empty when absent). Raises
    ValueError naming the file for a path that is not a regular file, a truncated file, a header
    that is not JSON, or a tensor whose dtype is not F64/F32/F16/BF16 or whose byte range
    `data_offsets` does not fit its shape or the file; OSError when it cannot be read."""
    require_regular_file(path)
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} bytes exceeds the file ({len(raw) - 8} bytes after the "
                         "length field); file truncated or not safetensors")
    try:
        header = json.loads(raw[8:8 + n])
    except ValueError as e:
        raise ValueError(f"{path}: header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: header must be a JSON object")
    data = memoryview(raw)[8 + n:]
    meta = header.pop("__metadata__", None) or {}
    out = {}
    for name, t in header.items():
        try:
            b, e = (int(x) for x in t["data_offsets"])
            shape = tuple(int(x) for x in t["shape"])
            dtype = t["dtype"]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}: tensor {name}: entry needs dtype, shape and data_offsets") from None
        if dtype not in _ITEMSIZE:
            raise ValueError(f"{path}: tensor {name}: dtype {dtype} not supported")
        need = math.prod(shape) * _ITEMSIZE[dtype]
        if not 0 <= b <= e or e - b != need:
            raise ValueError(f"{path}: tensor {name}: data_offsets [{b}, {e}) hold {e - b} bytes but {dtype} "
                             f"{list(shape)} needs {need}")
        if e > len(data):
            raise ValueError(f"{path}: tensor {name}: data_offsets [{b}, {e}) reach past the {len(data)} data bytes "
                             "of the file; file truncated?")
        if dtype == "BF16":
            bits = np.frombuffer(data[b:e], dtype="<u2").astype(np.uint32) << 16
            out[name] = bits.view(np.float32).reshape(shape)
        else:
            out[name] = np.frombuffer(data[b:e], dtype=NP_DTYPES[dtype]).reshape(shape).copy()
    return out, meta
