"""open_gguf(path) -> GGUFFile: a GGUF file's metadata values and its tensors' bytes, mapped, for the converter and
the quantized loader.

The header is read with struct (mem_plan/gguf_header.py, ~0.03 s for the bundled file where the gguf package's
GGUFReader takes 2 s); each tensor's data is a read-only uint8 view of one memory map, shaped like GGUFReader's:
[*reversed(dims[1:]), bytes per row] (a stacked expert tensor [E, rows, row bytes]). A file the header reader does not
take (big-endian) is read with GGUFReader into the same objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

import numpy as np


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: Tuple[int, ...]  # ggml order: shape[0] is the row length
    data: np.ndarray


@dataclass(frozen=True)
class GGUFFile:
    fields: Dict[str, Any]  # key -> int | float | bool | str | list
    tensors: List[GGUFTensor]


def open_gguf(path: str) -> GGUFFile:
    import gguf

    from sglang.srt.mem_plan.gguf_header import read_gguf_header

    try:
        header = read_gguf_header(path)
    except ValueError:
        reader = gguf.GGUFReader(path)
        fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
        tensors = [GGUFTensor(t.name, t.tensor_type, tuple(int(d) for d in t.shape), t.data) for t in reader.tensors]
        return GGUFFile(fields, tensors)
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    tensors = []
    for t in header.tensors:
        kind = gguf.GGMLQuantizationType(t.ggml_type)
        block, block_bytes = gguf.GGML_QUANT_SIZES[kind]
        row_bytes = t.dims[0] // block * block_bytes
        rows = 1
        for d in t.dims[1:]:
            rows *= d
        data = mapped[t.offset:t.offset + rows * row_bytes].reshape(*reversed(t.dims[1:]), row_bytes)
        tensors.append(GGUFTensor(t.name, kind, t.dims, data))
    return GGUFFile(header.fields, tensors)
