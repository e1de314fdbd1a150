"""torch_native's path for the layers plain causal SDPA cannot serve: a sliding window, attention sinks, a logit cap
(layers/radix_attention.py). Every other layer keeps torch_native_backend's paths.

Per request, the keys read are positions [window_start, seq_len) (window_metadata.py): the cached ones
[window_start, prefix_len) gathered from the pool through their token-pool slots (pool.gather_kv maps a windowed
layer's slots itself, and a quantized pool dequantizes only these rows), this forward's new ones as computed (k, v).
Nothing below window_start is read, so freed windowed pages (the dummy page, or stale req_to_token entries on a
windowed-only model) never reach the softmax.

The scores are fp32: s = q.k * scaling, then cap * tanh(s / cap) with a logit cap, then query at position p sees
key j iff j <= p and (no window or j > p - W); a sink logit per query head joins the softmax's denominator only.
Queries are taken in chunks so one chunk's scores stay within SCORE_ELEMS fp32 values, and a chunk of a windowed
layer reads only the keys its window reaches (at most W + chunk - 1), so a long prefill's scratch stays bounded.

Where sgl-kernel's CPU kernels take the window (cpu_kernel_ops.WINDOW_KERNELS, sliding_window / sinks / logit_cap /
loc_map), a plain bf16/fp32 pool on a CPU goes through them instead: decode_attention writes the new K/V and reads
req_to_token in place, extend_attention after the pool write; loc_map is the pool's token -> windowed slot map.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from sglang.srt.layers.attention import cpu_kernel_ops
from sglang.srt.layers.attention.window_metadata import WindowTables

SCORE_ELEMS = 1 << 22  # fp32 scores of one query chunk (16 MiB)


def layer_window(layer) -> int:
    w = getattr(layer, "sliding_window_size", -1)
    return w if w is not None and w > 0 else 0


def needs_window_path(layer) -> bool:
    """A layer plain causal attention would get wrong: a window, sinks or a logit cap."""
    return layer_window(layer) > 0 or getattr(layer, "sinks", None) is not None or getattr(layer, "logit_cap", 0.0) > 0


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, window: int,
           scale: float, sinks: Optional[torch.Tensor], logit_cap: float) -> torch.Tensor:
    """q [n, H, D] at positions q_pos [n]; k [L, KV, D], v [L, KV, Dv] at k_pos [L] -> [n, H, Dv] fp32. Every query
    row must see at least one key (its own position is among k_pos)."""
    n, num_heads, head_dim = q.shape
    num_kv = k.shape[1]
    group = num_heads // num_kv
    s = torch.einsum("nkgd,lkd->kgnl", q.float().view(n, num_kv, group, head_dim), k.float()) * scale
    if logit_cap > 0:
        s = torch.tanh(s / logit_cap) * logit_cap
    allowed = k_pos[None, :] <= q_pos[:, None]
    if window > 0:
        allowed &= k_pos[None, :] > q_pos[:, None] - window
    s = s.masked_fill(~allowed, float("-inf"))
    if sinks is not None:  # one more logit per head in the denominator, attending no value
        s = torch.cat([s, sinks.float().view(num_kv, group, 1, 1).expand(num_kv, group, n, 1)], -1)
    p = torch.softmax(s, -1)
    if sinks is not None:
        p = p[..., :-1]
    return torch.einsum("kgnl,lkd->nkgd", p, v.float()).reshape(n, num_heads, v.shape[2])


class WindowedTorchAttention:
    """Owned by a TorchNativeAttnBackend; reset() once per forward, forward() per windowed / sink / capped layer."""

    def __init__(self, backend):
        self.backend = backend
        self.pool = backend.token_to_kv_pool
        self.tables = WindowTables(self.pool, backend.req_to_token_pool.req_to_token)
        # the fused CPU kernels, where they take the window: a plain pool of the model's dtype only
        ops = backend.cpu_decode_ops
        self.kernel_ops = ops if ops is not None and getattr(cpu_kernel_ops, "WINDOW_KERNELS", False) else None

    def reset(self, forward_batch) -> None:
        self.tables.reset(forward_batch)

    def forward(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        """q [N, H, D], k/v [N, KV, D] (this forward's new tokens) -> [N, H * Dv]."""
        decode = forward_batch.forward_mode.is_decode()
        if self.kernel_ops is not None and save_kv_cache and (decode or self.backend.cpu_extend_ops is not None):
            return self._kernel_forward(q, k, v, layer, forward_batch)
        pool, lid = self.pool, layer.layer_id
        if save_kv_cache:
            if pool.is_windowed_layer(lid):
                pool.set_kv_buffer(lid, forward_batch.out_cache_loc, k, v)
            else:  # the backend's own write (a quantized pool's kernel write included)
                self.backend._write_kv(layer, forward_batch.out_cache_loc, k, v)
        window = layer_window(layer)
        table = self.tables.get(window)
        sinks = getattr(layer, "sinks", None)
        cap = getattr(layer, "logit_cap", 0.0) or 0.0
        out = q.new_empty(q.shape[0], q.shape[1], layer.v_head_dim)
        row = 0
        for b, (start, first, seq_len) in enumerate(zip(table.starts, table.q_first, table.seq_lens)):
            n_new = seq_len - first
            cached = table.request_slots(b, table.token_slots)[: first - start]
            k_b, v_b = k[row : row + n_new], v[row : row + n_new]
            if cached.numel():
                k_old, v_old = pool.gather_kv(lid, cached, q.dtype)
                k_b, v_b = torch.cat([k_old.to(k.dtype), k_b]), torch.cat([v_old.to(v.dtype), v_b])
            self._attend_request(q[row : row + n_new], k_b, v_b, start, first, window, layer, sinks, cap,
                                 out[row : row + n_new])
            row += n_new
        return out.view(q.shape[0], -1)

    @staticmethod
    def _attend_request(q, k, v, start: int, first: int, window: int, layer, sinks, cap: float, out) -> None:
        """One request: q [n, H, D] at positions first.., k/v at positions start.. (through first + n - 1)."""
        n, num_heads = q.shape[0], q.shape[1]
        device = q.device
        if window:  # a chunk of c queries reads at most W + c - 1 keys: the largest c with H * c * (W + c) in budget
            budget = SCORE_ELEMS / num_heads
            chunk = max(1, int((math.sqrt(window * window + 4 * budget) - window) / 2))
        else:
            chunk = max(1, SCORE_ELEMS // (num_heads * (first + n - start)))
        for c0 in range(0, n, chunk):
            c1 = min(n, c0 + chunk)
            p0, p1 = first + c0, first + c1  # query positions [p0, p1)
            lo = max(start, p0 - window + 1) if window else start
            q_pos = torch.arange(p0, p1, device=device)
            k_pos = torch.arange(lo, p1, device=device)
            o = attend(q[c0:c1], k[lo - start : p1 - start], v[lo - start : p1 - start], q_pos, k_pos, window,
                       layer.scaling, sinks, cap)
            out[c0:c1] = o.to(out.dtype)

    def _kernel_forward(self, q, k, v, layer, forward_batch) -> torch.Tensor:
        """sgl-kernel's CPU decode / extend with the window, sinks and cap (cpu_kernel_ops.WINDOW_KERNELS)."""
        pool, lid, ops, fb = self.pool, layer.layer_id, self.kernel_ops, forward_batch
        sinks = getattr(layer, "sinks", None)
        kw = dict(sliding_window=layer_window(layer) or -1, sinks=None if sinks is None else sinks.float(),
                  logit_cap=getattr(layer, "logit_cap", 0.0) or 0.0, loc_map=self._loc_map(lid))
        k_buf, v_buf, r2t = pool.get_key_buffer(lid), pool.get_value_buffer(lid), self.backend.req_to_token_pool.req_to_token
        if fb.forward_mode.is_decode():
            return ops.decode_attention(q, k, v, k_buf, v_buf, r2t, fb.req_pool_indices, fb.seq_lens,
                                        fb.out_cache_loc, layer.scaling, **kw)
        pool.set_kv_buffer(lid, fb.out_cache_loc, k, v)
        _, first, seq = self.tables.batch
        rows = fb.req_pool_indices.to(torch.int64)
        pre = torch.tensor(first, dtype=torch.int64)
        ext = torch.tensor(seq, dtype=torch.int64) - pre
        return ops.extend_attention(q, k_buf, v_buf, r2t, rows, pre, ext, layer.scaling, **kw)

    def _loc_map(self, layer_id: int) -> Optional[torch.Tensor]:
        """The pool's int32 token-pool slot -> windowed slot map for a windowed layer of a pool that has one; None
        (identity) for a layer in the full pool or a windowed-only model (its windowed pool is the token pool)."""
        if not self.pool.is_windowed_layer(layer_id):
            return None
        return getattr(self.pool, "slot_map", None)
