"""Minimal .safetensors reader/writer on NumPy (SPEC §5), with no dependency but NumPy.

The reader is the package's own (verify/python/orthros/_safetensors.py, also
`orthros.testing.read_safetensors`), loaded by path; the writer is here.

bf16 has no NumPy dtype: BF16 tensors are read as float32 (exactly: a bf16 is the top half of a
float32) and written from float32 by round-to-nearest-even on the bit pattern.
"""
import importlib.util
import json
import os
import struct
import sys

import numpy as np


def _load_reader():
    """The package's pure-NumPy reader, verify/python/orthros/_safetensors.py: from this checkout
    by its path (the examples need NumPy only; `import orthros` would load the compiled
    orthros._core, which the interpreter running a port, e.g. PyTorch's on a GPU machine, may not
    have), else from an installed `orthros` package (`pip install .`)."""
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.join(here, os.pardir, os.pardir, "verify", "python", "orthros", "_safetensors.py")
    if os.path.isfile(src):
        spec = importlib.util.spec_from_file_location("orthros_safetensors", src)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    from orthros import _safetensors
    return _safetensors


_reader = _load_reader()
_NP = _reader.NP_DTYPES
read = _reader.read_safetensors  # read(path) -> (tensors: dict name -> np.ndarray, metadata: dict str -> str)


def _bf16_bits(a):
    """bf16 bit patterns of `a`, rounded once to nearest even from its own precision (float64
    inputs are not rounded through float32 first: the project's single rounding rule). NaN stays NaN."""
    x = np.asarray(a, dtype=np.float64)
    _, e = np.frexp(x)                   # |x| = m * 2^e, m in [0.5, 1)
    e = np.maximum(e, -125)              # below 2^-126 the quantum stays 2^-133 (bf16 subnormals)
    with np.errstate(over="ignore", invalid="ignore"):
        q = np.ldexp(np.rint(np.ldexp(x, 8 - e)), e - 8)  # 8 significant bits, ties to even
        f = q.astype(np.float32)         # exact: every bf16 value is a float32; beyond the range -> inf
    bits = (np.ascontiguousarray(f).view(np.uint32) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), bits)


def write(path, tensors, metadata=None, dtype="F32"):
    """Writes dict name -> array (stored in `dtype`: F64, F32, F16 or BF16), sorted by name."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        a = np.asarray(tensors[name])
        if dtype == "BF16":
            blob = _bf16_bits(a).astype("<u2").tobytes()
        else:
            blob = np.ascontiguousarray(a, dtype=_NP[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    h = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    h += b" " * (-(8 + len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_manifest(golden):
    """GOLDEN/manifest.json of an `orthros golden` suite as a dict.

    A missing or unreadable suite is a usage error: one line on stderr and exit status 2.
    """
    path = os.path.join(golden, "manifest.json")
    try:
        with open(path) as f:
            manifest = json.load(f)
        if not isinstance(manifest, dict) or manifest.get("format") != "orthros-golden" \
                or not isinstance(manifest.get("cases"), list):
            raise ValueError("not an orthros golden manifest")
    except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError
        msg = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        print(f"{os.path.basename(sys.argv[0])}: error: --golden {golden}: cannot read {path}: {msg} "
              "(write a suite with `orthros golden --out DIR`)", file=sys.stderr)
        sys.exit(2)
    return manifest
