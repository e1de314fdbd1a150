"""MultimodalInputs: what the processor hands to the scheduler (pickled across ZMQ) and the model reads.

Token layout of a request with images (all indices into the expanded input_ids):
    input_ids[item.offset : item.offset + item.num_tokens]  are the pad ids of image `item`
Pad ids are derived from the image's content hash (pad_ids()), so two different images never share a prefix in
the radix cache while the same image at the same place does. They are ordinary vocabulary ids: the model
overwrites those rows of the prompt embeddings with the image's embeddings, located by offset, never by value.

Each item carries its modality ("image", "video"; "audio" later), its preprocessed features (LLaVA: pixels
[C, S, S]; Qwen2.5-VL: flattened patches [P, C*T*p*p]) and model-specific metadata (e.g. "grid_thw",
"second_per_grid_t"). Models with multimodal rotary positions (M-RoPE) also get per-request positions:
mrope_positions [3, len(input_ids)] for the prompt, and mrope_position_delta, the offset every later token adds to
its sequence index (decode positions, re-prefilled output tokens); the scheduler reads both (managers/batch_runner).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

import numpy as np
import torch

MODALITIES = ("image", "video", "audio")


def content_hash(pixel_values: torch.Tensor, extra: str = "") -> str:
    """sha256 of the preprocessed pixels (and `extra`: what else shapes the item's embeddings or positions, e.g.
    its grid): the same picture in another container format hits the same cache entry."""
    t = pixel_values.detach().to("cpu", torch.float32).contiguous()
    h = hashlib.sha256(t.numpy().tobytes())
    if extra:
        h.update(extra.encode())
    return h.hexdigest()


def _as_array(t: Any) -> Any:
    """A CPU tensor as a numpy array for pickling: the request crosses to the scheduler pickled on the HTTP event
    loop, and a tensor pickles through torch.save (~0.2 ms fixed per tensor) where an array is a header and a copy
    (~0.02 ms); dtypes numpy lacks (bfloat16) stay tensors."""
    if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dtype != torch.bfloat16:
        return t.detach().numpy()
    return t


def _as_tensor(a: Any) -> Any:
    return torch.from_numpy(a) if isinstance(a, np.ndarray) else a


def _rebuild_item(feature, *rest) -> "MultimodalDataItem":
    return MultimodalDataItem(_as_tensor(feature), *rest)


def _rebuild_inputs(input_ids, mm_items, mrope_positions, delta) -> "MultimodalInputs":
    return MultimodalInputs(input_ids, mm_items, _as_tensor(mrope_positions), delta)


def unit_key(item_hash: str, index: int, num_chunks: int) -> str:
    """The embedding-cache / admission key of one encoder chunk: the item's hash for a one-chunk item (images), else
    `<hash>:<index>`."""
    return item_hash if num_chunks == 1 else f"{item_hash}:{index}"


def pad_ids(image_hash: str, num_tokens: int, vocab_size: int) -> List[int]:
    base = int(image_hash[:15], 16)
    return [(base + i) % vocab_size for i in range(num_tokens)]


@dataclass
class MultimodalDataItem:
    feature: torch.Tensor  # the processor's output for the encoder (float32), e.g. pixels or patches
    hash: str
    offset: int  # first token of this item in the expanded input_ids
    num_tokens: int
    image_size: tuple = (0, 0)  # (width, height) as received, for logs
    modality: str = "image"
    metadata: dict = field(default_factory=dict)  # model-specific, e.g. {"grid_thw": (t, h, w)}
    # A long item (video, audio) is encoded in planned chunks (mem_plan/encoder_inputs.py), one per encoder call:
    # chunk i covers embedding rows encoder_chunks[i] = (lo, hi) relative to offset, and is encoded from feature
    # rows chunk_features[i] = (first, end, metadata of the chunk). None: the item is one chunk.
    encoder_chunks: Optional[List[Tuple[int, int]]] = None
    chunk_features: Optional[List[Tuple[int, int, dict]]] = None

    @property
    def end(self) -> int:
        return self.offset + self.num_tokens

    @property
    def num_chunks(self) -> int:
        return len(self.encoder_chunks) if self.encoder_chunks else 1

    def chunk_rows(self) -> List[Tuple[int, int]]:
        return list(self.encoder_chunks) if self.encoder_chunks else [(0, self.num_tokens)]

    def chunk(self, index: int) -> "MultimodalDataItem":
        """Chunk `index` as an item of its own (what one encoder call sees), keyed by unit_key."""
        if not self.encoder_chunks:
            return self
        (lo, hi), (first, end, meta) = self.encoder_chunks[index], self.chunk_features[index]
        return MultimodalDataItem(self.feature[first:end], unit_key(self.hash, index, self.num_chunks),
                                  self.offset + lo, hi - lo, self.image_size, self.modality, {**self.metadata, **meta})

    @property
    def pixel_values(self) -> torch.Tensor:  # the image models' name for the feature
        return self.feature

    def __reduce__(self):
        fields_ = [getattr(self, f) for f in self.__dataclass_fields__]
        return _rebuild_item, (_as_array(fields_[0]), *fields_[1:])


@dataclass
class MultimodalInputs:
    input_ids: List[int]  # the prompt with every image token expanded into num_tokens pad ids
    mm_items: List[MultimodalDataItem] = field(default_factory=list)
    mrope_positions: Optional[torch.Tensor] = None  # [3, len(input_ids)] int64 (M-RoPE models only)
    mrope_position_delta: int = 0  # position of token i beyond the prompt: i + delta

    def __reduce__(self):
        return _rebuild_inputs, (self.input_ids, self.mm_items, _as_array(self.mrope_positions),
                                 self.mrope_position_delta)

    def count(self, modality: str) -> int:
        return sum(1 for it in self.mm_items if it.modality == modality)

    def positions_3d(self, start: int, end: int) -> torch.Tensor:
        """M-RoPE positions [3, end - start] of sequence tokens [start, end): the prompt's table, then i + delta."""
        prompt = self.mrope_positions
        n_prompt = prompt.shape[1] if prompt is not None else 0
        parts = []
        if start < n_prompt:
            parts.append(prompt[:, start:min(end, n_prompt)])
        if end > max(start, n_prompt):
            tail = torch.arange(max(start, n_prompt), end, dtype=torch.int64) + self.mrope_position_delta
            parts.append(tail.expand(3, -1))
        return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]

    def items_in_range(self, start: int, end: int):
        """(item, lo, hi) for each image overlapping tokens [start, end); rows [lo, hi) of its embeddings."""
        for item in self.mm_items:
            lo, hi = max(item.offset, start), min(item.end, end)
            if lo < hi:
                yield item, lo - item.offset, hi - item.offset
