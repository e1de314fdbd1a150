"""MemoryPlan: the frozen result of plan_memory(), which validates its own invariants and explains itself."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Optional

from sglang.srt.mem_plan.sizes import kv_pool_rows
from sglang.srt.mem_plan.units import gib

SOURCES = ("measured", "declared", "formula")


@dataclass(frozen=True)
class MemoryTerm:
    name: str
    num_bytes: int
    source: str  # measured / declared / formula
    detail: str = ""

    def __post_init__(self):
        if self.num_bytes < 0:
            raise ValueError(f"memory term {self.name!r} is negative: {self.num_bytes} bytes")
        if self.source not in SOURCES:
            raise ValueError(f"memory term {self.name!r}: source {self.source!r} not in {SOURCES}")


@dataclass(frozen=True)
class MemoryPlan:
    budget_bytes: int
    pre_load_free_bytes: int
    cap_bytes: Optional[int]
    max_total_num_tokens: int
    max_running_requests: int
    mem_fraction_static: float
    mem_fraction_static_source: str  # "auto" / "user"
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    page_size: int
    context_len: int
    kv_cell_bytes: int
    terms: tuple[MemoryTerm, ...]
    slot_regime: str  # floor / linear / cap / half / user
    limited_by: str
    notes: tuple[str, ...] = field(default=())
    cap_source: str = "--max-total-memory-gb"
    kv_fixed_bytes: int = 0  # fp8's per-(layer, KV head) scales, in the kv_cache term
    kv_window_rows: int = 0  # a quantized KV's recent-window rows requests can hold (kv_window.py), in kv_window

    def __post_init__(self):
        if self.mem_fraction_static_source not in ("auto", "user"):
            raise ValueError(f"bad mem_fraction_static_source {self.mem_fraction_static_source!r}")
        names = [t.name for t in self.terms]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate memory terms: {names}")
        if self.total_bytes > self.budget_bytes:
            raise ValueError(f"memory terms sum to {self.total_bytes} bytes > budget {self.budget_bytes}")
        if self.max_total_num_tokens < 0 or self.max_total_num_tokens % self.page_size:
            raise ValueError(f"max_total_num_tokens {self.max_total_num_tokens} is not a multiple of page_size")
        if not 0 <= self.max_running_requests <= max(self.max_total_num_tokens // 2, 0):
            raise ValueError(f"max_running_requests {self.max_running_requests} outside [0, T // 2]")
        pool_rows = kv_pool_rows(self.max_total_num_tokens, self.page_size)
        if self.term("kv_cache").num_bytes != pool_rows * self.kv_cell_bytes + self.kv_fixed_bytes:
            raise ValueError("kv_cache term disagrees with (max_total_num_tokens + one dummy page) * kv_cell_bytes"
                             " + kv_fixed_bytes")
        if not 0.0 <= self.mem_fraction_static <= 1.0:
            raise ValueError(f"mem_fraction_static {self.mem_fraction_static} outside [0, 1]")

    # ---- derived ----
    @property
    def total_bytes(self) -> int:
        return sum(t.num_bytes for t in self.terms)

    @property
    def headroom_bytes(self) -> int:
        """Budget not claimed by any term (explicit y leaves the unused part of the runtime region here)."""
        return self.budget_bytes - self.total_bytes

    @property
    def kv_bytes(self) -> int:
        return self.term("kv_cache").num_bytes

    def term(self, name: str) -> MemoryTerm:
        for t in self.terms:
            if t.name == name:
                return t
        raise KeyError(name)

    def bytes_of(self, name: str) -> int:
        """A term's bytes; 0 for an optional term this plan does not have (kv_window without a recent window)."""
        if name == "kv_window" and all(t.name != name for t in self.terms):
            return 0
        return self.term(name).num_bytes

    # ---- views ----
    def to_dict(self) -> dict:
        d = asdict(self)
        d["terms"] = [asdict(t) for t in self.terms]
        d["notes"] = list(self.notes)
        d["total_bytes"] = self.total_bytes
        d["headroom_bytes"] = self.headroom_bytes
        return d

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def render_table(self) -> str:
        rows = [(t.name, gib(t.num_bytes), t.source, t.detail) for t in self.terms]
        rows.append(("headroom", gib(self.headroom_bytes), "", "budget not claimed by any term"))
        width = max(len(r[0]) for r in rows) + 2
        lines = [f"{'term':<{width}}{'GiB':>10}  {'source':<9} detail", "-" * (width + 40)]
        for name, value, source, detail in rows:
            lines.append(f"{name:<{width}}{value:>10.3f}  {source:<9} {detail}".rstrip())
        lines.append("-" * (width + 40))
        lines.append(f"{'budget':<{width}}{gib(self.budget_bytes):>10.3f}  {'':<9} {self._budget_detail()}".rstrip())
        return "\n".join(lines)

    def _budget_detail(self) -> str:
        if self.cap_bytes is not None and self.cap_bytes < self.pre_load_free_bytes:
            return f"capped by {self.cap_source} (pre-load free {gib(self.pre_load_free_bytes):.2f} GiB)"
        return "pre-load free memory"

    def explain(self) -> str:
        lines = [
            f"KV pool: {self.max_total_num_tokens:,} tokens (+ a {self.page_size}-token dummy page) x "
            f"{self.kv_cell_bytes:,} B = {gib(self.kv_bytes):.2f} GiB "
            f"({self.max_total_num_tokens / self.context_len:.2f} full-context requests at context {self.context_len:,}).",
            f"Request slots: {self.max_running_requests:,} (slot rule regime: {self.slot_regime}).",
            f"mem_fraction_static: {self.mem_fraction_static:.4f} ({self.mem_fraction_static_source}); "
            f"limited by: {self.limited_by}.",
            f"chunked_prefill_size {self.chunked_prefill_size}, cuda_graph_max_bs {self.cuda_graph_max_bs}, "
            f"page_size {self.page_size}.",
        ]
        lines.extend(self.notes)
        return "\n".join(lines)
