"""Block-quantized weights: GGUF block formats -> a staging form -> the packed layout of quant_gemm.h.

Every supported format is written as  w = d * u + c  per block of 32 weights of one row (u unsigned; gguf_blocks.py
derives u, d, c from each GGUF type exactly):
    Q4_0, Q4_1, Q5_0, Q5_1, Q8_0   d and c fp16 per 32 weights
    Q4_K, Q5_K                     d and c fp32 per 32 (d * sc and -dmin * m: exact in fp32, not in fp16)
    Q6_K                           fp16 d and int8 sc per 16 (d * sc and -32 d * sc, in fp32 where used)
    int8 (w8a8_int8, and GGUF types without a kernel): quantized at load per 32 weights of a row, u in [0, 256)
          with a fitted fp16 step d and offset c (staging_q8_blocks; the record is the same as Q8_0's)

Staging forms (what a layer holds while its shards load), uint8 [rows, blocks * bytes per block]:
    narrow  STAGING_BLOCK_BYTES = 36 per block: fp16 d, fp16 c, 32 bytes of u
    q6      Q6_STAGING_BLOCK_BYTES = 40 per block: fp16 d, int8 sc of weights 0-15, of 16-31, 4 zero bytes, 32 bytes
            of u (w = d sc (u - 32))
    wide    WIDE_STAGING_BLOCK_BYTES = 48 per block: fp32 d of weights 0-15, of 16-31, fp32 c of each, 32 bytes of u
Their widths tell them apart for a given number of columns (staging_kind); narrow and q6 blocks widen exactly
(widen). Packed form (what the kernel reads): see sgl-kernel/csrc/cpu/quant_layout.h; a format code
(quantization_sizes.cpu_format) names its bits and header: the fp16 header from narrow staging, Q6_K's from q6
staging, from wide staging the fp32 header where every block's halves share d and c, else the halves header. Rows are padded to a
multiple of 16 (d = c = 0) and K to a multiple of 32 (u = 0 for Q4, 128 for 8-bit, so the padding contributes 0).
"""

from __future__ import annotations

from typing import Tuple

import torch

from sglang.srt.layers.quantization.gguf_blocks import (GGUF_BLOCK_BYTES, GGUF_Q4_0, GGUF_Q4_1, GGUF_Q6_K,
                                                        GGUF_Q8_0, GGUF_TYPE_NAMES, decode_gguf_blocks, q6_k_parts)
from sglang.srt.mem_plan import quantization_sizes as sizes

__all__ = ["GGUF_BLOCK_BYTES", "GGUF_Q4_0", "GGUF_Q4_1", "GGUF_Q8_0", "GGUF_TYPE_NAMES"]

# the packed form's geometry is mem_plan/quantization_sizes.py's (the plan sizes it)
BLOCK = sizes.CPU_PACK_COLS
HALF = BLOCK // 2
TILE_ROWS = sizes.CPU_PACK_ROWS
STAGING_BLOCK_BYTES = 4 + BLOCK  # fp16 d, fp16 c, BLOCK bytes of u
WIDE_STAGING_BLOCK_BYTES = 16 + BLOCK  # fp32 d (2 halves), fp32 c (2 halves), BLOCK bytes of u
Q6_STAGING_BLOCK_BYTES = 8 + BLOCK  # fp16 d, int8 sc (2 halves), 4 zero bytes, BLOCK bytes of u
NARROW, Q6, WIDE = "narrow", "q6", "wide"  # staging kinds
Q6_OFFSET = 32  # Q6_K's levels are u - 32
LSQ_PASSES = 2  # least-squares refits of an int8 block's step and offset (each kept only where it lowers the error)
QUANT_CHUNK_WEIGHTS = 1 << 16  # weights quantized at a time by staging_q8_blocks (temporaries in cache)


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


