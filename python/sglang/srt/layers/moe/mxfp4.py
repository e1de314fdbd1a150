"""MXFP4 (OCP microscaling FP4) as gpt-oss checkpoints store their experts' weights, dequantized exactly at load.

    <proj>_blocks  uint8 [..., rows, cols / 32, 16]  32 E2M1 values per group, two per byte, the low nibble first
    <proj>_scales  uint8 [..., rows, cols / 32]      one E8M0 exponent per group: the group's scale is 2^(s - 127)

E2M1: sign bit 3, then an exponent / mantissa pair giving the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6. Every value
times its scale is a power of two times at most two significant bits, exact in fp32 and bf16 for scales within
their exponent range (a real checkpoint's are), so the dequantized tensor is the checkpoint's values, not an
approximation. The result's last axis is the input (cols) axis: [..., rows, cols], rows being output features.
"""

from __future__ import annotations

import torch

GROUP = 32  # values per scale
SCALE_BIAS = 127
_E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e2m1_table(dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """[16]: the value of each 4-bit code (codes 8-15 are 0-7 negated, 8 being -0)."""
    mags = torch.tensor(_E2M1_MAGNITUDES, dtype=dtype, device=device)
    return torch.cat([mags, -mags])


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """blocks uint8 [..., R, G, 16], scales uint8 [..., R, G] -> [..., R, G * 32] of dtype."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"mxfp4 blocks and scales are uint8, got {blocks.dtype} and {scales.dtype}")
    if blocks.shape[-1] != GROUP // 2 or tuple(blocks.shape[:-1]) != tuple(scales.shape):
        raise ValueError(f"mxfp4 blocks {tuple(blocks.shape)} do not match scales {tuple(scales.shape)}: "
                         f"expected blocks [..., rows, groups, {GROUP // 2}] and scales [..., rows, groups]")
    table = e2m1_table(torch.float32, blocks.device)
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).flatten(-2).long()  # [..., R, G, 32], low nibble first
    values = table[codes]
    exponent = scales.to(torch.int32) - SCALE_BIAS
    values = torch.ldexp(values, exponent.unsqueeze(-1).to(torch.float32))
    return values.flatten(-2).to(dtype)
