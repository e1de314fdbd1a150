"""Multimodal rotary positions (M-RoPE) of one prompt: a (t, h, w) position for every token, and the delta.

Walking the expanded prompt left to right with a running position `next`:
    text token                      (next, next, next); next += 1
    image / video of grid (t, h, w) patches, merge m: its tokens are the (t, h/m, w/m) grid in row-major order;
                                    token (i, j, k) is at (next + floor(i * interval), next + j, next + k), where
                                    interval = 1 for an image and tokens_per_second * second_per_grid_t for a video
                                    (seconds between two temporal patches); then next = (largest position) + 1
    audio (Qwen3-Omni)              each token (next, next, next); next += 1, as text
After the prompt every token is at (i + delta) on all three axes, delta = (largest prompt position) + 1 - L.
The positions depend only on the layout, never on token values (the pad ids are content hashes). After a video
the running position continues from its largest position + 1 (the original Qwen2.5-VL rule, also vLLM's and
SGLang's); transformers 5 continues from next + max(h, w) / m instead, which differs only when a video's temporal
positions reach past its spatial ones.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import torch


def vision_positions(start: int, grid_thw: Sequence[int], merge: int, interval: float) -> torch.Tensor:
    """[3, t * h/m * w/m] positions of one item's tokens, starting at `start`."""
    t, h, w = (int(x) for x in grid_thw)
    lh, lw = h // merge, w // merge
    tt = (torch.arange(t) * interval).long()  # floor of the scaled temporal index, as float32 math gives it
    grid = torch.stack(torch.meshgrid(tt, torch.arange(lh), torch.arange(lw), indexing="ij"))
    return grid.reshape(3, -1) + start


def mrope_positions(num_tokens: int, items, merge: int, tokens_per_second: float) -> Tuple[torch.Tensor, int]:
    """(positions [3, num_tokens] int64, delta) for a prompt whose multimodal items (MultimodalDataItem with
    metadata grid_thw, and second_per_grid_t for videos) sit at their offsets."""
    parts = []
    cursor, nxt = 0, 0
    for it in sorted(items, key=lambda x: x.offset):
        if it.offset < cursor:
            raise ValueError("Multimodal items overlap in the prompt.")
        text = it.offset - cursor
        if text:
            parts.append(torch.arange(nxt, nxt + text).expand(3, -1))
            nxt += text
        if it.modality == "audio":  # Qwen3-Omni: audio tokens advance all three axes by one, as text does
            parts.append(torch.arange(nxt, nxt + it.num_tokens).expand(3, -1))
            nxt += it.num_tokens
            cursor = it.end
            continue
        interval = 1.0
        if it.modality == "video":
            interval = tokens_per_second * float(it.metadata.get("second_per_grid_t", 1.0))
        pos = vision_positions(nxt, it.metadata["grid_thw"], merge, interval)
        if pos.shape[1] != it.num_tokens:
            raise ValueError(f"An {it.modality} of grid {tuple(it.metadata['grid_thw'])} has {pos.shape[1]} "
                             f"positions but {it.num_tokens} tokens.")
        parts.append(pos)
        nxt = int(pos.max()) + 1
        cursor = it.end
    if num_tokens > cursor:
        parts.append(torch.arange(nxt, nxt + num_tokens - cursor).expand(3, -1))
    positions = torch.cat(parts, dim=1) if parts else torch.zeros(3, 0, dtype=torch.int64)
    delta = (int(positions.max()) + 1 - num_tokens) if num_tokens else 0
    return positions.contiguous(), delta
