"""Quantize and dequantize K/V rows for the KV formats of mem_plan/kv_quant.py (the layouts and bytes live there).

    quantize(fmt, x, part, scale, smooth, turned)   x [N, H, D] -> {field: codes/scales [N, H, elems]}  (part "k"/"v")
    dequantize(fmt, fields, part, dtype, scale, rotated=False, dim, smooth, turned) -> [N, H, D]

`turned` says whether the part is stored turned (x @ R); None: the format's rule (is_rotated). A pool whose fp8 scales
came from a checkpoint stores its keys plain (the scales were measured on unturned keys): it passes False.

`rotated=True` returns rows of a rotated part (is_rotated) in the rotated basis, x @ R: attention then turns the
query once (q @ R: q.k is unchanged, R orthonormal) and the output once (out_r @ R^T) instead of every key and value.
fp8 parts take the fixed per-head scale [H] (fp32); the int formats carry their scales per row; int4 keys take the
fixed per-head channel multiplier w [H, D] (fp32; None = ones).

Rules (per row = one token's head vector):
  fp8      code = fp8(r / scale), saturated to the format's finite range; values: r = x; keys: r = x @ R (the
           rounding error of a few large channels no longer dominates q.k), plain where the scales are a checkpoint's
  int8     s = fp16(amax / 127), code = round(r / s) in [-127, 127]; values: r = x; keys: r = x @ R (a key head's
           few large channels, spread over all 64 by R, no longer set the step of the rest: decode KL / 4 on the
           default model, docs/kv_quantization.md)
  int4     asymmetric over the row: s = fp16((max r - min r) / 15), m = fp16(min r), code = round((r - m) / s) in
           [0, 15], r' = code x s + m; values: r = x @ R; keys: r = (x * w) @ R, x' = (r' @ R^T) / w, where w
           is the calibrated per-channel multiplier (E[q^2] / E[k^2])^a (kv_quant.INT4_KEY_SMOOTH_EXPONENT, 1/8):
           q.k = (q / w).(k * w), so the error of r (spread evenly over the channels by R) reaches the logits
           weighted by q / w -- the channels queries weigh most are stored with finer steps. Keys are read back in the
           unrotated basis (no query turn: the multiplier makes the rotated basis a per-head one).
  int2_hadamard  x turned by R; keys: 4 Lloyd-Max levels of a unit Gaussian {-1.510, -0.4528, 0.4528, 1.510} with
           thresholds {-0.9816, 0, 0.9816} x the row's RMS; values: 3 levels {-1, 0, 1} with thresholds +-0.6120 x
           RMS; then the least-squares scale sum(x * level) / sum(level^2), stored as one byte of a log2 grid
           (LOG_SCALE_STEPS per octave, code 0 = an all-zero row)
"""

from __future__ import annotations

import functools
import math
from typing import Dict, Optional

import torch

from sglang.srt.mem_plan.kv_quant import FP8_FORMATS, TRITS_PER_BYTE
from sglang.srt.mem_plan.kv_quant import ROTATED_PARTS as STORED_TURNED

FP8_TORCH = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
# read in the rotated basis: the parts the plan's table stores turned (mem_plan/kv_quant.ROTATED_PARTS), less int4's
# keys, which are turned inside the codec with their multiplier (a per-head basis) and read back plain
ROTATED_PARTS = {fmt: tuple(p for p in parts if (fmt, p) != ("int4", "k")) for fmt, parts in STORED_TURNED.items()}
ROTATION_SEED = 20240523
LOG_SCALE_STEPS, LOG_SCALE_OFFSET = 12, 176  # scale = 2^((code - 176) / 12): 2^-14.6 .. 2^6.6, steps of 5.9%
LEVELS_2BIT = (-1.510, -0.4528, 0.4528, 1.510)
THRESHOLDS_2BIT = (-0.9816, 0.0, 0.9816)
THRESHOLD_TERNARY = 0.6120


def is_rotated(fmt: str, part: str) -> bool:
    return part in ROTATED_PARTS.get(fmt, ())


