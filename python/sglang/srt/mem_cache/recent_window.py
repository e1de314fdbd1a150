"""The recent window of a quantized KV pool: each request slot's last W tokens (and first S) kept in the model's dtype.

A format with a window (mem_plan/kv_quant.RECENT_WINDOW_TOKENS: int4, int2_hadamard; fp8 where the backend reads rings)
stores every token's codes as usual and also keeps, per req_to_token row, a ring of the K/V of the row's W newest tokens
(position p at entry p % W) and of its S = kv_quant.SINK_TOKENS first ones (the attention sinks: position p < S also at
entry W + p), with the pool slot each entry holds (`loc`). Attention then reads a request's first cached tokens
[0, s) from the sink entries, its newest [P - w, P) from the ring, only [s, P - w) through the codes (P = its cached
length, s <= S and w <= W the entries still its own, P - w >= s), and the new tokens of the forward as computed: the
query weighs its nearest tokens and its first ones most, and those are where low-bit codes cost the most
(docs/kv_quantization.md). The ring's bytes are the plan's kv_window term (kv_quant.window_bytes_per_slot).

Buffers (allocated once, as planned): k [layers, rows, W + S, KV, D], v [layers, rows, W + S, KV, Dv] in bf16, in the
basis the pool stores its codes in (QuantizedKVPool.stored_basis: turned once, on write, so the kernels read them as
they read the codes), loc [rows, W + S] int64 (-1 = empty). An entry counts only while loc equals the row's
req_to_token at that position: a slot handed to another request is emptied (`forget`, from ReqToTokenPool.alloc), and
tokens a request took from the prefix cache are not in its ring, so they are read through the codes.

Per forward, `tail(...)` counts each request's valid entries (s_b: the leading run of positions 0 .. S - 1 whose sink
entry still holds the row's slot; w_b: the trailing run of positions max(P_b - W, s_b) .. P_b - 1 whose ring entry
does) and claims the entries its new tokens will take; with max_extend == 1 (a decode step) it builds only device
tensors of fixed shapes (no host sync: a CUDA graph captures it). Attention reads the ring in place (the CPU kernel's
ring_k / ring_v by `rings`, ring_rows, ring_counts, sink_counts; the Triton kernels' kv_formats.RingOperands); each
layer writes its new tokens into the ring (`write`) after its attention, so the entries a decode step overwrites were
read first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch

from sglang.srt.mem_cache.window_rows import WindowRows


@dataclass
class WindowTail:
    """One forward's ring bookkeeping (see the module docstring); every tensor int64 on the pool's device."""

    ring_rows: torch.Tensor  # [B] each request's req_to_token row (its ring: entries row x (W + S) ...)
    counts: torch.Tensor  # [B] w_b: its cached positions [P_b - w_b, P_b) are read from the ring
    ring_src: torch.Tensor  # [B, W] the ring entries of positions P_b - W + i
    write_src: torch.Tensor  # new-token rows whose K/V go into the ring (the last W of each request)
    write_dst: torch.Tensor  # their ring entries
    write_entry: torch.Tensor  # [N] each new token's ring entry, -1 where it does not enter the ring
    sink_counts: torch.Tensor  # [B] s_b: its cached positions [0, s_b) are read from its sink entries
    sink_src: torch.Tensor  # new-token rows that may be sinks (decode: every row; extend: those at positions < S)
    sink_dst: torch.Tensor  # their sink entries (decode: clamped into the row's, written only where sink_keep)
    sink_keep: torch.Tensor  # bool, per sink_src: whether the row is a sink (position < S)
    sink_entry: torch.Tensor  # [N] each new token's sink entry, -1 where it is none

    def host_lists(self) -> tuple:
        """(counts, sink_counts, ring_rows, ring_src) as host lists, with one device read (a path that walks the
        requests on the host reads them once a forward, not once a layer)."""
        b = self.counts.shape[0]
        host = torch.cat([self.counts[:, None], self.sink_counts[:, None], self.ring_rows[:, None],
                          self.ring_src.view(b, -1)], 1).tolist()
        return [h[0] for h in host], [h[1] for h in host], [h[2] for h in host], [h[3:] for h in host]


class RecentWindow:
    """rows ring rows; with req_rows, rows[0] is the scratch row and rows 1..rows - 1 are handed to running requests
    (assign / release, from ReqToTokenPool: mem_plan/kv_window.py plans them), row_of mapping each of the req_rows
    request slots to its ring row (0: none). Without req_rows every request slot r < rows has ring row r (a ring per
    slot, as test harnesses build it; row 0 is then the dummy request row's and unread)."""

    def __init__(self, rows: int, window: int, layer_num: int, head_num: int, head_dim: int, v_head_dim: int,
                 device, sinks: int = 0, req_rows: Optional[int] = None):
        self.window, self.sinks = window, sinks
        self.entries = window + sinks  # a row's ring: W recent entries, then S sink entries
        self.k = torch.zeros((layer_num, rows, self.entries, head_num, head_dim), dtype=torch.bfloat16, device=device)
        self.v = torch.zeros((layer_num, rows, self.entries, head_num, v_head_dim), dtype=torch.bfloat16, device=device)
        self.loc = torch.full((rows, self.entries), -1, dtype=torch.int64, device=device)
        self.assigned = req_rows is not None
        self.row_of = (torch.zeros(req_rows, dtype=torch.int64, device=device) if self.assigned
                       else torch.arange(rows, dtype=torch.int64, device=device))
        self.rows = WindowRows(rows - 1) if self.assigned else None

    def mem_usage_bytes(self) -> int:
        """The rings, their loc and the slot -> row map (the plan's kv_window term, mem_plan/kv_window.py)."""
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.loc, self.row_of))

    def forget(self, row: int) -> None:
        """The ring row was handed to another request: none of its entries are that request's tokens."""
        self.loc[row].fill_(-1)

    def assign(self, req_row: int) -> int:
        """A request starts running in req_row: a free ring row, emptied (0 = none free: it reads through the codes)."""
        row = self.rows.take(req_row)
        self.row_of[req_row] = row
        if row:
            self.forget(row)
        return row

    def release(self, req_row: int) -> None:
        """The request of req_row finished or was retracted: its ring row (if any) is free again."""
        self.rows.give_back(req_row)
        self.row_of[req_row] = 0

    def apply(self, req_rows: List[int], rows: List[int], fresh: List[int]) -> None:
        """A TP follower: the ring rows rank 0 assigned (batch_sync.py), the fresh ones emptied first."""
        for row in fresh:
            self.forget(row)
        if req_rows:
            dev = self.row_of.device
            self.row_of[torch.tensor(req_rows, device=dev)] = torch.tensor(rows, dtype=torch.int64, device=dev)

    def ring(self, layer_id: int):
        """This layer's rings as [rows x (W + S), KV, D] bf16 views (entry row x (W + S) + position % W; a sink
        position p < S also at row x (W + S) + W + p)."""
        k, v = self.k[layer_id], self.v[layer_id]
        return k.view(-1, *k.shape[-2:]), v.view(-1, *v.shape[-2:])

    def rings(self, layer_id: int):
        """This layer's rings as [rows, W + S, KV, D] bf16 (the CPU kernel's ring_k / ring_v: the shape gives it the
        ring rows and the entries a row, so rows need not match req_to_token's)."""
        return self.k[layer_id], self.v[layer_id]

    def sink_entries(self, rows, positions):
        """The ring entries of sink positions (< S) of ring rows (ints or tensors that broadcast): row x (W + S) + W +
        position."""
        return rows * self.entries + self.window + positions

    def tail(self, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor, extend_lens: torch.Tensor,
             out_cache_loc: torch.Tensor, req_to_token: torch.Tensor, max_extend: int) -> WindowTail:
        """The ring bookkeeping of a forward whose request b has prefix_lens[b] cached tokens and extend_lens[b] new
        ones (written at out_cache_loc, request after request; max_extend their maximum, known on the host); claims
        the ring entries the new tokens will take."""
        w, e, dev = self.window, self.entries, self.loc.device
        req_rows, pre, ext = (t.to(device=dev, dtype=torch.int64) for t in (req_pool_indices, prefix_lens, extend_lens))
        b = req_rows.shape[0]
        rows = self.row_of[req_rows]  # each request's ring row; 0 (the scratch row, or the dummy's): nothing read
        has = (rows > 0)[:, None]
        held_at = lambda entries: self.loc.view(-1)[entries]  # noqa: E731
        # the sinks: the leading run of positions 0 .. S - 1 whose entry still holds the row's slot
        sink_pos = torch.arange(self.sinks, device=dev)[None, :]
        if self.sinks:
            sink_ent = self.sink_entries(rows[:, None], sink_pos)
            table = req_to_token[req_rows[:, None], sink_pos.expand(b, -1)].to(torch.int64)
            held = held_at(sink_ent)
            sink_valid = (sink_pos < pre[:, None]) & (held == table) & (held >= 0) & has
            sink_counts = sink_valid.to(torch.int64).cumprod(1).sum(1)
        else:
            sink_counts = torch.zeros_like(pre)
        pos = pre[:, None] - w + torch.arange(w, device=dev)[None, :]  # [B, W]
        ring_src = rows[:, None] * e + pos.remainder(w)
        held = held_at(ring_src)
        table = req_to_token[req_rows[:, None], pos.clamp_min(0)].to(torch.int64)
        valid = (pos >= sink_counts[:, None]) & (held == table) & (held >= 0) & has
        # the trailing run of valid entries (a ring holds the newest positions; anything before a gap is not read)
        counts = valid.flip(1).to(torch.int64).cumprod(1).sum(1)  # [B]
        q_start = torch.cumsum(ext, 0) - ext
        n = int(out_cache_loc.shape[0])
        req_of_token = torch.repeat_interleave(torch.arange(b, device=dev), ext, output_size=n)
        token_idx = torch.arange(n, device=dev)
        new_pos = pre[req_of_token] + token_idx - q_start[req_of_token]
        new_loc = out_cache_loc.to(torch.int64)
        write_src = token_idx
        if max_extend > w:  # only a request's last W new tokens enter its ring (one writer per entry)
            write_src = token_idx[new_pos >= (pre + ext)[req_of_token] - w]
        write_dst = rows[req_of_token[write_src]] * e + new_pos[write_src].remainder(w)
        self.loc.view(-1)[write_dst] = new_loc[write_src]
        write_entry = torch.full((n,), -1, dtype=torch.int64, device=dev).index_copy_(0, write_src, write_dst)
        # the new sinks: positions < S (a decode step: every row, its entry clamped into the row's and kept only
        # where it is a sink -- fixed shapes, one token per row, so no two rows share an entry)
        sink_src = token_idx if max_extend == 1 else token_idx[new_pos < self.sinks]
        sink_keep = new_pos[sink_src] < self.sinks
        sink_dst = self.sink_entries(rows[req_of_token[sink_src]], new_pos[sink_src].clamp(0, max(self.sinks - 1, 0)))
        sink_entry = torch.full((n,), -1, dtype=torch.int64, device=dev)
        if self.sinks:
            self.loc.view(-1)[sink_dst] = torch.where(sink_keep, new_loc[sink_src], held_at(sink_dst))
            sink_entry.index_copy_(0, sink_src, torch.where(sink_keep, sink_dst, -1))
        return WindowTail(rows, counts, ring_src, write_src, write_dst, write_entry, sink_counts, sink_src, sink_dst,
                          sink_keep, sink_entry)

    def write(self, layer_id: int, k_stored: torch.Tensor, v_stored: torch.Tensor, t: WindowTail) -> None:
        """The new tokens' K/V (in the stored basis) into their ring entries, after this layer's attention."""
        for ring, x in zip(self.ring(layer_id), (k_stored, v_stored)):
            ring.index_copy_(0, t.write_dst, x[t.write_src].to(ring.dtype))
            if self.sinks:
                keep = t.sink_keep.view(-1, *([1] * (x.dim() - 1)))
                ring.index_copy_(0, t.sink_dst, torch.where(keep, x[t.sink_src].to(ring.dtype), ring[t.sink_dst]))
