"""The recent window of a quantized KV pool: each request slot's last W tokens kept in the model's dtype.

A format with a window (mem_plan/kv_quant.RECENT_WINDOW_TOKENS, int4) stores every token's codes as usual and also
keeps, per req_to_token row, a ring of the K/V of the row's W newest tokens (position p at ring entry p % W) with the
pool slot each entry holds (`loc`). Attention then reads a request's cached tokens [P - w, P) from the ring and only
[0, P - w) through the codes (P = its cached length, w <= W the ring entries still its own), and the new tokens of the
forward as computed: the query weighs its nearest tokens most, and those are where 4-bit keys cost the most
(docs/kv_quantization.md). The ring's bytes are the plan's kv_window term (kv_quant.window_bytes_per_slot).

Buffers (allocated once, as planned): k [layers, rows, W, KV, D], v [layers, rows, W, KV, Dv] in the model dtype,
loc [rows, W] int64 (-1 = empty). An entry counts only while loc equals the row's req_to_token at that position: a
slot handed to another request is emptied (`forget`, from ReqToTokenPool.alloc), and tokens a request took from the
prefix cache are not in its ring, so they are read through the codes.

Per forward, `tail(...)` lays out the "tail" of every request -- the rows attention reads as uncompressed K/V:
request b owns tail rows [q_start_b + b W, q_start_b + (b + 1) W + ext_b): W ring rows (positions P_b - W .. P_b - 1,
of which the last w_b are valid) then its ext_b new tokens. Its fixed shape (N + B W rows) and index tensors built
on the device keep it free of host syncs. Each layer builds its tail rows (`tail_kv`) before attention and writes the
new tokens into the ring (`write`) after it, so the entries a decode step overwrites were read first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class WindowTail:
    """One forward's tail layout (see the module docstring); every tensor int64 on the pool's device."""

    ring_src: torch.Tensor  # [B * W] ring entries (row * W + position % W) of positions P_b - W + i
    ring_dst: torch.Tensor  # [B * W] their tail rows
    new_dst: torch.Tensor  # [N] the tail rows of the new tokens
    fresh_start: torch.Tensor  # [B] request b's first valid tail row
    fresh_from: torch.Tensor  # [B] the sequence position of that row: P_b - w_b
    write_src: torch.Tensor  # new-token rows whose K/V go into the ring (the last W of each request)
    write_dst: torch.Tensor  # their ring entries
    rows: int  # N + B * W


class RecentWindow:
    def __init__(self, rows: int, window: int, layer_num: int, head_num: int, head_dim: int, v_head_dim: int,
                 dtype: torch.dtype, device):
        self.window = window
        self.k = torch.zeros((layer_num, rows, window, head_num, head_dim), dtype=dtype, device=device)
        self.v = torch.zeros((layer_num, rows, window, head_num, v_head_dim), dtype=dtype, device=device)
        self.loc = torch.full((rows, window), -1, dtype=torch.int64, device=device)

    def mem_usage_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.loc))

    def forget(self, row: int) -> None:
        """The row was handed to another request: none of its entries are that request's tokens."""
        self.loc[row].fill_(-1)

    def tail(self, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor, extend_lens: torch.Tensor,
             out_cache_loc: torch.Tensor, req_to_token: torch.Tensor, max_extend: int) -> WindowTail:
        """The tail layout of a forward whose request b has prefix_lens[b] cached tokens and extend_lens[b] new ones
        (written at out_cache_loc, request after request; max_extend their maximum, known on the host); claims the
        ring entries the new tokens will take."""
        w = self.window
        dev = self.loc.device
        rows, pre, ext = (t.to(device=dev, dtype=torch.int64) for t in (req_pool_indices, prefix_lens, extend_lens))
        b = rows.shape[0]
        pos = pre[:, None] - w + torch.arange(w, device=dev)[None, :]  # [B, W]
        ring_src = rows[:, None] * w + pos.remainder(w)
        held = self.loc.view(-1)[ring_src]
        table = req_to_token[rows[:, None], pos.clamp_min(0)].to(torch.int64)
        valid = (pos >= 0) & (held == table) & (held >= 0)
        # the trailing run of valid entries (a ring holds the newest positions; anything before a gap is not read)
        count = valid.flip(1).to(torch.int64).cumprod(1).sum(1)  # [B]
        q_start = torch.cumsum(ext, 0) - ext
        base = q_start + torch.arange(b, device=dev) * w  # request b's first tail row
        ring_dst = base[:, None] + torch.arange(w, device=dev)[None, :]
        req_of_token = torch.repeat_interleave(torch.arange(b, device=dev), ext, output_size=int(out_cache_loc.shape[0]))
        token_idx = torch.arange(out_cache_loc.shape[0], device=dev)
        new_dst = token_idx + (req_of_token + 1) * w
        new_pos = pre[req_of_token] + token_idx - q_start[req_of_token]
        write_src = token_idx
        if max_extend > w:  # only a request's last W new tokens enter its ring (one writer per entry)
            write_src = token_idx[new_pos >= (pre + ext)[req_of_token] - w]
        write_dst = rows[req_of_token[write_src]] * w + new_pos[write_src].remainder(w)
        self.loc.view(-1)[write_dst] = out_cache_loc.to(torch.int64)[write_src]
        return WindowTail(ring_src.reshape(-1), ring_dst.reshape(-1), new_dst, base + w - count, pre - count,
                          write_src, write_dst, int(out_cache_loc.shape[0]) + b * w)

    def tail_kv(self, layer_id: int, k: torch.Tensor, v: torch.Tensor, t: WindowTail):
        """This layer's tail rows [t.rows, KV, D] (ring rows, then each request's new k / v), in the ring's dtype."""
        out = []
        for ring, x in ((self.k, k), (self.v, v)):
            flat = ring[layer_id].view(-1, ring.shape[-2], ring.shape[-1])
            rows = flat.new_empty((t.rows,) + flat.shape[1:])
            rows[t.ring_dst] = flat[t.ring_src]
            rows[t.new_dst] = x.to(flat.dtype)
            out.append(rows)
        return out[0], out[1]

    def write(self, layer_id: int, k: torch.Tensor, v: torch.Tensor, t: WindowTail) -> None:
        """The new tokens' K/V into their ring entries (after this layer's attention read the old ones)."""
        for ring, x in ((self.k, k), (self.v, v)):
            flat = ring[layer_id].view(-1, ring.shape[-2], ring.shape[-1])
            flat.index_copy_(0, t.write_dst, x[t.write_src].to(flat.dtype))