@functools.lru_cache(maxsize=None)
def _rotation_cpu(dim: int) -> torch.Tensor:
    """A fixed orthonormal [dim, dim] fp32 matrix: a Sylvester Hadamard / sqrt(dim) with seeded random column signs
    when dim is a power of two, else the Q of a seeded Gaussian matrix."""
    gen = torch.Generator().manual_seed(ROTATION_SEED + dim)
    if dim & (dim - 1) == 0:
        h = torch.ones(1, 1)
        while h.shape[0] < dim:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        signs = torch.randint(0, 2, (dim,), generator=gen).float() * 2 - 1
        return (h * signs[None, :] / math.sqrt(dim)).contiguous()
    q, r = torch.linalg.qr(torch.randn(dim, dim, generator=gen, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))[None, :]).float().contiguous()


@functools.lru_cache(maxsize=None)
def _rotation_on(dim: int, device: str, dtype: torch.dtype) -> torch.Tensor:
    return _rotation_cpu(dim).to(device=device, dtype=dtype)


def rotation(dim: int, device="cpu", dtype=torch.float32) -> torch.Tensor:
    """R [dim, dim], one tensor per (dim, device, dtype) kept for the process: no host-to-device copy after the
    first call (a CUDA graph captures the write path's `x @ R` over the same tensor it replays)."""
    return _rotation_on(dim, str(torch.device(device)), dtype)


@functools.lru_cache(maxsize=None)
def _rotation_t_on(dim: int, device: str) -> torch.Tensor:
    return _rotation_on(dim, device, torch.float32).T.contiguous()


def rotation_t(dim: int, device="cpu") -> torch.Tensor:
    """R^T [dim, dim] fp32, contiguous, one tensor per (dim, device): what turns an output back out of turned values."""
    return _rotation_t_on(dim, str(torch.device(device)))