def wide_staging_from_parts(u: torch.Tensor, d: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """u uint8 [rows, blocks, 32], d and c float32 [rows, blocks, 2] (halves) -> wide staging [rows, blocks * 48]."""
    rows, blocks = u.shape[:2]
    head = torch.cat([d, c], dim=2).to(torch.float32).contiguous().view(torch.uint8)  # [rows, blocks, 16]
    return torch.cat([head, u], dim=2).reshape(rows, blocks * WIDE_STAGING_BLOCK_BYTES)


def wide_parts(staging: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Wide staging -> (u uint8 [rows, blocks, 32], d, c float32 [rows, blocks, 2])."""
    rows = staging.shape[0]
    s = staging.reshape(rows, -1, WIDE_STAGING_BLOCK_BYTES)
    dc = s[:, :, :16].contiguous().view(torch.float32)
    return s[:, :, 16:], dc[:, :, 0:2], dc[:, :, 2:4]


def q6_staging_from_parts(u: torch.Tensor, d: torch.Tensor, sc: torch.Tensor) -> torch.Tensor:
    """u uint8 [rows, blocks, 32], d [rows, blocks] (fp16 values), sc int8 [rows, blocks, 2] -> q6 staging."""
    rows, blocks = u.shape[:2]
    pad = torch.zeros(rows, blocks, 4, dtype=torch.uint8)
    out = torch.cat([_fp16_bytes(d), sc.contiguous().view(torch.uint8), pad, u], dim=2)
    return out.reshape(rows, blocks * Q6_STAGING_BLOCK_BYTES)


def q6_parts(staging: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q6 staging -> (u uint8 [rows, blocks, 32], d fp16 [rows, blocks], sc int8 [rows, blocks, 2])."""
    s = staging.reshape(staging.shape[0], -1, Q6_STAGING_BLOCK_BYTES)
    return s[:, :, 8:], s[:, :, 0:2].contiguous().view(torch.float16).squeeze(-1), s[:, :, 2:4].contiguous().view(
        torch.int8)


def staging_kind(staging: torch.Tensor, cols: int) -> str:
    """NARROW, Q6 or WIDE: which staging form a tensor of a [rows, cols] weight is (its width per block says)."""
    per_block = staging.shape[-1] // -(-cols // BLOCK)
    return {STAGING_BLOCK_BYTES: NARROW, Q6_STAGING_BLOCK_BYTES: Q6, WIDE_STAGING_BLOCK_BYTES: WIDE}[per_block]


def is_wide(staging: torch.Tensor, cols: int) -> bool:
    return staging_kind(staging, cols) == WIDE


def widen(staging: torch.Tensor, cols: int) -> torch.Tensor:
    """Narrow or q6 staging -> the wide form of the same weights (fp16 -> fp32 and d * sc are exact)."""
    if staging_kind(staging, cols) == Q6:
        u, d, sc = q6_parts(staging)
        dh = d.float()[..., None] * sc.float()
        return wide_staging_from_parts(u, dh, dh * -Q6_OFFSET)
    u, d, c = parts_from_staging(staging)
    return wide_staging_from_parts(u, d.float()[..., None].expand(*d.shape, 2), c.float()[..., None].expand(*c.shape, 2))


def staging_from_gguf(raw: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """GGUF blocks uint8 [rows, blocks * block bytes] of a GGUF_TYPE_NAMES type -> narrow staging where the type's d
    and c are fp16 values (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), q6 staging for Q6_K, else wide (Q4_K, Q5_K)."""
    if ggml_type == GGUF_Q6_K:
        return q6_staging_from_parts(*q6_k_parts(raw))
    u, d, c, narrow = decode_gguf_blocks(raw, ggml_type)
    return staging_from_parts(u, d[..., 0], c[..., 0]) if narrow else wide_staging_from_parts(u, d, c)


def _fp16_down(x: torch.Tensor) -> torch.Tensor:
    """The largest fp16 value <= x (float32 in and out)."""
    h = x.to(torch.float16)
    return torch.where(h.float() > x, torch.nextafter(h, torch.full_like(h, -float("inf"))), h).float()


def _fp16_up(x: torch.Tensor) -> torch.Tensor:
    """The smallest fp16 value >= x (float32 in and out)."""
    h = x.to(torch.float16)
    return torch.where(h.float() < x, torch.nextafter(h, torch.full_like(h, float("inf"))), h).float()


def _levels(w: torch.Tensor, d: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """u: the nearest level of d * u + c for each weight, in [0, 255] (0 where d is 0), as float32."""
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    return ((w - c[..., None]) * inv[..., None]).round_().clamp_(0, 255)


def _sq_error(w: torch.Tensor, u: torch.Tensor, d: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    r = u * d[..., None]
    r += c[..., None]
    r -= w
    return r.square_().sum(-1)


def _int8_blocks(w: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w float32 [rows, blocks, 32] -> u, d, c with w ~ d * u + c per block (d, c fp16-representable).
    Start from the block's range (c = min rounded down to fp16, d = (max - c) / 255 rounded up: every weight in
    reach), then LSQ_PASSES times refit d and c by least squares to the levels chosen and round again, keeping per
    block the (d, c) with the smallest squared error. Both steps use the offset c, which a symmetric int8 scale
    (c = -128 d) wastes: one outlier on one side no longer halves the resolution of the rest of the block."""
    lo, hi = w.amin(-1), w.amax(-1)
    c = _fp16_down(lo)
    d = _fp16_up((hi - c) / 255.0)
    u = _levels(w, d, c)
    if LSQ_PASSES == 0:
        return u.to(torch.uint8), d, c
    err = _sq_error(w, u, d, c)
    n, sw = float(BLOCK), w.sum(-1)
    best_d, best_c = d, c
    for _ in range(LSQ_PASSES):
        su = u.sum(-1)
        det = n * u.square().sum(-1) - su * su
        ok = det > 0
        d_fit = (n * torch.linalg.vecdot(u, w) - su * sw) / torch.where(ok, det, torch.ones_like(det))
        d = torch.where(ok, d_fit, d).to(torch.float16).float()
        c = torch.where(ok, (sw - d * su) / n, c).to(torch.float16).float()
        u = _levels(w, d, c)
        err_new = _sq_error(w, u, d, c)
        better = err_new < err
        best_d, best_c, err = torch.where(better, d, best_d), torch.where(better, c, best_c), torch.minimum(err, err_new)
    return _levels(w, best_d, best_c).to(torch.uint8), best_d, best_c


def staging_q8_blocks(w: torch.Tensor) -> torch.Tensor:
    """Dense [rows, cols] -> 8-bit blocks of 32 weights (_int8_blocks), staging form: for w8a8_int8 and for GGUF
    linear tensors of types without a kernel of their own (F16, F32, K-quants). A K tail repeats the row's last
    weight (the kernel's zero activations cancel it; zeros would widen the block's range). In row chunks of at
    most QUANT_CHUNK_WEIGHTS weights: the float32 temporaries stay in cache (2x faster than whole layers)."""
    rows, cols = w.shape
    blocks = -(-cols // BLOCK)
    chunk_rows = max(1, QUANT_CHUNK_WEIGHTS // (blocks * BLOCK))
    parts = []
    for r0 in range(0, rows, chunk_rows):
        wc = w[r0 : r0 + chunk_rows].float()
        if blocks * BLOCK > cols:
            wc = torch.cat([wc, wc[:, -1:].expand(-1, blocks * BLOCK - cols)], dim=1)
        parts.append(staging_from_parts(*_int8_blocks(wc.reshape(wc.shape[0], blocks, BLOCK))))
    return torch.cat(parts, dim=0)


def staging_bits(staging: torch.Tensor) -> int:
    """4 when every u of a narrow staging fits a nibble (Q4_0 / Q4_1 shards), else 8."""
    u, _, _ = parts_from_staging(staging)
    return 4 if int(u.max()) < 16 else 8


def staging_format(staging: torch.Tensor, cols: int) -> int:
    """The format code a staging tensor of a [rows, cols] weight packs to (bits + 16 * header, quant_layout.h): the
    fewest bits and the smallest header that hold its values exactly."""
    kind = staging_kind(staging, cols)
    if kind == NARROW:
        return staging_bits(staging)
    if kind == Q6:
        return sizes.cpu_format(8, sizes.HEAD_Q6)
    u, d, c = wide_parts(staging)
    bits = 4 if int(u.max()) < 16 else 8
    same = torch.equal(d[..., 0], d[..., 1]) and torch.equal(c[..., 0], c[..., 1])
    return sizes.cpu_format(bits, sizes.HEAD_F32 if same else sizes.HEAD_HALVES)


def _tiles(x: torch.Tensor, pad: int, fill: int) -> torch.Tensor:
    return torch.cat([x, torch.full((pad, *x.shape[1:]), fill, dtype=x.dtype)], dim=0) if pad else x


def pack(staging: torch.Tensor, fmt: int) -> torch.Tensor:
    """Staging form -> packed uint8 [tiles, blocks, cpu_record_bytes(fmt)]; fmt: a format code (4 / 8 from narrow
    staging, the fp32 headers from wide staging: staging_format)."""
    bits, head = sizes.format_bits(fmt), sizes.format_head(fmt)
    if head == sizes.HEAD_F16:
        u, d, c = parts_from_staging(staging)
        heads = [d, c]
    elif head == sizes.HEAD_Q6:
        u, d, sc = q6_parts(staging)
        heads = [d, sc[..., 0], sc[..., 1]]
    else:
        u, d, c = wide_parts(staging)
        heads = [d[..., 0], c[..., 0]] if head == sizes.HEAD_F32 else [d[..., 0], d[..., 1], c[..., 0], c[..., 1]]
    rows, blocks = u.shape[:2]
    tiles = -(-rows // TILE_ROWS)
    pad = tiles * TILE_ROWS - rows
    u = _tiles(u, pad, 0 if bits == 4 else 128)
    # u: [tiles, 16 rows, blocks, 8 groups, 4] -> [tiles, blocks, 8 groups, 16 rows, 4]: a group is one register
    g = u.reshape(tiles, TILE_ROWS, blocks, 8, 4).permute(0, 2, 3, 1, 4)
    if bits == 4:
        g = g[:, :, :4] | (g[:, :, 4:] << 4)
    head_bytes = [_tiles(x, pad, 0).reshape(tiles, TILE_ROWS, blocks).permute(0, 2, 1).contiguous().view(torch.uint8)
                  for x in heads]
    return torch.cat([*head_bytes, g.reshape(tiles, blocks, -1)], dim=2).contiguous()


def unpack_dequantize(packed: torch.Tensor, fmt: int, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """Packed form -> dense [rows, cols] of dtype, each weight d * u + c in fp32: the torch path for machines without
    the kernels (per call)."""
    tiles, blocks, _ = packed.shape
    bits, head = sizes.format_bits(fmt), sizes.format_head(fmt)
    hb = sizes.cpu_header_bytes(head)
    if head == sizes.HEAD_F16:
        d = packed[:, :, :32].contiguous().view(torch.float16).float()  # [tiles, blocks, 16]
        c = packed[:, :, 32:64].contiguous().view(torch.float16).float()
        d, c = d[:, :, None], c[:, :, None]  # [tiles, blocks, 1 half, 16 rows]
    elif head == sizes.HEAD_Q6:
        sc = packed[:, :, 32:64].contiguous().view(torch.int8).float().reshape(tiles, blocks, 2, TILE_ROWS)
        d = packed[:, :, :32].contiguous().view(torch.float16).float()[:, :, None] * sc
        c = d * -Q6_OFFSET
    else:
        f = packed[:, :, :hb].contiguous().view(torch.float32).reshape(tiles, blocks, -1, TILE_ROWS)
        n = f.shape[2] // 2
        d, c = f[:, :, :n], f[:, :, n:]  # [tiles, blocks, 1 or 2 halves, 16 rows]
    g = packed[:, :, hb:].reshape(tiles, blocks, -1, TILE_ROWS, 4)
    if bits == 4:
        g = torch.cat([g & 0x0F, g >> 4], dim=2)
    u = g.float().reshape(tiles, blocks, d.shape[2], -1, TILE_ROWS, 4)  # groups 0-3: the first half
    w = u * d[:, :, :, None, :, None] + c[:, :, :, None, :, None]
    w = w.reshape(tiles, blocks, 8, TILE_ROWS, 4).permute(0, 3, 1, 2, 4).reshape(tiles * TILE_ROWS, blocks * BLOCK)
    return w[:rows, :cols].to(dtype)
