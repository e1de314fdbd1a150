"""The kv_window term: how many recent-window rows a quantized KV pool keeps, and what they cost.

A format with a recent window (kv_quant.recent_window) keeps, per window row, a bf16 ring of a request's W newest and
S first tokens (kv_quant.window_bytes_per_slot bytes a row). Only running requests need one, and a row is handed to
a request when it starts running and taken back when it finishes or is retracted (mem_cache/recent_window.py), so
the rows are not one per request slot: they are

    R_w = min(slots, max(1, floor(KV_WINDOW_BUDGET_SHARE x budget / row_bytes) - 1))

(the - 1: the scratch row 0, below), a count fixed by the budget, so the term does not grow with the slot count the
way per-slot rows did (2,401 rows, 15.2 GiB of an H100's 78.6 GiB for Llama-3.1-8B in fp8, where 1% holds ~120 rows,
about half the default CUDA-graph batch). A running request that finds no free row reads its whole history through
the codes, as it reads the tokens it took from the prefix cache, and is counted (/server_info kv_cache).

Bytes: (R_w + 1) rows (row 0 is the scratch row the requests without a row write into and never read: the fixed
shapes CUDA-graph decode needs) x row_bytes, plus the int64 map from request slot to window row, one entry per
req_to_token row (slots + 1). The map's 8 B a slot grows with the slots; the rows do not, which keeps the planner's
total nondecreasing in the pool size (the bisection in solver.py stays exact).
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.mem_plan.solver import SlotCost

# the share of the budget the window rows may take: 1% (issue 45's bound). At 1% a 1.5 GiB CPU budget keeps 33 int4
# rows (460,960 B each on the default model) or 12 fp8_e4m3 rows, an H100 with Llama-3.1-8B in fp8 ~120
KV_WINDOW_BUDGET_SHARE = 0.01
KV_WINDOW_SCRATCH_ROWS = 1  # row 0: where requests without a row write, never read
KV_WINDOW_MAP_ENTRY_BYTES = 8  # int64: req_to_token row -> window row (0 = none)


def planned_window_rows(budget_bytes: int, row_bytes: int, share: float = KV_WINDOW_BUDGET_SHARE) -> int:
    """The window rows the budget pays for before the slot bound: the largest count whose rows and the scratch row fit
    within share x budget, at least 1 (0 without a window)."""
    if row_bytes <= 0:
        return 0
    return max(1, int(share * budget_bytes) // row_bytes - KV_WINDOW_SCRATCH_ROWS)


def window_rows_for(cap_rows: int, num_slots: int) -> int:
    """R_w at a slot count: no more rows than requests can run."""
    return min(cap_rows, num_slots)


def window_term_bytes(cap_rows: int, row_bytes: int, num_slots: int) -> int:
    """The kv_window term: (R_w + scratch) rows and the slot -> row map of (slots + 1) entries; 0 without a window."""
    if not row_bytes:
        return 0
    rows = window_rows_for(cap_rows, num_slots) + KV_WINDOW_SCRATCH_ROWS
    return rows * row_bytes + (num_slots + 1) * KV_WINDOW_MAP_ENTRY_BYTES


@dataclass(frozen=True)
class WindowedSlotCost(SlotCost):
    """SlotCost plus the kv_window term, which is capped in the slot count (min(cap_rows, R) rows) like the graph
    batch size: nondecreasing in R, so the token solve stays exact."""

    window_row_bytes: int = 0
    window_cap_rows: int = 0

    def bytes_for(self, num_slots: int) -> int:
        return super().bytes_for(num_slots) + window_term_bytes(self.window_cap_rows, self.window_row_bytes, num_slots)
