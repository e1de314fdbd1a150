"""Reading a block of the KV pool in its stored format inside the attention kernels: q . k and p . v computed from
the codes, with the scales folded in, never a dequantized copy of the pool (mem_plan/kv_quant.py: the fields;
mem_cache/kv_quant_codec.py: the rules these follow).

    key_block_scores(q, ...)    -> [ROWS, BLOCK_N] fp32  q . k of every (query row, key) pair, before sm_scale and
                                   before the fp8 per-(layer, head) K scale (the caller multiplies by both)
    value_block_product(p, ...) -> [ROWS, BLOCK_DV] fp32  p @ V, before the fp8 per-(layer, head) V scale

Per format (KV_FORMAT, a constexpr; kv_formats.py maps a pool to it):
  PLAIN     K/V in a float dtype: loaded and cast to the query dtype.
  FP8_E4M3, FP8_E5M2   uint8 bytes bitcast to tl.float8e4nv / tl.float8e5 and cast to the query dtype (exact:
            every fp8 value is an fp16 value); the per-head scales multiply the scores / the output (the caller).
  INT8      codes cast to the query dtype (exact); the per-token fp16 scale s_t folds into the score
            (q . c_t) s_t and into the probabilities (p_t s_t) . c_t.
  INT4      two codes a byte (element j in byte j // 2, low nibble first), per token (s_t, m_t): x = c s_t + m_t, so
            q . x_t = (q . c_t) s_t + m_t sum(q) and p . x = (p s) . c + sum_t p_t m_t (every column).
  INT2_HADAMARD  keys four 2-bit codes a byte (element j: bits 2 (j % 4) of byte j // 4) naming the symmetric levels
            +-LEVEL_IN, +-LEVEL_OUT; values five trits a byte (element j: digit j % 5 of byte j // 5 in base 3,
            level = trit - 1); one log-scale byte per vector: s = 2^((c - OFFSET) / STEPS), 0 for c = 0.
The rotated parts (int4 K, int2_hadamard K and V) are attended in the rotated basis: the backend turns the query
(and the fresh K/V of a prefill) before the kernel and the output back after it, as torch_native does.
"""

from __future__ import annotations

import triton.language as tl

from sglang.srt.layers.attention.triton_ops.jit_mode import lazy_jit_helper
from sglang.srt.mem_cache import kv_quant_codec as codec

FMT_PLAIN = tl.constexpr(0)
FMT_FP8_E4M3 = tl.constexpr(1)
FMT_FP8_E5M2 = tl.constexpr(2)
FMT_INT8 = tl.constexpr(3)
FMT_INT4 = tl.constexpr(4)
FMT_INT2_HADAMARD = tl.constexpr(5)

_L = codec.LEVELS_2BIT
assert _L[0] == -_L[3] and _L[1] == -_L[2] and 0 < _L[2] < _L[3], "the kernels assume symmetric 2-bit key levels"
LEVEL_IN = tl.constexpr(float(_L[2]))
LEVEL_OUT = tl.constexpr(float(_L[3]))
LOG_SCALE_STEPS = tl.constexpr(float(codec.LOG_SCALE_STEPS))
LOG_SCALE_OFFSET = tl.constexpr(float(codec.LOG_SCALE_OFFSET))
assert codec.TRITS_PER_BYTE == 5, "the kernels unpack five trits a byte"


@lazy_jit_helper
def log_scale(S, rows, stride_s, mask_n):
    """int2_hadamard: the vector scales [BLOCK_N] fp32 from their log-scale bytes."""
    c = tl.load(S + rows * stride_s, mask=mask_n, other=0).to(tl.float32)
    return tl.where(c > 0, tl.exp2((c - LOG_SCALE_OFFSET) / LOG_SCALE_STEPS), 0.0)


