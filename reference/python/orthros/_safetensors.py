"""The .safetensors reader of SPEC §5 on NumPy alone: the one implementation behind
`orthros.testing.read_safetensors` and the example ports' `st_io.read`
(examples/pytorch_port/st_io.py loads this file by its path in a checkout, so the examples keep
needing NumPy only, not the compiled `orthros._core` that `import orthros` loads). It imports
nothing from the package and must stay that way.
"""
import json
import struct

import numpy as np

__all__ = ["NP_DTYPES", "read_safetensors"]

NP_DTYPES = {"F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2")}


def read_safetensors(path):
    """(tensors: dict name -> np.ndarray, metadata: dict) of a .safetensors file (SPEC §5).

    F64/F32/F16 keep their dtype; BF16 (no NumPy dtype) is read as float32, exactly."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} beyond the end of the file")
    header = json.loads(raw[8:8 + n])
    data = memoryview(raw)[8 + n:]
    meta = header.pop("__metadata__", None) or {}
    out = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        shape = tuple(t["shape"])
        if t["dtype"] == "BF16":
            bits = np.frombuffer(data[b:e], dtype="<u2").astype(np.uint32) << 16
            out[name] = bits.view(np.float32).reshape(shape)
        elif t["dtype"] in NP_DTYPES:
            out[name] = np.frombuffer(data[b:e], dtype=NP_DTYPES[t["dtype"]]).reshape(shape).copy()
        else:
            raise ValueError(f"{path}: tensor {name}: dtype {t['dtype']} not supported")
    return out, meta
