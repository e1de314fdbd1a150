"""The budget equation, written once.

Upstream (SGLang, classic and current):
    rest = post - pre * (1 - y)          pre/post: free device memory before/after loading weights (MIN over ranks)
    => KV = y * pre - weights            y = --mem-fraction-static; (1 - y) * pre is an unplanned "slack" that must
                                          absorb activations, graphs, attention workspaces, req_to_token, ...

Ours. budget = min(pre, cap) where cap = --max-total-memory-gb (an absolute per-instance cap), and every consumer
is a term:
    weights + KV(T) + slot_terms(R(T)) + fixed_runtime_terms + safety_margin <= budget

  auto y (default):  KV gets everything left; T is solved exactly (solver.py); the effective
                     y = (weights + KV) / budget is reported.
  explicit y:        static region  = floor(y * budget) must hold weights + at least the minimum KV pool
                                      (else: raise y);
                     runtime region = budget - static must hold every other term incl. the margin
                                      (else: lower y). y is never changed silently.
"""

from __future__ import annotations

import math
from typing import Optional

from sglang.srt.mem_plan.units import GiB, MiB

# Safety margin, when the caller states none: 2% of the budget, at least 64 MiB, at most 1 GiB. It covers what
# no term declares: allocator fragmentation and rounding, cuBLAS/NCCL lazy workspaces, CUDA context growth.
SAFETY_MARGIN_FRACTION = 0.02
SAFETY_MARGIN_MIN_BYTES = 64 * MiB
SAFETY_MARGIN_MAX_BYTES = 1 * GiB

# mem_fraction_static values we suggest are on a 0.001 grid (upstream's rounding).
FRACTION_GRID = 1000


def budget_bytes(pre_load_free_bytes: int, cap_bytes: Optional[int] = None) -> int:
    """The bytes this instance may use: the pre-load free memory (MIN over ranks), limited by an absolute cap."""
    return pre_load_free_bytes if cap_bytes is None else min(pre_load_free_bytes, cap_bytes)


def default_safety_margin_bytes(budget: int) -> int:
    return int(min(max(budget * SAFETY_MARGIN_FRACTION, SAFETY_MARGIN_MIN_BYTES), SAFETY_MARGIN_MAX_BYTES))


def upstream_kv_bytes(pre_bytes: int, post_bytes: int, mem_fraction_static: float) -> int:
    """Upstream's rest = post - pre * (1 - y), in bytes (for comparison and tests)."""
    return int(post_bytes - pre_bytes * (1 - mem_fraction_static))


def static_region_bytes(budget: int, mem_fraction_static: float) -> int:
    """Weights + KV region for an explicit y."""
    return math.floor(budget * mem_fraction_static)


def effective_mem_fraction(weight_bytes: int, kv_bytes: int, budget: int) -> float:
    return (weight_bytes + kv_bytes) / budget if budget > 0 else 0.0


def fraction_grid() -> range:
    """Candidate k for y = k / FRACTION_GRID, 0 < y < 1."""
    return range(1, FRACTION_GRID)