@lazy_jit_helper
def key_block_scores(q, q_sum, K, KS, key_rows, stride_k, stride_ks, offs_d, mask_d, mask_n,
                     KV_FORMAT: tl.constexpr):
    """q [ROWS, BLOCK_D] (query dtype; rows past the real ones zero); q_sum [ROWS] fp32 = sum(q) over the head dim
    (INT4 only); K / KS: the codes / per-token scales of one KV head; key_rows [BLOCK_N] the slots."""
    mask = mask_n[None, :] & mask_d[:, None]
    rows = key_rows[None, :]
    if KV_FORMAT == FMT_PLAIN:
        k = tl.load(K + rows * stride_k + offs_d[:, None], mask=mask, other=0.0).to(q.dtype)  # [BLOCK_D, BLOCK_N]
        qk = tl.dot(q, k, input_precision="ieee")
    elif KV_FORMAT == FMT_FP8_E4M3:
        b = tl.load(K + rows * stride_k + offs_d[:, None], mask=mask, other=0)
        qk = tl.dot(q, b.to(tl.float8e4nv, bitcast=True).to(q.dtype), input_precision="ieee")
    elif KV_FORMAT == FMT_FP8_E5M2:
        b = tl.load(K + rows * stride_k + offs_d[:, None], mask=mask, other=0)
        qk = tl.dot(q, b.to(tl.float8e5, bitcast=True).to(q.dtype), input_precision="ieee")
    elif KV_FORMAT == FMT_INT8:
        c = tl.load(K + rows * stride_k + offs_d[:, None], mask=mask, other=0).to(q.dtype)
        s = tl.load(KS + key_rows * stride_ks, mask=mask_n, other=0.0).to(tl.float32)
        qk = tl.dot(q, c, input_precision="ieee") * s[None, :]
    elif KV_FORMAT == FMT_INT4:
        b = tl.load(K + rows * stride_k + (offs_d // 2)[:, None], mask=mask, other=0).to(tl.int32)
        c = ((b >> ((offs_d % 2) * 4)[:, None]) & 15).to(q.dtype)
        s = tl.load(KS + key_rows * stride_ks, mask=mask_n, other=0.0).to(tl.float32)
        m = tl.load(KS + key_rows * stride_ks + 1, mask=mask_n, other=0.0).to(tl.float32)
        qk = tl.dot(q, c, input_precision="ieee") * s[None, :] + q_sum[:, None] * m[None, :]
    else:  # FMT_INT2_HADAMARD
        b = tl.load(K + rows * stride_k + (offs_d // 4)[:, None], mask=mask, other=0).to(tl.int32)
        c = (b >> ((offs_d % 4) * 2)[:, None]) & 3
        level = tl.where(c >= 2, 1.0, -1.0) * tl.where((c == 0) | (c == 3), LEVEL_OUT, LEVEL_IN)
        qk = tl.dot(q, level.to(q.dtype), input_precision="ieee") * log_scale(KS, key_rows, stride_ks, mask_n)[None, :]
    return qk


@lazy_jit_helper
def value_block_product(p, q, V, VS, key_rows, stride_v, stride_vs, offs_dv, mask_dv, mask_n,
                        KV_FORMAT: tl.constexpr):
    """p [ROWS, BLOCK_N] fp32 (zero for masked keys) @ the dequantized V block -> [ROWS, BLOCK_DV] fp32; q only
    names the dtype the products run in."""
    mask = mask_n[:, None] & mask_dv[None, :]
    rows = key_rows[:, None]
    if KV_FORMAT == FMT_PLAIN:
        v = tl.load(V + rows * stride_v + offs_dv[None, :], mask=mask, other=0.0).to(q.dtype)  # [BLOCK_N, BLOCK_DV]
        pv = tl.dot(p.to(q.dtype), v, input_precision="ieee")
    elif KV_FORMAT == FMT_FP8_E4M3:
        b = tl.load(V + rows * stride_v + offs_dv[None, :], mask=mask, other=0)
        pv = tl.dot(p.to(q.dtype), b.to(tl.float8e4nv, bitcast=True).to(q.dtype), input_precision="ieee")
    elif KV_FORMAT == FMT_FP8_E5M2:
        b = tl.load(V + rows * stride_v + offs_dv[None, :], mask=mask, other=0)
        pv = tl.dot(p.to(q.dtype), b.to(tl.float8e5, bitcast=True).to(q.dtype), input_precision="ieee")
    elif KV_FORMAT == FMT_INT8:
        c = tl.load(V + rows * stride_v + offs_dv[None, :], mask=mask, other=0).to(q.dtype)
        s = tl.load(VS + key_rows * stride_vs, mask=mask_n, other=0.0).to(tl.float32)
        pv = tl.dot((p * s[None, :]).to(q.dtype), c, input_precision="ieee")
    elif KV_FORMAT == FMT_INT4:
        b = tl.load(V + rows * stride_v + (offs_dv // 2)[None, :], mask=mask, other=0).to(tl.int32)
        c = ((b >> ((offs_dv % 2) * 4)[None, :]) & 15).to(q.dtype)
        s = tl.load(VS + key_rows * stride_vs, mask=mask_n, other=0.0).to(tl.float32)
        m = tl.load(VS + key_rows * stride_vs + 1, mask=mask_n, other=0.0).to(tl.float32)
        pv = tl.dot((p * s[None, :]).to(q.dtype), c, input_precision="ieee") + tl.sum(p * m[None, :], 1)[:, None]
    else:  # FMT_INT2_HADAMARD: trits
        b = tl.load(V + rows * stride_v + (offs_dv // 5)[None, :], mask=mask, other=0).to(tl.int32)
        r = offs_dv % 5
        div = tl.where(r == 0, 1, tl.where(r == 1, 3, tl.where(r == 2, 9, tl.where(r == 3, 27, 81))))
        level = ((b // div[None, :]) % 3 - 1).to(q.dtype)
        s = log_scale(VS, key_rows, stride_vs, mask_n)
        pv = tl.dot((p * s[None, :]).to(q.dtype), level, input_precision="ieee")
    return pv
