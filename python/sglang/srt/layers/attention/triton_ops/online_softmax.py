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


@lazy_jit_helper
def attend_key_block(
    q, m_i, l_i, acc, K, V, key_rows, stride_k, stride_v, offs_d, mask_d, offs_dv, mask_dv, mask_n, score_mask,
    sm_scale,
):
    """q [ROWS, BLOCK_D] (rows past the real ones are zeros); K, V: the key/value base pointers of one KV head;
    key_rows [BLOCK_N] the token rows of this key block (in the pool or in this forward's k/v), mask_n [BLOCK_N]
    which of them exist; score_mask [ROWS, BLOCK_N] (or broadcastable) which (query, key) pairs may attend.
    Returns the updated (acc, m_i, l_i). Every row must see at least one allowed key before the output is read.
    """
    k = tl.load(K + key_rows[None, :] * stride_k + offs_d[:, None],
                mask=mask_n[None, :] & mask_d[:, None], other=0.0).to(q.dtype)  # [BLOCK_D, BLOCK_N]
    qk = tl.dot(q, k, input_precision="ieee") * sm_scale  # [ROWS, BLOCK_N] fp32
    qk = tl.where(score_mask, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp(m_i - m_new)  # rescales what was accumulated under the old maximum
    p = tl.exp(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(V + key_rows[:, None] * stride_v + offs_dv[None, :],
                mask=mask_n[:, None] & mask_dv[None, :], other=0.0).to(q.dtype)  # [BLOCK_N, BLOCK_DV]
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    return acc, m_new, l_i
