"""The tensor table of a GGUF file read from its header alone: (name, ggml type id, dims) per tensor.

The `gguf` package's GGUFReader maps every metadata field and tensor into numpy objects (2.1 s for the bundled
SmolLM2 file, whose header holds a 49,152-token vocabulary and its merges); a start only needs the tensor table, so
this walks the header with struct and skips the metadata values (~0.1 s). Layout (GGUF v2/v3, little-endian):
    "GGUF", version u32, tensor_count u64, kv_count u64,
    kv_count x (key: string, value type u32, value),  string = u64 length + UTF-8 bytes, array = elem type u32,
                                                       count u64, elements
    tensor_count x (name: string, n_dims u32, dims u64 x n_dims, ggml type u32, data offset u64)
A big-endian file (or any other version) raises ValueError; callers then use the gguf package.
Torch- and numpy-free.
"""

from __future__ import annotations

import mmap
import struct
from typing import List, Tuple

# value type id -> fixed size in bytes (8 STRING and 9 ARRAY are variable)
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


class _Cursor:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def u32(self) -> int:
        (v,) = struct.unpack_from("<I", self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self) -> int:
        (v,) = struct.unpack_from("<Q", self.buf, self.pos)
        self.pos += 8
        return v

    def string(self) -> str:
        n = self.u64()
        s = self.buf[self.pos:self.pos + n].decode("utf-8", errors="replace")
        self.pos += n
        return s

    def skip_value(self, vtype: int) -> None:
        if vtype in _FIXED:
            self.pos += _FIXED[vtype]
        elif vtype == _STRING:
            n = self.u64()
            self.pos += n
        elif vtype == _ARRAY:
            etype, count = self.u32(), self.u64()
            if etype in _FIXED:
                self.pos += _FIXED[etype] * count
            else:
                for _ in range(count):
                    self.skip_value(etype)
        else:
            raise ValueError(f"unknown GGUF value type {vtype} at byte {self.pos}")


def read_tensor_table(path: str) -> List[Tuple[str, int, int]]:
    """(name, ggml type id, number of dims) of every tensor in the file, in file order."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        if mm[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        cur = _Cursor(mm)
        cur.pos = 4
        version = cur.u32()
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version} (a big-endian file, or one this reader does not know)")
        tensor_count, kv_count = cur.u64(), cur.u64()
        for _ in range(kv_count):
            cur.string()  # the key
            cur.skip_value(cur.u32())
        out = []
        for _ in range(tensor_count):
            name = cur.string()
            n_dims = cur.u32()
            cur.pos += 8 * n_dims
            out.append((name, cur.u32(), n_dims))
            cur.pos += 8  # data offset
        return out
