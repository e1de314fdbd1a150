"""Torch dequantization of the GGUF block types a Q4_K_M file holds besides Q8_0: Q4_K, Q5_K, Q6_K and Q5_0.

    dequantize(raw uint8 [rows, row_bytes], ggml_type) -> float32 [rows, row_bytes / block_bytes * block_weights]

Bit-exact with the GGUF formula as ggml's reference dequantizers (and gguf.quants) evaluate it in float32: the
per-sub-block factor is rounded once (d * scale), then multiplied by the integer level, and for the types with a
minimum the rounded dmin * min is subtracted. Layouts (little-endian; a K-quant "super-block" is 256 weights):

    Q5_0  22 B / 32:  d f16 | qh u32 (bit j: weight j's 5th bit) | qs[16] (weight j: low nibble of qs[j], j >= 16:
                      high nibble of qs[j - 16]);  w = d * (q - 16)
    Q4_K 144 B / 256: d f16 | dmin f16 | scales[12] (eight 6-bit scales and mins) | qs[128]: four 64-weight chunks of
                      32 bytes, low nibbles the chunk's first 32 weights, high nibbles the next 32;
                      w = (d * sc[j]) * q - dmin * m[j] for sub-block j = weight // 32
    Q5_K 176 B / 256: d | dmin | scales[12] | qh[32] (bit j of byte l: sub-block j's weight l's 5th bit) | qs[128]
                      as Q4_K;  w = (d * sc[j]) * q - dmin * m[j]
    Q6_K 210 B / 256: ql[128] | qh[64] | scales[16] int8 | d f16; two 128-weight halves h, each four 32-weight
                      groups k: low 4 bits from ql[64h + 32(k % 2) + l] (nibble k // 2), high 2 bits from
                      qh[32h + l] >> 2k;  w = (d * scales[weight // 16]) * (q - 32)
The 6-bit scales of Q4_K / Q5_K: j < 4: sc = s[j] & 63, m = s[j + 4] & 63; j >= 4: sc = (s[j + 4] & 15) |
(s[j - 4] >> 6) << 4, m = (s[j + 4] >> 4) | (s[j] >> 6) << 4.
"""

from __future__ import annotations

from typing import Callable, Dict, Tuple

import torch

# ggml type ids (gguf.GGMLQuantizationType)
Q5_0, Q4_K, Q5_K, Q6_K = 6, 12, 13, 14
QK_K = 256


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """[n, 1] float32 from the little-endian f16 at byte `start` of each block."""
    return blocks[:, start:start + 2].contiguous().view(torch.float16).float()


def _bits(byte: torch.Tensor, shifts) -> torch.Tensor:
    """byte [..., B] uint8 -> [..., len(shifts), B]: byte >> shift for each shift (callers mask)."""
    return torch.stack([byte >> s for s in shifts], dim=-2)


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _f16(b, 0)
    qh = b[:, 2:6].contiguous().view(torch.int32)  # [n, 1]
    high = ((qh >> torch.arange(32, dtype=torch.int32)) & 1).to(torch.uint8)  # [n, 32]
    low = (_bits(b[:, 6:22], (0, 4)) & 15).reshape(n, 32)
    q = (low | (high << 4)).to(torch.float32) - 16.0
    return d * q


def _k_scale_min(s: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """scales[12] [n, 12] uint8 -> (sc, m) [n, 8] float32."""
    lo_sc, lo_m, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = torch.cat([lo_sc & 63, (hi & 15) | ((lo_sc >> 6) << 4)], dim=1)
    m = torch.cat([lo_m & 63, (hi >> 4) | ((lo_m >> 6) << 4)], dim=1)
    return sc.float(), m.float()


def _k_minus_min(b: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Q4_K / Q5_K: levels q [n, 8, 32] float32 -> (d * sc) * q - dmin * m."""
    n = b.shape[0]
    sc, m = _k_scale_min(b[:, 4:16])
    dl = (_f16(b, 0) * sc).view(n, 8, 1)
    ml = (_f16(b, 2) * m).view(n, 8, 1)
    return (dl * q - ml).reshape(n, QK_K)


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    qs = b[:, 16:144].reshape(n, 4, 32)
    q = (_bits(qs, (0, 4)) & 15).reshape(n, 8, 32)  # chunk c: sub-blocks 2c (low), 2c + 1 (high)
    return _k_minus_min(b, q.float())


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    qh, qs = b[:, 16:48], b[:, 48:176].reshape(n, 4, 32)
    low = (_bits(qs, (0, 4)) & 15).reshape(n, 8, 32)
    high = _bits(qh, range(8)) & 1  # [n, 8, 32]: sub-block j's bits at shift j
    return _k_minus_min(b, (low | (high << 4)).float())


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    ql, qh = b[:, 0:128].reshape(n, 2, 64), b[:, 128:192].reshape(n, 2, 32)
    low = (_bits(ql, (0, 4)) & 15).reshape(n, 2, 4, 32)  # [n, h, nibble, 64 bytes] -> group k = 2 * nibble + byte // 32
    high = _bits(qh, (0, 2, 4, 6)) & 3  # [n, h, k, l]
    q = ((low | (high << 4)).to(torch.float32) - 32.0).reshape(n, 16, 16)
    scales = b[:, 192:208].contiguous().view(torch.int8).float()  # [n, 16]
    dl = (_f16(b, 208) * scales).view(n, 16, 1)
    return (dl * q).reshape(n, QK_K)


# ggml type -> (weights per block, bytes per block, dequantizer of [n, bytes] uint8 -> [n, weights] float32)
BLOCK_TYPES: Dict[int, Tuple[int, int, Callable[[torch.Tensor], torch.Tensor]]] = {
    Q5_0: (32, 22, _q5_0),
    Q4_K: (QK_K, 144, _q4_k),
    Q5_K: (QK_K, 176, _q5_k),
    Q6_K: (QK_K, 210, _q6_k),
}


def dequantize(raw: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """raw uint8 [rows, row_bytes] (whole blocks per row) -> float32 [rows, cols]."""
    ggml_type = int(ggml_type)
    if ggml_type not in BLOCK_TYPES:
        raise ValueError(f"gguf_kquants: ggml type {ggml_type} is not one of Q5_0 / Q4_K / Q5_K / Q6_K")
    weights, nbytes, fn = BLOCK_TYPES[ggml_type]
    rows, row_bytes = raw.shape
    if raw.dtype != torch.uint8 or row_bytes % nbytes:
        raise ValueError(f"gguf_kquants: rows of {row_bytes} bytes ({raw.dtype}) are not whole {nbytes}-byte blocks")
    return fn(raw.reshape(-1, nbytes)).reshape(rows, row_bytes // nbytes * weights)
