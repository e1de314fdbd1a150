"""The CPU kernel's view of a recent window whose ring rows are fewer than the request slots.

extend_attention_quant (sgl-kernel, quant_attention_op.h) takes a ring of E entries per req_to_token row: it derives
E = ring rows / table rows. The window's rows now follow the running requests (mem_plan/kv_window.py), R_w + 1 of
them, fewer than the table's, so the kernel is given a compact table of exactly R_w + 1 rows per call: row g = the
g-th request of a group of at most R_w + 1 consecutive requests of the batch (their token rows are consecutive too),
request index g, its ring row as the window assigned it. Built once per forward (the copy: requests x their longest
length int64, a transient beside the kernel's own); a kernel that took E as an argument would need none of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch


@dataclass
class RingGroup:
    tokens: slice  # the group's new-token rows (of q, the fresh K/V, ring_write, sink_write)
    reqs: slice  # the group's requests (of ring_rows, ring_counts, sink_counts)
    table: torch.Tensor  # [R_w + 1, longest] int64: row g = request g's req_to_token row
    quant_rows: tuple  # (arange(g), prefix_lens, extend_lens) of the group


def ring_groups(req_to_token: torch.Tensor, quant_rows: tuple, ring_rows: int) -> Optional[List[RingGroup]]:
    """The kernel calls of one forward; None when the ring has a row per req_to_token row (one call as is)."""
    if ring_rows == req_to_token.shape[0]:
        return None
    req_rows, prefix, extend = quant_rows
    lens = (prefix + extend).tolist()
    ext = extend.tolist()
    groups, tok = [], 0
    for start in range(0, len(lens), ring_rows):
        end = min(start + ring_rows, len(lens))
        n_tok = sum(ext[start:end])
        table = torch.zeros((ring_rows, max(lens[start:end])), dtype=req_to_token.dtype, device=req_to_token.device)
        table[: end - start] = req_to_token[req_rows[start:end], : table.shape[1]]
        groups.append(RingGroup(slice(tok, tok + n_tok), slice(start, end), table,
                                (torch.arange(end - start, dtype=torch.int64), prefix[start:end], extend[start:end])))
        tok += n_tok
    return groups


def call_grouped(kernel, q: torch.Tensor, head: tuple, req_to_token: torch.Tensor, quant_rows: tuple, tail: tuple,
                 fresh: tuple, ring: tuple, groups: Optional[List[RingGroup]]) -> torch.Tensor:
    """kernel(q, *head, table, *rows, *tail, *fresh, *ring) once, or once per group. head: (k_codes .. kv_format);
    tail: (scale, k_turn, k_smooth, v_back); fresh: (fresh_k, fresh_v); ring: (ring_k, ring_v, ring_rows,
    ring_counts, ring_write, sink_counts, sink_write, window)."""
    if groups is None:
        return kernel(q, *head, req_to_token, *quant_rows, *tail, *fresh, *ring)
    ring_k, ring_v, rows, counts, write, sinks, sink_write, window = ring
    outs = []
    for g in groups:
        t, r = g.tokens, g.reqs
        outs.append(kernel(q[t], *head, g.table, *g.quant_rows, *tail,
                           *(x[t] if x is not None else None for x in fresh),
                           ring_k, ring_v, rows[r], counts[r], write[t], sinks[r], sink_write[t], window))
    return outs[0] if len(outs) == 1 else torch.cat(outs)
