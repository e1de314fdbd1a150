"""Block-quantized weights: GGUF block formats -> one staging form -> the packed layout of quant_gemm.h.

Every supported format is written as  w = d * u + c  per block of 32 weights of one row (u unsigned, d and c fp16):
    Q4_0  (GGUF type 2, 18 B: fp16 d, 16 B nibbles)        u = q in [0, 16),  c = -8 d
    Q4_1  (GGUF type 3, 20 B: fp16 d, fp16 m, 16 B nibbles) u = q in [0, 16),  c = m
    Q8_0  (GGUF type 8, 34 B: fp16 d, 32 int8)             u = q + 128,       c = -128 d
    int8 (w8a8_int8): Q8_0's form, quantized at load with one fp16 scale per 32 weights of a row (finer than
    upstream's one scale per output row, which loses 4 points of top-1 agreement on SmolLM2: 95.3% vs bf16)
GGUF nibble order: byte j of a Q4 block holds weight j (low nibble) and weight j + 16 (high nibble).

Staging form (what a layer holds while its shards load): uint8 [rows, blocks * 36], per block fp16 d, fp16 c and
32 bytes of u. Packed form (what the kernel reads): see sgl-kernel/csrc/cpu/quant_gemm.h; rows are padded to a
multiple of 16 (d = c = 0) and K to a multiple of 32 (u = 0 for Q4, 128 for 8-bit, so the padding contributes 0).
"""

from __future__ import annotations

from typing import Tuple

import torch

from sglang.srt.mem_plan.quantization_sizes import cpu_packed_bytes

BLOCK = 32
TILE_ROWS = 16
STAGING_BLOCK_BYTES = 4 + BLOCK
RECORD_HEADER_BYTES = 2 * TILE_ROWS * 2  # fp16 d and c of 16 rows
GGUF_Q4_0, GGUF_Q4_1, GGUF_Q8_0 = 2, 3, 8
GGUF_BLOCK_BYTES = {GGUF_Q4_0: 18, GGUF_Q4_1: 20, GGUF_Q8_0: 34}
GGUF_TYPE_NAMES = {GGUF_Q4_0: "Q4_0", GGUF_Q4_1: "Q4_1", GGUF_Q8_0: "Q8_0"}


def record_bytes(bits: int) -> int:
    """Bytes of one packed record: 16 rows x 32 weights plus their fp16 d and c."""
    return RECORD_HEADER_BYTES + TILE_ROWS * BLOCK * bits // 8


def packed_bytes(rows: int, cols: int, bits: int) -> int:
    """Bytes the packed form of a [rows, cols] weight takes (what the runtime holds): the one rule in mem_plan/."""
    return cpu_packed_bytes(rows, cols, bits)


def _fp16_bytes(t: torch.Tensor) -> torch.Tensor:
    flat = torch.empty(t.numel(), dtype=torch.float16)  # fresh strides: a 1-element view may keep an odd one
    flat.copy_(t.reshape(-1))
    return flat.view(torch.uint8).reshape(*t.shape, 2)