@functools.lru_cache(maxsize=None)
def _constant(values: tuple, device: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A small constant table on a device, made once (no host-to-device copy per call: CUDA-graph safe)."""
    return torch.tensor(values, dtype=dtype, device=device)


@functools.lru_cache(maxsize=None)
def _trit_table(device: str = "cpu") -> torch.Tensor:
    """[243, 5] the trits (0, 1, 2) of every byte value below 3^5, least significant first (one per device)."""
    b = torch.arange(3 ** TRITS_PER_BYTE)
    return torch.stack([(b // 3 ** j) % 3 for j in range(TRITS_PER_BYTE)], -1).to(device=device, dtype=torch.int64)


def _log_scale_code(s: torch.Tensor) -> torch.Tensor:
    code = torch.round(torch.log2(s.clamp_min(1e-30)) * LOG_SCALE_STEPS) + LOG_SCALE_OFFSET
    return torch.where(s > 0, code.clamp(1, 255), torch.zeros_like(code)).to(torch.uint8)


def _log_scale_value(code: torch.Tensor) -> torch.Tensor:
    c = code.to(torch.float32)
    return torch.where(c > 0, torch.exp2((c - LOG_SCALE_OFFSET) / LOG_SCALE_STEPS), torch.zeros_like(c))


def _pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def _unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack([packed & 15, packed >> 4], -1).flatten(-2)


def _pack_crumbs(codes: torch.Tensor) -> torch.Tensor:
    c = codes.to(torch.uint8)
    return c[..., 0::4] | (c[..., 1::4] << 2) | (c[..., 2::4] << 4) | (c[..., 3::4] << 6)


def _unpack_crumbs(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack([(packed >> s) & 3 for s in (0, 2, 4, 6)], -1).flatten(-2)


def _pack_trits(trits: torch.Tensor) -> torch.Tensor:
    n = trits.shape[-1]
    pad = -n % TRITS_PER_BYTE
    if pad:
        trits = torch.cat([trits, torch.ones(*trits.shape[:-1], pad, dtype=trits.dtype, device=trits.device)], -1)
    t = trits.to(torch.int32).unflatten(-1, (-1, TRITS_PER_BYTE))
    weights = _constant(tuple(3 ** j for j in range(TRITS_PER_BYTE)), str(t.device), torch.int32)
    return (t * weights).sum(-1).to(torch.uint8)


def _unpack_trits(packed: torch.Tensor, n: int) -> torch.Tensor:
    table = _trit_table(str(packed.device))
    return table[packed.to(torch.int64)].flatten(-2)[..., :n]


def quantize(fmt: str, x: torch.Tensor, part: str, scale: Optional[torch.Tensor] = None,
             smooth: Optional[torch.Tensor] = None, turned: Optional[bool] = None) -> Dict[str, torch.Tensor]:
    """x [N, H, D] -> the part's fields ({part: codes, part + '_scale': scales}) for a quantized format."""
    x = x.float()
    if fmt == "int4" and part == "k":
        x = (x if smooth is None else x * smooth.float()[None]) @ rotation(x.shape[-1], x.device)
    elif is_rotated(fmt, part) if turned is None else turned:
        x = x @ rotation(x.shape[-1], x.device)
    sname = part + "_scale"
    if fmt in FP8_FORMATS:
        dt = FP8_TORCH[fmt]
        fmax = torch.finfo(dt).max
        codes = (x / scale.view(1, -1, 1)).clamp(-fmax, fmax).to(dt)
        return {part: codes.view(torch.uint8)}
    if fmt == "int8":
        s = (x.abs().amax(-1, keepdim=True) / 127).to(torch.float16)
        s = torch.where(s > 0, s, torch.ones_like(s))
        codes = torch.round(x / s.float()).clamp(-127, 127).to(torch.int8)
        return {part: codes, sname: s}
    if fmt == "int4":
        lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
        s = ((hi - lo) / 15).to(torch.float16)
        m = lo.to(torch.float16)
        step = torch.where(s > 0, s.float(), torch.ones_like(s, dtype=torch.float32))
        codes = torch.round((x - m.float()) / step).clamp(0, 15)
        return {part: _pack_nibbles(codes), sname: torch.cat([s, m], -1)}
    if fmt == "int2_hadamard":
        rms = x.pow(2).mean(-1, keepdim=True).sqrt()
        if part == "k":
            bounds = _constant(THRESHOLDS_2BIT, str(x.device))
            codes = torch.bucketize(x / rms.clamp_min(1e-30), bounds)  # 0..3
            levels = _constant(LEVELS_2BIT, str(x.device))[codes]
        else:
            t = THRESHOLD_TERNARY
            z = x / rms.clamp_min(1e-30)
            codes = (z > t).to(torch.int64) - (z < -t).to(torch.int64) + 1  # 0, 1, 2 = -1, 0, +1
            levels = (codes - 1).float()
        denom = levels.pow(2).sum(-1, keepdim=True)
        s = torch.where(denom > 0, (x * levels).sum(-1, keepdim=True) / denom.clamp_min(1e-30), torch.zeros_like(denom))
        packed = _pack_crumbs(codes) if part == "k" else _pack_trits(codes)
        return {part: packed, sname: _log_scale_code(s.clamp_min(0))}
    raise ValueError(f"not a quantized KV format: {fmt}")


def dequantize(fmt: str, fields: Dict[str, torch.Tensor], part: str, dtype: torch.dtype,
               scale: Optional[torch.Tensor] = None, rotated: bool = False, dim: Optional[int] = None,
               smooth: Optional[torch.Tensor] = None, turned: Optional[bool] = None) -> torch.Tensor:
    """The part's fields [N, H, e] -> [N, H, D] in dtype (in the rotated basis when rotated and is_rotated)."""
    codes = fields[part]
    sname = part + "_scale"
    if fmt in FP8_FORMATS:
        x = codes.view(FP8_TORCH[fmt]).to(torch.float32) * scale.view(1, -1, 1)
    elif fmt == "int8":
        x = codes.to(torch.float32) * fields[sname].to(torch.float32)
    elif fmt == "int4":
        sm = fields[sname].to(torch.float32)
        x = _unpack_nibbles(codes).to(torch.float32) * sm[..., :1] + sm[..., 1:]
    elif fmt == "int2_hadamard":
        s = _log_scale_value(fields[sname])
        if part == "k":
            x = _constant(LEVELS_2BIT, str(codes.device))[_unpack_crumbs(codes).to(torch.int64)] * s
        else:
            x = (_unpack_trits(codes, dim).to(torch.float32) - 1) * s
    else:
        raise ValueError(f"not a quantized KV format: {fmt}")
    if (is_rotated(fmt, part) if turned is None else turned) and not rotated:
        x = x @ rotation(x.shape[-1], x.device).T
    if fmt == "int4" and part == "k":
        x = x @ rotation(x.shape[-1], x.device).T
        if smooth is not None:
            x = x / smooth.float()[None]
    return x.to(dtype)
