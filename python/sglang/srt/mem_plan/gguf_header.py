"""A GGUF file's header read with struct: its metadata values and its tensor table (name, ggml type, dims, offset).

The `gguf` package's GGUFReader maps every metadata field and tensor into numpy objects (2.0 s for the bundled
SmolLM2 file, whose header holds a 49,152-token vocabulary and its merges). A start needs the tensor table (the plan:
read_tensor_table, which skips the values, ~0.02 s) and, to convert or load the file, the values as Python objects and
where each tensor's bytes lie (read_gguf_header, ~0.1 s; model_loader/gguf_file.py maps the data). Layout (GGUF v2/v3,
little-endian):
    "GGUF", version u32, tensor_count u64, kv_count u64,
    kv_count x (key: string, value type u32, value),  string = u64 length + UTF-8 bytes, array = elem type u32,
                                                       count u64, elements
    tensor_count x (name: string, n_dims u32, dims u64 x n_dims (ggml order: the row length first), ggml type u32,
                    data offset u64 (from the data section))
    padding to general.alignment (default 32), then the data section.
A big-endian file (or any other version) raises ValueError; callers then use the gguf package.
Torch- and numpy-free.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

# value type id -> struct format of one element (8 STRING and 9 ARRAY are variable)
_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_FIXED = {vtype: struct.calcsize("<" + fmt) for vtype, fmt in _FORMATS.items()}
_STRING, _ARRAY = 8, 9
DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int
    dims: Tuple[int, ...]  # ggml order: dims[0] is the row length
    offset: int  # bytes from the start of the file


@dataclass(frozen=True)
class GGUFHeader:
    fields: Dict[str, Any]  # key -> int | float | bool | str | list
    tensors: List[TensorInfo]


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

    def value(self, vtype: int) -> Any:
        if vtype in _FORMATS:
            (v,) = struct.unpack_from("<" + _FORMATS[vtype], self.buf, self.pos)
            self.pos += _FIXED[vtype]
            return v
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.u32(), self.u64()
            if etype in _FORMATS:
                values = list(struct.unpack_from(f"<{count}{_FORMATS[etype]}", self.buf, self.pos))
                self.pos += _FIXED[etype] * count
                return values
            if etype == _STRING:
                return self._strings(count)
            return [self.value(etype) for _ in range(count)]
        raise ValueError(f"unknown GGUF value type {vtype} at byte {self.pos}")

    def _strings(self, count: int) -> List[str]:
        buf, pos, out = self.buf, self.pos, []
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            (n,) = unpack(buf, pos)
            pos += 8
            out.append(buf[pos:pos + n].decode("utf-8", errors="replace"))
            pos += n
        self.pos = pos
        return out


def _walk(path: str, values: bool) -> GGUFHeader:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        if mm[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        cur = _Cursor(mm)
        cur.pos = 4
        version = cur.u32()
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version} (a big-endian file, or one this reader does not know)")
        tensor_count, kv_count = cur.u64(), cur.u64()
        fields: Dict[str, Any] = {}
        for _ in range(kv_count):
            key = cur.string()
            vtype = cur.u32()
            if values or key == "general.alignment":
                fields[key] = cur.value(vtype)
            else:
                cur.skip_value(vtype)
        table = []
        for _ in range(tensor_count):
            name = cur.string()
            n_dims = cur.u32()
            dims = struct.unpack_from(f"<{n_dims}Q", mm, cur.pos)
            cur.pos += 8 * n_dims
            table.append((name, cur.u32(), dims, cur.u64()))
        alignment = int(fields.get("general.alignment", DEFAULT_ALIGNMENT))
        data_start = -(-cur.pos // alignment) * alignment
    tensors = [TensorInfo(name, kind, tuple(dims), data_start + off) for name, kind, dims, off in table]
    return GGUFHeader(fields if values else {}, tensors)


def read_gguf_header(path: str) -> GGUFHeader:
    """Every metadata value (as Python objects) and every tensor's type, dims and file offset."""
    return _walk(path, values=True)


def read_tensor_table(path: str) -> List[Tuple[str, int, int]]:
    """(name, ggml type id, number of dims) of every tensor in the file, in file order (metadata values skipped)."""
    return [(t.name, t.ggml_type, len(t.dims)) for t in _walk(path, values=False).tensors]