def staging_from_parts(u: torch.Tensor, d: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """u uint8 [rows, blocks, 32], d and c [rows, blocks] (fp16-representable) -> staging uint8 [rows, blocks*36]."""
    rows, blocks = d.shape
    out = torch.cat([_fp16_bytes(d), _fp16_bytes(c), u], dim=2)
    return out.reshape(rows, blocks * STAGING_BLOCK_BYTES)


def parts_from_staging(staging: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = staging.shape[0]
    s = staging.reshape(rows, -1, STAGING_BLOCK_BYTES)
    d = s[:, :, 0:2].contiguous().view(torch.float16).squeeze(-1)
    c = s[:, :, 2:4].contiguous().view(torch.float16).squeeze(-1)
    return s[:, :, 4:], d, c


def staging_from_gguf(raw: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """GGUF blocks uint8 [rows, blocks * block_bytes] of Q4_0 / Q4_1 / Q8_0 -> staging form."""
    rows = raw.shape[0]
    b = raw.reshape(rows, -1, GGUF_BLOCK_BYTES[ggml_type])
    d = b[:, :, 0:2].contiguous().view(torch.float16).squeeze(-1)
    if ggml_type == GGUF_Q8_0:
        u = (b[:, :, 2:].contiguous().view(torch.int8).to(torch.int16) + 128).to(torch.uint8)
        return staging_from_parts(u, d, d * -128)
    qs = b[:, :, 4:] if ggml_type == GGUF_Q4_1 else b[:, :, 2:]
    u = torch.cat([qs & 0x0F, qs >> 4], dim=2)
    c = b[:, :, 2:4].contiguous().view(torch.float16).squeeze(-1) if ggml_type == GGUF_Q4_1 else d * -8
    return staging_from_parts(u, d, c)


def staging_q8_blocks(w: torch.Tensor) -> torch.Tensor:
    """Dense [rows, cols] -> Q8_0-style blocks (one fp16 scale max|w| / 127 per 32 weights), staging form: for
    w8a8_int8 and for GGUF linear tensors of types without a kernel of their own (F16, F32, K-quants)."""
    rows, cols = w.shape
    blocks = -(-cols // BLOCK)
    w = torch.nn.functional.pad(w.float(), (0, blocks * BLOCK - cols)).reshape(rows, blocks, BLOCK)
    d = (w.abs().amax(dim=2) / 127.0).to(torch.float16).float()
    safe = torch.where(d > 0, d, torch.ones_like(d))
    q = torch.clamp(torch.round(w / safe[:, :, None]), -127, 127).to(torch.int16)
    return staging_from_parts((q + 128).to(torch.uint8), d, d * -128)


def dequantize_staging(staging: torch.Tensor, cols: int) -> torch.Tensor:
    """Staging form -> float32 [rows, cols] (w = d * u + c)."""
    u, d, c = parts_from_staging(staging)
    w = d.float()[:, :, None] * u.float() + c.float()[:, :, None]
    return w.reshape(staging.shape[0], -1)[:, :cols]


def staging_bits(staging: torch.Tensor) -> int:
    """4 when every u fits a nibble (Q4_0 / Q4_1 shards), else 8."""
    u, _, _ = parts_from_staging(staging)
    return 4 if int(u.max()) < 16 else 8


def pack(staging: torch.Tensor, bits: int) -> torch.Tensor:
    """Staging form [rows, blocks * 36] -> packed uint8 [tiles, blocks, record_bytes(bits)]."""
    u, d, c = parts_from_staging(staging)
    rows, blocks = d.shape
    tiles = -(-rows // TILE_ROWS)
    pad = tiles * TILE_ROWS - rows
    if pad:
        fill = 0 if bits == 4 else 128
        u = torch.cat([u, torch.full((pad, blocks, BLOCK), fill, dtype=torch.uint8)], dim=0)
        d = torch.cat([d, torch.zeros(pad, blocks, dtype=d.dtype)], dim=0)
        c = torch.cat([c, torch.zeros(pad, blocks, dtype=c.dtype)], dim=0)
    # u: [tiles, 16 rows, blocks, 8 groups, 4] -> [tiles, blocks, 8 groups, 16 rows, 4]: a group is one register
    g = u.reshape(tiles, TILE_ROWS, blocks, 8, 4).permute(0, 2, 3, 1, 4)
    if bits == 4:
        g = g[:, :, :4] | (g[:, :, 4:] << 4)
    head = [x.reshape(tiles, TILE_ROWS, blocks).permute(0, 2, 1).contiguous().view(torch.uint8) for x in (d, c)]
    return torch.cat([head[0], head[1], g.reshape(tiles, blocks, -1)], dim=2).contiguous()


def unpack_dequantize(packed: torch.Tensor, bits: int, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """Packed form -> dense [rows, cols] of dtype: the torch path for machines without the kernels (per call)."""
    tiles, blocks, _ = packed.shape
    d = packed[:, :, :32].contiguous().view(torch.float16).float()  # [tiles, blocks, 16]
    c = packed[:, :, 32:64].contiguous().view(torch.float16).float()
    g = packed[:, :, 64:].reshape(tiles, blocks, -1, TILE_ROWS, 4)
    if bits == 4:
        g = torch.cat([g & 0x0F, g >> 4], dim=2)
    u = g.float()  # [tiles, blocks, 8 groups, 16 rows, 4]
    w = u * d[:, :, None, :, None] + c[:, :, None, :, None]
    w = w.permute(0, 3, 1, 2, 4).reshape(tiles * TILE_ROWS, blocks * BLOCK)
    return w[:rows, :cols].to(dtype)
