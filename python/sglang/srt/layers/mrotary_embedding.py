"""Multimodal rotary position embedding (M-RoPE, Qwen2-VL / Qwen2.5-VL): three position axes (t, h, w).

The head's rotary_dim / 2 frequencies are split into consecutive sections (mrope_section, e.g. [16, 24, 24]);
section i rotates by the position on axis i % 3. A text token has the same position on all three axes, so for it
M-RoPE equals ordinary RoPE; image and video tokens get (t, h, w) grid coordinates (multimodal/mrope_positions.py).

    positions [N]     -> plain RoPE (decode, text-only batches: the scheduler already added the request's delta)
    positions [3, N]  -> per section, the cos/sin of its axis's position
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

from sglang.srt.layers.rotary_embedding import RotaryEmbedding


class MRotaryEmbedding(RotaryEmbedding):
    def __init__(self, head_size: int, rotary_dim: int, max_position_embeddings: int, base: float,
                 dtype: torch.dtype, mrope_section: Sequence[int], rope_parameters: Optional[dict] = None):
        params = {k: v for k, v in (rope_parameters or {}).items() if k != "mrope_section"}
        if params.get("rope_type", params.get("type")) == "mrope":
            params["rope_type"] = "default"
        super().__init__(head_size, rotary_dim, max_position_embeddings, base, dtype, params)
        if sum(mrope_section) != rotary_dim // 2:
            raise ValueError(f"mrope_section {list(mrope_section)} must sum to rotary_dim / 2 = {rotary_dim // 2}.")
        # axis of each of the rotary_dim / 2 frequencies
        axis = torch.cat([torch.full((n,), i % 3, dtype=torch.int64) for i, n in enumerate(mrope_section)])
        self.register_buffer("section_axis", axis.to(self.cos_sin_cache.device), persistent=False)

    def forward(self, positions: torch.Tensor, query: torch.Tensor,
                key: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        if positions.dim() == 1:
            return self._forward_torch(positions, query, key)
        n = positions.shape[1]
        half = self.rotary_dim // 2
        table = self.cos_sin_cache[positions]  # [3, N, rotary_dim]
        pick = self.section_axis.view(1, 1, half).expand(1, n, half)
        cos = table[..., :half].gather(0, pick)[0].unsqueeze(-2)  # [N, 1, rotary_dim / 2]
        sin = table[..., half:].gather(0, pick)[0].unsqueeze(-2)
        q = self._apply(query, cos, sin)
        k = self._apply(key, cos, sin) if key is not None else None
        return q, k
