"""One step of the online softmax shared by the decode and extend kernels: attend a tile of query rows to one
block of keys and fold the result into the running state.

State per query row r: m_i[r] the largest score so far, l_i[r] = sum_t exp(score[r, t] - m_i[r]) and
acc[r, :] = sum_t exp(score[r, t] - m_i[r]) * V[t, :] over the keys seen so far (fp32). The attention output is
acc / l_i once every key has been seen; m_i + log(l_i) is the row's log-sum-exp.

Under the CPU interpreter a call of this helper costs about 0.2 ms (measured on the 2-core test machine); with the
interpreter tile set (tiles.py) a program makes one or a few calls, next to tens of Triton ops of its own.
"""

from __future__ import annotations

import triton.language as tl

from sglang.srt.layers.attention.triton_ops.jit_mode import lazy_jit_helper
from sglang.srt.layers.attention.triton_ops.kv_dequant import FMT_PLAIN, key_block_scores, value_block_product


@lazy_jit_helper
def attend_key_block(
    q, q_sum, m_i, l_i, acc, K, V, KS, VS, key_rows, stride_k, stride_v, stride_ks, stride_vs, offs_d, mask_d,
    offs_dv, mask_dv, mask_n, score_mask, sm_scale, v_scale, logit_cap, KV_FORMAT: tl.constexpr,
):
    """q [ROWS, BLOCK_D] (rows past the real ones are zeros); K, V: the key/value base pointers of one KV head and
    KS, VS its per-token scales (kv_dequant.py: the stored format KV_FORMAT); key_rows [BLOCK_N] the token rows of
    this key block (in the pool or in this forward's k/v), mask_n [BLOCK_N] which of them exist; score_mask
    [ROWS, BLOCK_N] (or broadcastable) which (query, key) pairs may attend. sm_scale includes an fp8 K scale,
    v_scale is the fp8 V scale (1.0 otherwise); logit_cap > 0 turns each score s into cap * tanh(s / cap) (Gemma 2),
    0 leaves it. Returns the updated (acc, m_i, l_i). Every row must see at least one allowed key before the output
    is read; a block in which a row sees no key leaves that row's state as it was (a sliding window masks whole
    blocks for some rows of a query tile), even before its first key.
    """
    qk = key_block_scores(q, q_sum, K, KS, key_rows, stride_k, stride_ks, offs_d, mask_d, mask_n,
                          KV_FORMAT) * sm_scale  # [ROWS, BLOCK_N] fp32
    if logit_cap > 0:  # tanh(x) = 2 sigmoid(2x) - 1
        qk = logit_cap * (2.0 * tl.sigmoid(2.0 * qk / logit_cap) - 1.0)
    qk = tl.where(score_mask, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key seen yet: exp(-inf - 0) = 0, never NaN
    alpha = tl.exp(m_i - m_safe)  # rescales what was accumulated under the old maximum
    p = tl.exp(qk - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    pv = value_block_product(p, q, V, VS, key_rows, stride_v, stride_vs, offs_dv, mask_dv, mask_n, KV_FORMAT)
    acc = acc * alpha[:, None] + pv * v_scale
    return acc, m_new, l_i


@lazy_jit_helper
def attend_ring_block(
    q, q_sum, m_i, l_i, acc, Ring_k, Ring_v, ring_row, first, count, stride_rkt, stride_rvt, offs_d, mask_d, offs_dv,
    mask_dv, sm_scale, WINDOW: tl.constexpr, ENTRIES: tl.constexpr, RING_N: tl.constexpr,
):
    """A request's recent-window ring (mem_cache/recent_window.py) as one key block: its `count` cached positions
    first .. first + count - 1, position p at entry ring_row * ENTRIES + p % WINDOW; Ring_k / Ring_v one KV head's
    bf16 rows, already in the stored basis (no scales, no turn). Returns the updated (acc, m_i, l_i)."""
    offs_w = tl.arange(0, RING_N)
    mask_w = offs_w < count
    entries = tl.where(mask_w, ring_row * ENTRIES + (first + offs_w) % WINDOW, 0)
    return attend_key_block(q, q_sum, m_i, l_i, acc, Ring_k, Ring_v, Ring_k, Ring_v, entries, stride_rkt, stride_rvt,
                            0, 0, offs_d, mask_d, offs_dv, mask_dv, mask_w, mask_w[None, :], sm_scale, 1.0, 0.0,
                            FMT_PLAIN)


@lazy_jit_helper
def attend_sink_block(
    q, q_sum, m_i, l_i, acc, Ring_k, Ring_v, ring_row, count, stride_rkt, stride_rvt, offs_d, mask_d, offs_dv,
    mask_dv, sm_scale, WINDOW: tl.constexpr, ENTRIES: tl.constexpr, SINK_N: tl.constexpr,
):
    """A request's attention sinks (mem_cache/recent_window.py) as one key block: its first `count` cached positions
    0 .. count - 1, position p at entry ring_row * ENTRIES + WINDOW + p (after the row's WINDOW recent entries); read
    as attend_ring_block reads the ring (bf16, stored basis). Returns the updated (acc, m_i, l_i)."""
    offs_s = tl.arange(0, SINK_N)
    mask_s = offs_s < count
    entries = tl.where(mask_s, ring_row * ENTRIES + WINDOW + offs_s, 0)
    return attend_key_block(q, q_sum, m_i, l_i, acc, Ring_k, Ring_v, Ring_k, Ring_v, entries, stride_rkt, stride_rvt,
                            0, 0, offs_d, mask_d, offs_dv, mask_dv, mask_s, mask_s[None, :], sm_scale, 1.0, 0.0,
                            FMT_PLAIN)
