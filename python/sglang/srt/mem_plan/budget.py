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

# CPU default budget: without --mem-fraction-static and --max-total-memory-gb, a CPU instance plans from this share
# of the RAM *available* at startup (psutil's "available": free + reclaimable page cache), not from all of it. The KV
# pool is touched lazily, so a plan that takes ~all available RAM lets the server grow under load until the OS or a
# neighbour runs out (issue 9: 21 GiB of KV on a 24 GiB machine). Half leaves the other half to the OS page cache,
# the tokenizer/HTTP processes and other tenants (our choice; upstream SGLang has no CPU rule). Either cap flag
# (--max-total-memory-gb, --mem-fraction-static) overrides it.
CPU_DEFAULT_AVAILABLE_SHARE = 0.5

# mem_fraction_static values we suggest are on a 0.001 grid (upstream's rounding).
FRACTION_GRID = 1000


def budget_bytes(pre_load_free_bytes: int, cap_bytes: Optional[int] = None) -> int:
    """The bytes this instance may use: the pre-load free memory (MIN over ranks), limited by an absolute cap."""
    return pre_load_free_bytes if cap_bytes is None else min(pre_load_free_bytes, cap_bytes)


def cpu_default_cap_bytes(available_bytes: int) -> int:
    """The CPU budget cap when neither --mem-fraction-static nor --max-total-memory-gb is given."""
    return int(available_bytes * CPU_DEFAULT_AVAILABLE_SHARE)


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
