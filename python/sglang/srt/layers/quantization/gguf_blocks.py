"""GGUF block formats -> w = d * u + c per 32 weights of a row, exactly (the parts packing.py stages and packs).

    decode_gguf_blocks(raw uint8 [rows, blocks * block bytes], ggml type) -> (u, d, c, narrow)
        u uint8 [rows, nb, 32] (nb: blocks of 32 weights), d and c float32 [rows, nb, 2]: the scale and offset of
        weights 0-15 and 16-31 of each block (equal where the format scales all 32 alike). narrow: d and c are fp16
        values, so the block fits packing's fp16 staging form; otherwise it needs the fp32 (wide) one.

The formats (ggml's block layouts; byte offsets within one block; q the stored unsigned level):
    Q4_0  18 B  fp16 d, 16 B nibbles              w = d (q - 8)             u = q, c = -8 d
    Q4_1  20 B  fp16 d, fp16 m, 16 B nibbles      w = d q + m               u = q, c = m
    Q5_0  22 B  fp16 d, 4 B high bits, 16 B       w = d (q - 16)            u = q, c = -16 d
    Q5_1  24 B  fp16 d, fp16 m, 4 B high bits, 16 B  w = d q + m            u = q, c = m
    Q8_0  34 B  fp16 d, 32 int8                   w = d q                   u = q + 128, c = -128 d
    Q4_K  144 B per 256: fp16 d, fp16 dmin, 12 B of 6-bit (sc, m) x 8, 128 B nibbles
                w = d sc_j q - dmin m_j per 32-weight sub-block j: d = d * sc_j, c = -dmin * m_j, both exact in
                fp32 (11 x 6 significant bits), not in fp16
    Q5_K  176 B per 256: as Q4_K plus 32 B of fifth bits (bit j of byte l: weight l of sub-block j)
    Q6_K  210 B per 256: 128 B low nibbles, 64 B high 2-bit pairs, 16 int8 scales (one per 16 weights), fp16 d
                w = d sc_s (q - 32): d = d * sc_s per half block (exact in fp32), c = -32 d; q6_k_parts keeps the
                factors (fp16 d per block, int8 sc per half block), which packing's Q6_K staging holds
Nibble order of the 32-weight formats: byte j holds weight j (low nibble) and weight j + 16 (high nibble); of Q4_K
and Q5_K: 32 bytes per 64 weights, the low nibbles sub-block 2i, the high ones sub-block 2i + 1.
"""

from __future__ import annotations

from typing import Tuple

import torch

GGUF_Q4_0, GGUF_Q4_1, GGUF_Q5_0, GGUF_Q5_1, GGUF_Q8_0 = 2, 3, 6, 7, 8  # ggml type ids
GGUF_Q4_K, GGUF_Q5_K, GGUF_Q6_K = 12, 13, 14
GGUF_TYPE_NAMES = {GGUF_Q4_0: "Q4_0", GGUF_Q4_1: "Q4_1", GGUF_Q5_0: "Q5_0", GGUF_Q5_1: "Q5_1", GGUF_Q8_0: "Q8_0",
                   GGUF_Q4_K: "Q4_K", GGUF_Q5_K: "Q5_K", GGUF_Q6_K: "Q6_K"}
BLOCK = 32
SUPER = 256  # weights per K-quant block

Parts = Tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[..., 2] bytes -> [...] float32 of the little-endian fp16 they hold."""
    return b.contiguous().view(torch.float16).squeeze(-1).float()


def _halves(x: torch.Tensor) -> torch.Tensor:
    """[rows, nb] per-block value -> [rows, nb, 2] (both halves alike)."""
    return x[..., None].expand(*x.shape, 2).contiguous()


def _bits(b: torch.Tensor, n: int) -> torch.Tensor:
    """uint8 [..., n / 8] -> [..., n] of 0 / 1: bit i of the little-endian bit string."""
    shifts = torch.arange(8, dtype=torch.uint8)
    return ((b[..., None] >> shifts) & 1).reshape(*b.shape[:-1], n)


def _nibbles32(qs: torch.Tensor) -> torch.Tensor:
    """[..., 16] bytes -> [..., 32]: weights 0-15 in the low nibbles, 16-31 in the high ones."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def _block32(b: torch.Tensor, kind: int) -> Parts:
    d = _f16(b[..., 0:2])
    if kind == GGUF_Q8_0:
        u = (b[..., 2:].contiguous().view(torch.int8).to(torch.int16) + 128).to(torch.uint8)
        return u, _halves(d), _halves(d * -128), True
    if kind in (GGUF_Q4_0, GGUF_Q4_1):
        off = 4 if kind == GGUF_Q4_1 else 2
        u = _nibbles32(b[..., off:])
    else:  # Q5_0, Q5_1: the fifth bit of weight i is bit i of the 32-bit field
        off = 4 if kind == GGUF_Q5_1 else 2
        u = _nibbles32(b[..., off + 4 :]) | (_bits(b[..., off : off + 4], 32) << 4)
    if kind in (GGUF_Q4_1, GGUF_Q5_1):
        c = _f16(b[..., 2:4])
    else:
        c = d * (-8 if kind == GGUF_Q4_0 else -16)
    return u, _halves(d), _halves(c), bool(torch.isfinite(c.half()).all())  # -16 d past fp16's range: wide


