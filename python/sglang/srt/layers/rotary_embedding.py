"""Rotary position embedding (neox / half-split layout, as in Hugging Face checkpoints).

The cos/sin table [max_position, rotary_dim] is computed once in float32 (then cast to the model dtype) and
indexed by position. get_rope() hands every layer of a model the same module, so a model holds one table, not one
per layer (a Llama-3.1-8B table at 128k positions is 64 MiB in bf16). Supported rope_type: default, linear, llama3,
yarn (gpt-oss; its attention factor scales the table, so the CPU rotary kernel applies it too). Dynamic NTK is not
implemented.
"""

from __future__ import annotations

import json
import math
import weakref
from typing import Optional, Tuple

import torch
from torch import nn

from sglang.jit_kernel.cpu_ops import get_ops_for_dtype


def _default_inv_freq(rotary_dim: int, base: float, device) -> torch.Tensor:
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64, device=device).to(torch.float32) / rotary_dim
    return 1.0 / (base**exponents)  # [rotary_dim / 2]


def _llama3_inv_freq(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    factor = params["factor"]
    low_freq_factor = params.get("low_freq_factor", 1.0)
    high_freq_factor = params.get("high_freq_factor", 4.0)
    old_context_len = params["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # long wavelengths are slowed by `factor`, short ones kept, the band between interpolated smoothly
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(in_band, smoothed, scaled)


def _yarn_inv_freq(rotary_dim: int, base: float, params: dict, max_position: int, device) -> Tuple[torch.Tensor, float]:
    """YaRN (arXiv 2309.00071) as transformers parameterises it -> (inv_freq [rotary_dim / 2], attention factor).

    Frequency i keeps its trained value where a wavelength fits beta_fast or more times into the original context
    (extrapolation), is divided by `factor` where it fits fewer than beta_slow times (interpolation), and blends
    linearly over the dimension band between; cos / sin are multiplied by the attention factor
    (0.1 ln(factor) + 1 unless the config gives one).
    """
    factor = params.get("factor") or max_position / params["original_max_position_embeddings"]
    original = params["original_max_position_embeddings"]
    beta_fast, beta_slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

    def band_edge(rotations: float) -> float:  # the dimension whose wavelength fits `rotations` times into `original`
        return rotary_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = band_edge(beta_fast), band_edge(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if high == low:
        high += 0.001
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32, device=device) - low) / (high - low)).clamp(0, 1)
    extrapolated = _default_inv_freq(rotary_dim, base, device)
    keep = 1 - ramp  # 1: the trained frequency, 0: the interpolated one
    inv_freq = extrapolated / factor * ramp + extrapolated * keep
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")

        def get_mscale(m: float) -> float:
            return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

        both = mscale and mscale_all_dim
        attention_factor = get_mscale(mscale) / get_mscale(mscale_all_dim) if both else get_mscale(1)
    return inv_freq, float(attention_factor)


class RotaryEmbedding(nn.Module):
    def __init__(
        self,
        head_size: int,
        rotary_dim: int,
        max_position_embeddings: int,
        base: float,
        dtype: torch.dtype,
        rope_parameters: Optional[dict] = None,
    ):
        super().__init__()
        params = dict(rope_parameters or {})
        rope_type = params.get("rope_type") or params.get("type") or "default"
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.max_position_embeddings = max_position_embeddings
        device = torch.empty(0).device  # honours an enclosing `with torch.device(...)`
        inv_freq = _default_inv_freq(rotary_dim, base, device)
        table_scale = 1.0
        if rope_type == "linear":
            inv_freq = inv_freq / params["factor"]
        elif rope_type == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, params)
        elif rope_type == "yarn":
            inv_freq, table_scale = _yarn_inv_freq(rotary_dim, base, params, max_position_embeddings, device)
        elif rope_type != "default":
            raise ValueError(f"rope_type {rope_type!r} is not supported; supported: default, linear, llama3, yarn.")
        t = torch.arange(max_position_embeddings, dtype=torch.int64, device=device).to(torch.float32)
        freqs = torch.outer(t, inv_freq)  # [P, rotary_dim / 2]
        # [P, rotary_dim]: cos of each half-frequency, then sin
        cache = (torch.cat((freqs.cos(), freqs.sin()), dim=-1) * table_scale).to(dtype)
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: Optional[torch.Tensor] = None
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """positions: [N]; query: [N, Hq * D] or [N, Hq, D]; key likewise or None. Returns tensors shaped like the
        inputs: new ones, or on the CPU kernel path (bf16 or fp32, key None, heads contiguous) `query` itself, rotated in place."""
        dtype = query.dtype
        if key is None and dtype in (torch.bfloat16, torch.float32) and query.is_cpu and self.cos_sin_cache.dtype == dtype:
            ops = get_ops_for_dtype(dtype)  # bf16 from avx512_bf16, fp32 from avx2
            n = query.shape[0]
            flat = query.view(n, -1) if query.dim() == 3 and query.stride(-1) == 1 and query.stride(1) == self.head_size else query
            if ops is not None and flat.dim() == 2 and flat.stride(1) == 1:
                ops.rotary_embedding_(positions, flat, flat.shape[1] // self.head_size, self.head_size, self.cos_sin_cache)
                return query, None
        return self._forward_torch(positions, query, key)

    def _forward_torch(
        self, positions: torch.Tensor, query: torch.Tensor, key: Optional[torch.Tensor] = None
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        cos, sin = self.cos_sin_cache.index_select(0, positions).unsqueeze(-2).chunk(2, dim=-1)  # [N, 1, rd/2] each
        q = self._apply(query, cos, sin)
        k = self._apply(key, cos, sin) if key is not None else None
        return q, k

    def _apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.view(shape[0], -1, self.head_size)  # [N, h, D]
        rd = self.rotary_dim
        x_rot = x[..., :rd] if rd < self.head_size else x
        x1, x2 = x_rot.chunk(2, dim=-1)
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        if rd < self.head_size:
            out = torch.cat((out, x[..., rd:]), dim=-1)
        return out.view(shape)


# live rotary modules by construction arguments: layers of one model share one table; freed with the last model
_ROPE_MODULES: "weakref.WeakValueDictionary[tuple, RotaryEmbedding]" = weakref.WeakValueDictionary()


def get_rope(
    head_size: int,
    rotary_dim: int,
    max_position: int,
    base: float,
    rope_parameters: Optional[dict] = None,
    dtype: Optional[torch.dtype] = None,
) -> RotaryEmbedding:
    dtype = dtype or torch.get_default_dtype()
    device = torch.empty(0).device
    key = (head_size, rotary_dim, max_position, float(base), json.dumps(rope_parameters or {}, sort_keys=True),
           dtype, str(device))
    rope = _ROPE_MODULES.get(key)
    if rope is None:
        rope = RotaryEmbedding(head_size, rotary_dim, max_position, base, dtype, rope_parameters)
        _ROPE_MODULES[key] = rope
    return rope
