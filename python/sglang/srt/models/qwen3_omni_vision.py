"""The Qwen3-Omni (Qwen3-VL style) vision tower (checkpoint layout `visual.*`), images and videos alike.

    patches [P, C*T*p*p]  (multimodal/qwen_vl_image.py, patch 16: frames in pairs, ordered by 2x2 merge unit
                           (t, h/2, w/2, 2, 2))
      -> patch_embed (Conv3d, kernel == stride, with bias: one matmul per patch)                     [P, H]
      -> + learned absolute positions: a side x side table (num_position_embeddings = side^2) resampled
           bilinearly (corner-aligned) to the frame's h x w patches
      -> blocks: LayerNorm, attention with 2-D rotary (h, w) within one frame, LayerNorm, GELU(tanh) MLP
         after the blocks in deepstack_visual_indexes: a deepstack merger (4 patches concatenated, LayerNorm over
         the 4H, Linear, GELU, Linear) -> [P/4, out] each
      -> merger: LayerNorm per patch, 4 patches concatenated, Linear, GELU, Linear                   [P/4, out]
forward returns, per item, [P_i / 4, (1 + D) * out]: the merged embeddings, then the D deepstack features (the
rows the language model adds to its first D layers' hidden states at the item's token rows). Attention never
crosses a frame, so items concatenate exactly and a video split into whole temporal slices encodes exactly as whole.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.models.qwen2_5_vl_vision import VisionPatchEmbed, rotate, segment_attention


class OmniPatchEmbed(VisionPatchEmbed):
    def __init__(self, patch: int, temporal_patch: int, in_channels: int, hidden: int):
        super().__init__(patch, temporal_patch, in_channels, hidden)
        k = (temporal_patch, patch, patch)
        self.proj = nn.Conv3d(in_channels, hidden, kernel_size=k, stride=k, bias=True)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return super().forward(patches) + self.proj.bias


class OmniVisionAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=True)
        self.proj = nn.Linear(dim, dim, bias=True)

    def forward(self, x, cos, sin, segments) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.num_heads, self.head_dim).unbind(1)
        out = segment_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, segments)
        return self.proj(out.reshape(n, -1))


class OmniVisionMLP(nn.Module):
    def __init__(self, dim: int, intermediate: int, act: str):
        super().__init__()
        approx = {"gelu_pytorch_tanh": "tanh", "gelu": "none"}.get(act)
        if approx is None:
            raise ValueError(f"Qwen3-Omni vision hidden_act {act!r} is not supported; use gelu_pytorch_tanh or gelu.")
        self.approximate = approx
        self.linear_fc1 = nn.Linear(dim, intermediate, bias=True)
        self.linear_fc2 = nn.Linear(intermediate, dim, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate=self.approximate))


class OmniVisionBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.norm2 = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.attn = OmniVisionAttention(cfg.hidden_size, cfg.num_heads)
        self.mlp = OmniVisionMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)

    def forward(self, x, cos, sin, segments) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, segments)
        return x + self.mlp(self.norm2(x))


class OmniPatchMerger(nn.Module):
    """2x2 patches -> one token. norm_after_concat: LayerNorm over the concatenated 4H (the deepstack mergers),
    else over each patch's H before concatenating (the final merger)."""

    def __init__(self, dim: int, out_dim: int, merge: int, norm_after_concat: bool):
        super().__init__()
        self.unit_dim = dim * merge * merge
        self.norm_after_concat = norm_after_concat
        self.ln_q = nn.LayerNorm(self.unit_dim if norm_after_concat else dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(self.unit_dim, self.unit_dim), nn.GELU(), nn.Linear(self.unit_dim, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm_after_concat:
            return self.mlp(self.ln_q(x.reshape(-1, self.unit_dim)))
        return self.mlp(self.ln_q(x).reshape(-1, self.unit_dim))


def merge_order_coords(h: int, w: int, merge: int) -> torch.Tensor:
    """[h*w, 2] (row, col) of each patch of one frame in processor order (unit row, unit col, merge row, merge col)."""
    uh, uw = h // merge, w // merge
    rows = torch.arange(h).view(uh, merge, 1, 1).expand(uh, merge, uw, merge).permute(0, 2, 1, 3).reshape(-1)
    cols = torch.arange(w).view(1, 1, uw, merge).expand(uh, merge, uw, merge).permute(0, 2, 1, 3).reshape(-1)
    return torch.stack([rows, cols], dim=1)


def bilinear_taps(index: torch.Tensor, size: int, side: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Corner-aligned linear resampling of a `side`-long axis to `size` points: for each target index its two
    source taps [n, 2] and weights [n, 2]."""
    src = index.double() * (side - 1) / max(size - 1, 1)
    lo = src.floor()
    frac = (src - lo).float()
    lo = lo.long().clamp(0, side - 1)
    hi = (lo + 1).clamp(max=side - 1)
    return torch.stack([lo, hi], 1), torch.stack([1 - frac, frac], 1)


class Qwen3OmniVisionTransformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.merge = cfg.spatial_merge_size
        self.out_hidden = cfg.out_hidden_size
        self.patch_embed = OmniPatchEmbed(cfg.patch_size, cfg.temporal_patch_size, cfg.in_channels, cfg.hidden_size)
        self.pos_embed = nn.Embedding(cfg.num_position_embeddings, cfg.hidden_size)
        self.side = int(round(cfg.num_position_embeddings ** 0.5))
        head_dim = cfg.hidden_size // cfg.num_heads
        theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
        axis_dim = head_dim // 2  # half the rotated frequencies follow h, the other half w
        inv = 1.0 / theta ** (torch.arange(0, axis_dim, 2, dtype=torch.float32) / axis_dim)
        self.register_buffer("inv_freq", inv, persistent=False)
        self.blocks = nn.ModuleList([OmniVisionBlock(cfg) for _ in range(cfg.depth)])
        self.deepstack_indexes = list(cfg.deepstack_visual_indexes)
        self.merger = OmniPatchMerger(cfg.hidden_size, cfg.out_hidden_size, self.merge, norm_after_concat=False)
        self.merger_list = nn.ModuleList([
            OmniPatchMerger(cfg.hidden_size, cfg.out_hidden_size, self.merge, norm_after_concat=True)
            for _ in self.deepstack_indexes])

    @property
    def num_deepstack(self) -> int:
        return len(self.deepstack_indexes)

    def _positions(self, grids, device) -> Tuple[torch.Tensor, torch.Tensor, list]:
        """(learned position embeddings [P, H], rotary (h, w) coordinates [P, 2], frame segments)."""
        embeds, coords, frames, row = [], [], [], 0
        table = self.pos_embed.weight
        for t, h, w in grids:
            rc = merge_order_coords(h, w, self.merge)
            (ht, hw), (wt, ww) = bilinear_taps(rc[:, 0], h, self.side), bilinear_taps(rc[:, 1], w, self.side)
            idx = (ht[:, :, None] * self.side + wt[:, None, :]).reshape(-1, 4).to(device)
            wts = (hw[:, :, None] * ww[:, None, :]).reshape(-1, 4).to(device, table.dtype)
            frame = (table[idx] * wts[..., None]).sum(1)  # [h*w, H]
            embeds.append(frame.repeat(t, 1))
            coords.append(rc.repeat(t, 1))
            for _ in range(t):
                frames.append((row, row + h * w))
                row += h * w
        return torch.cat(embeds), torch.cat(coords).to(device), frames

    def forward(self, patches: torch.Tensor, grids: Sequence[Tuple[int, int, int]]) -> List[torch.Tensor]:
        """patches of the items concatenated [sum P_i, C*T*p*p], grid (t, h, w) of each ->
        [P_i / 4, (1 + D) * out] each (merged embeddings, then the D deepstack features)."""
        grids = [tuple(int(v) for v in g) for g in grids]
        x = self.patch_embed(patches.to(self.inv_freq.device))
        pos, coords, frames = self._positions(grids, x.device)
        x = x + pos.to(x.dtype)
        freqs = (coords.float()[..., None] * self.inv_freq).flatten(1)  # [P, D/2]: h frequencies, then w
        cos, sin = freqs.cos().unsqueeze(1), freqs.sin().unsqueeze(1)
        deep = []
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, frames)
            if i in self.deepstack_indexes:
                deep.append(self.merger_list[self.deepstack_indexes.index(i)](x))
        out = torch.cat([self.merger(x)] + deep, dim=1)
        u = self.merge * self.merge
        return list(out.split([t * h * w // u for t, h, w in grids]))