def _scale_min_k4(s: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K's 12 scale bytes [..., 12] -> (sc, m) [..., 8] of 6 bits each: sub-blocks 0-3 in the low 6 bits of
    bytes 0-3 (sc) and 4-7 (m); sub-blocks 4-7 in the nibbles of bytes 8-11 with their top 2 bits in the top bits of
    bytes 0-3 (sc) and 4-7 (m)."""
    lo, mid, hi = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat([lo & 63, (hi & 0x0F) | ((lo >> 6) << 4)], dim=-1)
    m = torch.cat([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], dim=-1)
    return sc, m


def _k4_or_k5(b: torch.Tensor, kind: int) -> Parts:
    rows, nsup = b.shape[:2]
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    sc, m = _scale_min_k4(b[..., 4:16])
    qs = b[..., 16:] if kind == GGUF_Q4_K else b[..., 48:]
    chunks = qs.reshape(rows, nsup, 4, 1, 32)
    u = torch.cat([chunks & 0x0F, chunks >> 4], dim=3).reshape(rows, nsup, 8, 32)  # sub-blocks 2i, 2i + 1
    if kind == GGUF_Q5_K:
        shifts = torch.arange(8, dtype=torch.uint8).reshape(1, 1, 8, 1)
        u = u | (((b[..., 16:48][:, :, None, :] >> shifts) & 1) << 4)
    dj = d[..., None] * sc.float()  # [rows, nsup, 8], exact in fp32
    cj = -(dmin[..., None] * m.float())
    return u.reshape(rows, nsup * 8, 32), _halves(dj.reshape(rows, -1)), _halves(cj.reshape(rows, -1)), False


def q6_k_parts(raw: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q6_K blocks uint8 [rows, blocks * 210] -> (u uint8 [rows, nb, 32], d float32 [rows, nb] (fp16 values: the
    super-block's d), sc int8 [rows, nb, 2]): w = d * sc_half * (u - 32)."""
    rows = raw.shape[0]
    b = raw.reshape(rows, -1, GGUF_BLOCK_BYTES[GGUF_Q6_K])
    nsup = b.shape[1]
    ql = b[..., 0:128].reshape(rows, nsup, 2, 2, 32)  # [half n, l or l + 32, l]
    qh = b[..., 128:192].reshape(rows, nsup, 2, 1, 32)
    low = torch.stack([ql[:, :, :, 0] & 0x0F, ql[:, :, :, 1] & 0x0F, ql[:, :, :, 0] >> 4, ql[:, :, :, 1] >> 4], dim=3)
    high = (qh >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 1, 1, 4, 1)) & 3
    u = (low | (high << 4)).reshape(rows, nsup * 8, 32)  # weight 128 n + 32 quarter + l
    sc = b[..., 192:208].contiguous().view(torch.int8).reshape(rows, nsup * 8, 2)  # one per 16 weights
    d = _f16(b[..., 208:210]).repeat_interleave(8, dim=1)  # [rows, nsup * 8]
    return u, d, sc


def _q6_k(raw: torch.Tensor) -> Parts:
    u, d, sc = q6_k_parts(raw)
    dh = d[..., None] * sc.float()  # exact in fp32 (11 x 8 significant bits)
    return u, dh, dh * -32, False


GGUF_BLOCK_BYTES = {GGUF_Q4_0: 18, GGUF_Q4_1: 20, GGUF_Q5_0: 22, GGUF_Q5_1: 24, GGUF_Q8_0: 34, GGUF_Q4_K: 144,
                    GGUF_Q5_K: 176, GGUF_Q6_K: 210}
GGUF_BLOCK_WEIGHTS = {t: (SUPER if t in (GGUF_Q4_K, GGUF_Q5_K, GGUF_Q6_K) else BLOCK) for t in GGUF_BLOCK_BYTES}


def decode_gguf_blocks(raw: torch.Tensor, ggml_type: int) -> Parts:
    """raw uint8 [rows, blocks * block bytes] of one of GGUF_TYPE_NAMES' types -> (u, d, c, narrow) (module
    docstring)."""
    rows = raw.shape[0]
    b = raw.reshape(rows, -1, GGUF_BLOCK_BYTES[ggml_type])
    if ggml_type in (GGUF_Q4_K, GGUF_Q5_K):
        return _k4_or_k5(b, ggml_type)
    if ggml_type == GGUF_Q6_K:
        return _q6_k(raw)
    return _block32(b, ggml_type)
