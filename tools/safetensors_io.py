"""Minimal safetensors reader/writer (Debian bookworm has no python3-safetensors).

Format (huggingface/safetensors README, "Format"): u64 little-endian header length N,
N bytes of JSON {"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets"}},
then the byte buffer. Offsets are relative to the buffer; tensors tile it without gaps.
We pad the JSON with spaces to a multiple of 8 and order tensors by descending element
size so every tensor is naturally aligned when the file is mmapped (as the Rust writer
does).

Works with numpy arrays; torch tensors are accepted and converted.
"""

import json
import struct

import numpy as np

_NP_TO_ST = {
    np.dtype("float32"): "F32",
    np.dtype("float16"): "F16",
    np.dtype("float64"): "F64",
    np.dtype("int32"): "I32",
    np.dtype("int64"): "I64",
    np.dtype("uint8"): "U8",
    np.dtype("int8"): "I8",
    np.dtype("int16"): "I16",
    np.dtype("uint16"): "U16",
    np.dtype("bool"): "BOOL",
}
_ST_TO_NP = {v: k for k, v in _NP_TO_ST.items()}
_ST_SIZE = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I32": 4, "I64": 8, "U8": 1, "I8": 1,
            "I16": 2, "U16": 2, "BOOL": 1}


class BF16:
    """Marks a float array to be stored as bfloat16 (round to nearest even)."""

    def __init__(self, array):
        self.array = np.ascontiguousarray(np.asarray(array, dtype=np.float32))


def _to_numpy(value):
    if isinstance(value, BF16):
        return value
    if hasattr(value, "detach"):  # torch tensor, without importing torch here
        value = value.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(value))


def _bf16_bytes(arr):
    bits = arr.view(np.uint32).astype(np.uint64)
    rounding = ((bits >> 16) & 1) + 0x7FFF
    return ((bits + rounding) >> 16).astype(np.uint16).tobytes()


def save(path, tensors, metadata=None):
    """Write `tensors` (name -> array-like or BF16) with string `metadata`."""
    entries = []
    for name, value in tensors.items():
        value = _to_numpy(value)
        if isinstance(value, BF16):
            dtype, shape, data = "BF16", list(value.array.shape), _bf16_bytes(value.array)
        else:
            if value.dtype not in _NP_TO_ST:
                raise TypeError(f"{name}: unsupported dtype {value.dtype}")
            dtype, shape, data = _NP_TO_ST[value.dtype], list(value.shape), value.tobytes()
        entries.append((name, dtype, shape, data))
    # Largest element size first keeps every tensor aligned to its element size.
    entries.sort(key=lambda e: (-_ST_SIZE[e[1]], e[0]))
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for name, dtype, shape, data in entries:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * ((8 - len(blob) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for _, _, _, data in entries:
            f.write(data)


def load(path):
    """Return (tensors, metadata); BF16 tensors come back as float32 arrays."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        buf = raw[base + begin:base + end]
        if info["dtype"] == "BF16":
            bits = np.frombuffer(buf, dtype=np.uint16).astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            arr = np.frombuffer(buf, dtype=_ST_TO_NP[info["dtype"]]).copy()
        tensors[name] = arr.reshape(info["shape"])
    return tensors, metadata
