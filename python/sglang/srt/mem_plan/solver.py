"""Exact token solve: the largest KV pool that fits when other buffers grow with the request-slot count.

    total(T) = T * cell_bytes + slot_cost(R(T)) + pools(T, R(T))        R(T): slots.SlotRule
    slot_cost(R) = fixed_bytes + per_slot_bytes * R + per_graph_bs_bytes * min(cuda_graph_max_bs, R)
                   + verify_row_bytes * verify_token_cap(R, verify_tokens_per_slot, verify_cap_tokens)
                   + branch_row_bytes * branch_rows(R)   (a speculative tree's side-branch table rows)
    pools(T, R)  = the windowed KV and linear-state pools (layer_pools.PoolCost; 0 when every layer is full)

Find the largest T, a multiple of page_size, with total(T) <= budget_bytes.

Why a bisection is exact: R(T) is nondecreasing in T (every piece of the rule -- floor, linear, cap, T // 2,
user, the hybrid models' balance cap -- is), slot_cost is nondecreasing in R (coefficients >= 0), pools is nondecreasing in T and R
(layer_pools.py), and T * cell_bytes is nondecreasing. So total(T)
is nondecreasing (so are verify_token_cap and branch_rows in R: spec_sizes.py) and the feasible T form a prefix {0, p, 2p, ..., T*}.
Bisection over that prefix returns T*
exactly, in every region of the rule and across region boundaries, including the floor in R(T) that a
continuous solve ignores (see linear_regime_tokens and the PR #18263 case in the tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sglang.srt.mem_plan.layer_pools import PoolCost
from sglang.srt.mem_plan.slots import SlotRule
from sglang.srt.mem_plan.spec_sizes import SpecInputs, verify_token_cap

NO_POOLS = PoolCost()


@dataclass(frozen=True)
class SlotCost:
    """Bytes that depend on the request-slot count R (workspaces, req_to_token, sampler buffers)."""

    fixed_bytes: int = 0
    per_slot_bytes: int = 0
    per_graph_bs_bytes: int = 0
    cuda_graph_max_bs: int = 0
    # speculative decoding: bytes per verify row, for verify_token_cap(R, tokens per slot, cap) rows (spec_sizes.py)
    verify_row_bytes: int = 0
    verify_tokens_per_slot: int = 1
    verify_cap_tokens: int = 0
    # a tree's side branches: bytes of one request-table row beyond the slots (the row, the backend's per-sequence
    # buffers, a window map entry), for spec.branch_rows(R, chunk) rows
    branch_row_bytes: int = 0
    spec: Optional[SpecInputs] = None
    chunk_tokens: int = 0

    def __post_init__(self):
        if min(self.fixed_bytes, self.per_slot_bytes, self.per_graph_bs_bytes, self.cuda_graph_max_bs,
               self.verify_row_bytes, self.branch_row_bytes) < 0:
            raise ValueError(f"SlotCost coefficients must be >= 0: {self}")

    def branch_rows(self, num_slots: int) -> int:
        return self.spec.branch_rows(num_slots, self.chunk_tokens) if self.spec is not None else 0

    def verify_bytes(self, num_slots: int) -> int:
        if not self.verify_row_bytes:
            return 0
        return self.verify_row_bytes * verify_token_cap(num_slots, self.verify_tokens_per_slot, self.verify_cap_tokens)

    def bytes_for(self, num_slots: int) -> int:
        graph_bs = min(self.cuda_graph_max_bs, num_slots)
        return (self.fixed_bytes + self.per_slot_bytes * num_slots + self.per_graph_bs_bytes * graph_bs
                + self.verify_bytes(num_slots) + self.branch_row_bytes * self.branch_rows(num_slots))


def total_bytes(num_tokens: int, cell_bytes: int, rule: SlotRule, cost: SlotCost, pools: PoolCost = NO_POOLS) -> int:
    num_slots = rule.slots(num_tokens)
    return num_tokens * cell_bytes + cost.bytes_for(num_slots) + pools.bytes_for(num_tokens, num_slots)


def solve_max_tokens(
    budget_bytes: int,
    cell_bytes: int,
    rule: SlotRule,
    cost: SlotCost = SlotCost(),
    page_size: int = 1,
    max_tokens: Optional[int] = None,
    pools: PoolCost = NO_POOLS,
) -> int:
    """Largest T (a multiple of page_size, <= max_tokens if given) with total(T) <= budget_bytes; 0 if none."""
    if page_size <= 0 or cell_bytes < 0:
        raise ValueError("page_size must be positive and cell_bytes >= 0")
    if cell_bytes > 0:
        hi_pages = max(budget_bytes, 0) // (cell_bytes * page_size)
    elif max_tokens is not None:
        hi_pages = max_tokens // page_size
    else:
        raise ValueError("cell_bytes == 0 needs max_tokens to bound the pool")
    if max_tokens is not None:
        hi_pages = min(hi_pages, max_tokens // page_size)

    def fits(num_pages: int) -> bool:
        return total_bytes(num_pages * page_size, cell_bytes, rule, cost, pools) <= budget_bytes

    if not fits(0):
        return 0
    lo = 0  # invariant: fits(lo); every page count above hi is infeasible or out of range
    hi = hi_pages
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo * page_size


def linear_regime_tokens(budget_bytes: int, cell_bytes: int, per_slot_bytes: int, context_len: int,
                         slots_per_context: int = 512) -> int:
    """Continuous solve of PR #18263's linear regime, R = T * 512 / ctx treated as a real number:
    T = budget / (cell + per_slot * 512 / ctx). Kept for comparison; it undershoots the exact optimum because
    the real rule floors R."""
    return int(budget_bytes * context_len // (cell_bytes * context_len + per_slot_bytes * slots_per_context))
