"""The safetensors file format (https://github.com/huggingface/safetensors), with numpy.

An 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape and
byte range, then the tensors' bytes. Written to a temporary file and renamed, so a reader never
sees half a file.
"""

from __future__ import annotations

import json
import os
import pathlib
import struct
from typing import Dict, Mapping, Optional

import numpy as np

_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64,
           "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8}
_NAMES = {np.dtype(value): key for key, value in _DTYPES.items()}


def write(path: os.PathLike, tensors: Mapping[str, np.ndarray],
          metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes `tensors` (name -> array) in name order."""
    header: Dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    arrays = []
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        if array.dtype not in _NAMES:
            raise ValueError(f"tensor {name}: dtype {array.dtype} has no safetensors name here")
        header[name] = {"dtype": _NAMES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
        arrays.append(array.astype(array.dtype.newbyteorder("<"), copy=False))
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # The data starts 8-byte aligned.
    path = pathlib.Path(path)
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as out:
        out.write(struct.pack("<Q", len(encoded)))
        out.write(encoded)
        for array in arrays:
            out.write(array.tobytes())
    os.replace(temporary, path)


def read(path: os.PathLike) -> Dict[str, np.ndarray]:
    """The tensors of a file (name -> array); BF16 tensors come back as float32."""
    data = pathlib.Path(path).read_bytes()
    (length,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8:8 + length])
    header.pop("__metadata__", None)
    base = 8 + length
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        raw = data[base + begin:base + end]
        if entry["dtype"] == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            array = bits.view(np.float32)
        else:
            array = np.frombuffer(raw, dtype=np.dtype(_DTYPES[entry["dtype"]]).newbyteorder("<"))
        tensors[name] = array.reshape(entry["shape"])
    return tensors
