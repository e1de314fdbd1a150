"""MultimodalInputs: what the processor hands to the scheduler (pickled across ZMQ) and the model reads.

Token layout of a request with images (all indices into the expanded input_ids):
    input_ids[item.offset : item.offset + item.num_tokens]  are the pad ids of image `item`
Pad ids are derived from the image's content hash (pad_ids()), so two different images never share a prefix in
the radix cache while the same image at the same place does. They are ordinary vocabulary ids: the model
overwrites those rows of the prompt embeddings with the image's embeddings, located by offset, never by value.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import List

import torch


def content_hash(pixel_values: torch.Tensor) -> str:
    """sha256 of the preprocessed pixels: the same picture in another container format hits the same cache entry."""
    t = pixel_values.detach().to("cpu", torch.float32).contiguous()
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def pad_ids(image_hash: str, num_tokens: int, vocab_size: int) -> List[int]:
    base = int(image_hash[:15], 16)
    return [(base + i) % vocab_size for i in range(num_tokens)]


@dataclass
class MultimodalDataItem:
    pixel_values: torch.Tensor  # [C, S, S] float32, normalised
    hash: str
    offset: int  # first token of this image in the expanded input_ids
    num_tokens: int
    image_size: tuple = (0, 0)  # (width, height) as received, for logs

    @property
    def end(self) -> int:
        return self.offset + self.num_tokens


@dataclass
class MultimodalInputs:
    input_ids: List[int]  # the prompt with every image token expanded into num_tokens pad ids
    mm_items: List[MultimodalDataItem] = field(default_factory=list)

    def items_in_range(self, start: int, end: int):
        """(item, lo, hi) for each image overlapping tokens [start, end); rows [lo, hi) of its embeddings."""
        for item in self.mm_items:
            lo, hi = max(item.offset, start), min(item.end, end)
            if lo < hi:
                yield item, lo - item.offset, hi - item.offset
