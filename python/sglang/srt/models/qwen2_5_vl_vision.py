"""The Qwen2.5-VL vision tower (HF checkpoint layout `visual.*`): dynamic resolution, images and videos alike.

    patches [P, C*T*p*p]  (multimodal/qwen_vl_image.py: frames in pairs (T = temporal_patch_size), p x p pixels,
                           ordered by 2x2 merge unit: (t, h/2, w/2, 2, 2))
      -> patch_embed (Conv3d with kernel == stride, i.e. one matmul per patch)        [P, H]
      -> reorder merge units window by window (window_size pixels = window_size/28 units a side)
      -> blocks: RMSNorm, attention with 2-D rotary (h, w) -- inside one window, or inside one frame for the
         blocks in fullatt_block_indexes --, RMSNorm, SwiGLU MLP
      -> merger: RMSNorm, 4 neighbouring patches concatenated [P/4, 4H], Linear, GELU, Linear  [P/4, out_hidden]
      -> back to merge-unit order: one row per LLM token, (t, h/2, w/2) row-major
Several images / videos are encoded in one call: attention never crosses a frame, so concatenating is exact.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn


class VisionRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class VisionPatchEmbed(nn.Module):
    def __init__(self, patch: int, temporal_patch: int, in_channels: int, hidden: int):
        super().__init__()
        k = (temporal_patch, patch, patch)
        self.proj = nn.Conv3d(in_channels, hidden, kernel_size=k, stride=k, bias=False)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        w = self.proj.weight  # [H, C, T, p, p]: kernel == stride over a patch is a matmul with the flattened patch
        return patches.to(w.dtype) @ w.reshape(w.shape[0], -1).t()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-split rotary on [L, heads, D] with cos/sin [L, 1, D/2], in float32."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def segment_attention(q, k, v, segments: Sequence[Tuple[int, int]]) -> torch.Tensor:
    """Bidirectional attention within each [start, end) of the rows; q, k, v [L, heads, D] -> [L, heads, D].
    Segments of equal length run as one batch."""
    out = torch.empty_like(q)
    by_len = {}
    for s, e in segments:
        by_len.setdefault(e - s, []).append(s)
    for n, starts in by_len.items():
        idx = (torch.tensor(starts, device=q.device)[:, None] + torch.arange(n, device=q.device)).reshape(-1)
        qs, ks, vs = (t[idx].view(len(starts), n, *t.shape[1:]).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs)  # [S, heads, n, D]
        out[idx] = o.transpose(1, 2).reshape(-1, *q.shape[1:])
    return out


class VisionAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=True)
        self.proj = nn.Linear(dim, dim, bias=True)

    def forward(self, x, cos, sin, segments) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.num_heads, self.head_dim).unbind(1)
        out = segment_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, segments)
        return self.proj(out.reshape(n, -1))


class VisionMLP(nn.Module):
    def __init__(self, dim: int, intermediate: int, act: str):
        super().__init__()
        if act != "silu":
            raise ValueError(f"Qwen2.5-VL vision hidden_act {act!r} is not supported; only silu.")
        self.gate_proj = nn.Linear(dim, intermediate, bias=True)
        self.up_proj = nn.Linear(dim, intermediate, bias=True)
        self.down_proj = nn.Linear(intermediate, dim, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class VisionBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.norm1 = VisionRMSNorm(cfg.hidden_size)
        self.norm2 = VisionRMSNorm(cfg.hidden_size)
        self.attn = VisionAttention(cfg.hidden_size, cfg.num_heads)
        self.mlp = VisionMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)

    def forward(self, x, cos, sin, segments) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, segments)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    def __init__(self, out_dim: int, dim: int, merge: int):
        super().__init__()
        self.unit_dim = dim * merge * merge
        self.ln_q = VisionRMSNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(self.unit_dim, self.unit_dim), nn.GELU(), nn.Linear(self.unit_dim, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).view(-1, self.unit_dim))


def grid_layout(grids: Sequence[Tuple[int, int, int]], merge: int, window_units: int):
    """For items of grid (t, h, w) patches: the (h, w) coordinate of each patch in processor order [P, 2], the merge
    units in window order (a permutation of range(P / merge^2)), and the attention segments, in window order, of
    the windowed blocks (one per window) and of the full blocks (one per frame)."""
    coords, order, windows, frames = [], [], [], []
    unit_base, row = 0, 0
    for t, h, w in grids:
        uh, uw = h // merge, w // merge
        hh = torch.arange(h).view(uh, merge, 1, 1).expand(uh, merge, uw, merge)
        ww = torch.arange(w).view(1, 1, uw, merge).expand(uh, merge, uw, merge)
        # processor order inside a frame: (unit row, unit col, merge row, merge col)
        frame = torch.stack([hh.permute(0, 2, 1, 3).reshape(-1), ww.permute(0, 2, 1, 3).reshape(-1)], dim=1)
        coords.append(frame.repeat(t, 1))
        units = torch.arange(t * uh * uw).view(t, uh, uw)
        for f in range(t):
            frames.append((row, row + h * w))
            for i in range(0, uh, window_units):
                for j in range(0, uw, window_units):
                    win = units[f, i:i + window_units, j:j + window_units].reshape(-1)
                    order.append(win + unit_base)
                    windows.append((row, row + win.numel() * merge * merge))
                    row += win.numel() * merge * merge
        unit_base += t * uh * uw
    return torch.cat(coords), torch.cat(order), windows, frames


class Qwen2_5_VisionTransformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.merge = cfg.spatial_merge_size
        self.patch_size = cfg.patch_size
        self.window_units = cfg.window_size // self.merge // cfg.patch_size
        self.full_blocks = set(cfg.fullatt_block_indexes)
        self.patch_embed = VisionPatchEmbed(cfg.patch_size, cfg.temporal_patch_size, cfg.in_channels, cfg.hidden_size)
        head_dim = cfg.hidden_size // cfg.num_heads
        theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
        axis_dim = head_dim // 2  # half the rotated frequencies follow h, the other half w
        inv = 1.0 / theta ** (torch.arange(0, axis_dim, 2, dtype=torch.float32) / axis_dim)
        self.register_buffer("inv_freq", inv, persistent=False)
        self.blocks = nn.ModuleList([VisionBlock(cfg) for _ in range(cfg.depth)])
        self.merger = PatchMerger(cfg.out_hidden_size, cfg.hidden_size, self.merge)

    def forward(self, patches: torch.Tensor, grids: Sequence[Tuple[int, int, int]]) -> List[torch.Tensor]:
        """patches of the items concatenated [sum P_i, C*T*p*p], grid (t, h, w) of each -> [P_i / 4, out] each."""
        x = self.patch_embed(patches.to(self.inv_freq.device))
        coords, order, windows, frames = grid_layout(grids, self.merge, self.window_units)
        u = self.merge * self.merge
        rows = (order.view(-1, 1) * u + torch.arange(u)).reshape(-1).to(x.device)  # window order, by patch
        freqs = coords.to(x.device)[rows].float()[..., None] * self.inv_freq  # [P, 2, D/4]
        freqs = freqs.flatten(1)  # [P, D/2]: h frequencies, then w
        cos, sin = freqs.cos().unsqueeze(1), freqs.sin().unsqueeze(1)
        x = x[rows]
        for i, block in enumerate(self.blocks):
            # a frame is a contiguous run of windows, so frame segments hold in window order too
            x = block(x, cos, sin, frames if i in self.full_blocks else windows)
        merged = self.merger(x)  # [P / 4, out] in window order
        out = torch.empty_like(merged)
        out[order.to(x.device)] = merged
        sizes = [t * h * w // u for t, h, w in grids]
        return list(out.split(sizes))
