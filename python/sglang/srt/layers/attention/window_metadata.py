"""The per-forward tables windowed layers read (layers/radix_attention.py: sliding_window_size), shared by every
windowed layer of the forward and by every backend that reads key lists (torch_native's torch path, FlashInfer).

A layer with window W lets the query at position p see keys p - W + 1 .. p. A request whose first new token of this
forward sits at position p0 therefore needs, in every layer with that window, only key positions
[max(0, p0 - W + 1), seq_len): the runtime guarantees those still hold windowed K/V (positions below may be freed:
their windowed slot is the dummy page, or on a windowed-only model their req_to_token entries are stale), so no
backend may read below that start.

WindowTable (one per distinct W in a forward, built on first use by WindowTables.get):
  starts[b]        the first key position request b reads
  q_first[b]       the position of request b's first new token (its prefix length)
  seq_lens[b]      its length after this forward
  kv_indptr        int64 [B + 1]: request b's keys are entries kv_indptr[b] .. kv_indptr[b + 1] of the slot lists
  token_slots      int64 [total]: token-pool slots of positions starts[b] .. seq_lens[b] - 1 (req_to_token's)
  windowed_slots   the same positions' slots in the windowed pool (pool.windowed_slots(token_slots)), made once on
                   first use: what a windowed layer indexes its get_key_buffer with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch


def window_start(first_new_pos: int, window: int) -> int:
    """The first key position a request whose first new token is at first_new_pos reads in a layer of window W
    (window <= 0: no window, position 0)."""
    return max(0, first_new_pos - window + 1) if window > 0 else 0


@dataclass
class WindowTable:
    window: int
    starts: List[int]
    q_first: List[int]
    seq_lens: List[int]
    kv_indptr: torch.Tensor
    token_slots: torch.Tensor
    pool: object = None
    _windowed: Optional[torch.Tensor] = field(default=None, repr=False)

    @property
    def windowed_slots(self) -> torch.Tensor:
        if self._windowed is None:
            self._windowed = self.pool.windowed_slots(self.token_slots)
        return self._windowed

    def slots_for(self, layer_id: int) -> torch.Tensor:
        """The slot list a layer's own buffers (get_key_buffer) are indexed with: windowed-pool slots for a layer that
        lives there, token-pool slots for one in the full pool (a window as long as the context, priced full)."""
        return self.windowed_slots if self.pool.is_windowed_layer(layer_id) else self.token_slots

    def request_slots(self, b: int, slots: torch.Tensor) -> torch.Tensor:
        return slots[int(self.kv_indptr[b]) : int(self.kv_indptr[b + 1])]


def build_window_table(window: int, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                       q_first: List[int], seq_lens: List[int], pool) -> WindowTable:
    """One gather of req_to_token for every request's key range [window_start, seq_len)."""
    starts = [window_start(p, window) for p in q_first]
    lens = torch.tensor([s - a for s, a in zip(seq_lens, starts)], dtype=torch.int64)
    indptr = torch.zeros(len(starts) + 1, dtype=torch.int64)
    torch.cumsum(lens, 0, out=indptr[1:])
    device = req_to_token.device
    rows = torch.repeat_interleave(req_pool_indices.to(device=device, dtype=torch.int64), lens.to(device))
    # position of entry i of request b: starts[b] + (i - indptr[b])
    offsets = torch.tensor(starts, dtype=torch.int64) - indptr[:-1]
    cols = torch.arange(int(indptr[-1]), dtype=torch.int64) + torch.repeat_interleave(offsets, lens)
    token_slots = req_to_token[rows, cols.to(device)].to(torch.int64)
    return WindowTable(window, starts, list(q_first), list(seq_lens), indptr.to(device), token_slots, pool)


class WindowTables:
    """The tables of one forward, one per window length, built on first use; reset() at each init_forward_metadata."""

    def __init__(self, pool, req_to_token: torch.Tensor):
        self.pool, self.req_to_token = pool, req_to_token
        self.tables: Dict[int, WindowTable] = {}
        self.batch = None  # (req_pool_indices, q_first, seq_lens) of this forward

    def reset(self, forward_batch) -> None:
        fb = forward_batch
        seq = list(fb.seq_lens_cpu) if fb.seq_lens_cpu else fb.seq_lens.tolist()
        if fb.forward_mode.is_decode():
            first = [s - 1 for s in seq]
        else:
            ext = fb.extend_seq_lens_cpu or fb.extend_seq_lens.tolist()
            first = [s - e for s, e in zip(seq, ext)]
        self.tables, self.batch = {}, (fb.req_pool_indices, first, seq)

    def get(self, window: int) -> WindowTable:
        table = self.tables.get(window)
        if table is None:
            rows, first, seq = self.batch
            table = self.tables[window] = build_window_table(window, self.req_to_token, rows, first, seq, self.pool)
        return table


def windowed_features(model_config, pool) -> str:
    """What of a model's attention goes beyond plain causal (its windowed / chunked layers, its sinks), in words, or
    "" when nothing: the startup check of a backend that does not serve them. Read from the planner's shape
    (model_config.shape.text) and the pool's windowed layers."""
    text = getattr(getattr(model_config, "shape", None), "text", None)
    kinds = set(getattr(text, "layer_kinds", ()) or ()) - {"full"}
    layers = getattr(pool, "layer_num", 0)
    if any(pool.is_windowed_layer(i) for i in range(layers)):
        kinds.add("sliding")
    found = [f"{k}-window layers" for k in sorted(kinds & {"sliding", "chunked"})]
    if getattr(text, "attention_sinks", False):
        found.append("attention sinks")
    return " and ".join(found)
