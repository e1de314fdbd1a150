"""MemoryPlan: the frozen result of plan_memory(), which validates its own invariants and explains itself."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Optional

from sglang.srt.mem_plan.layer_pools import WINDOWED_MAP_ENTRY_BYTES
from sglang.srt.mem_plan.sizes import kv_pool_rows
from sglang.srt.mem_plan.spec_sizes import SpecPlan, draft_kv_pool_bytes
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
    slot_regime: str  # floor / linear / cap / half / user; hybrids: first-context / per-context / balance
    limited_by: str
    notes: tuple[str, ...] = field(default=())
    cap_source: str = "--max-total-memory-gb"
    kv_fixed_bytes: int = 0  # fp8's per-(layer, KV head) scales, in the kv_cache term
    kv_window_rows: int = 0  # a quantized KV's recent-window rows requests can hold (kv_window.py), in kv_window
    # the pools of layers that do not keep every token (layer_pools.py); all 0 / "" when every layer is full
    layer_kinds: str = ""  # e.g. "10 full, 52 sliding"
    windowed_tokens: int = 0  # T_w, in kv_windowed
    windowed_cell_bytes: int = 0
    windowed_fixed_bytes: int = 0
    window_slot_tokens: int = 0  # W + 2 (page - 1): what one request keeps between forwards
    windowed_forward_tokens: int = 0  # max(chunk, slots): what one forward adds
    state_slots: int = 0  # slots + 1 dummy, in linear_state
    state_bytes_per_slot: int = 0
    has_full_pool: bool = True  # False: no full layer; max_total_num_tokens is the windowed pool's tokens (or, with
    # no windowed layer either, slots x context: logical)
    speculative: Optional[SpecPlan] = None  # speculative decoding's draft pool, weights, verify rows (spec_terms.py)

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
        self._check_layer_pools()
        self._check_speculative()
        if not 0.0 <= self.mem_fraction_static <= 1.0:
            raise ValueError(f"mem_fraction_static {self.mem_fraction_static} outside [0, 1]")

    def _check_layer_pools(self):
        names = {t.name for t in self.terms}
        windowed, state = self.windowed_cell_bytes > 0, self.state_bytes_per_slot > 0
        if ("kv_windowed" in names) != windowed or ("linear_state" in names) != state:
            raise ValueError("kv_windowed / linear_state terms disagree with the windowed cell / state bytes")
        if windowed:
            if self.windowed_tokens % self.page_size or (self.has_full_pool and
                                                          self.windowed_tokens > self.max_total_num_tokens):
                raise ValueError(f"windowed_tokens {self.windowed_tokens} is not a page multiple <= the full pool")
            rows = kv_pool_rows(self.windowed_tokens, self.page_size)
            if self.term("kv_windowed").num_bytes != rows * self.windowed_cell_bytes + self.windowed_fixed_bytes:
                raise ValueError("kv_windowed term disagrees with (windowed_tokens + one dummy page) * "
                                 "windowed_cell_bytes + windowed_fixed_bytes")
        map_rows = kv_pool_rows(self.max_total_num_tokens, self.page_size) if windowed and self.has_full_pool else 0
        if ("kv_windowed_map" in names) != bool(map_rows) or (
                map_rows and self.term("kv_windowed_map").num_bytes != map_rows * WINDOWED_MAP_ENTRY_BYTES):
            raise ValueError("kv_windowed_map term disagrees with (max_total_num_tokens + one dummy page) x "
                             f"{WINDOWED_MAP_ENTRY_BYTES} B, present only with both a full and a windowed pool")
        if state and (self.state_slots != self.max_running_requests + 1 or
                      self.term("linear_state").num_bytes != self.state_slots * self.state_bytes_per_slot):
            raise ValueError("linear_state term disagrees with (max_running_requests + 1 dummy) * state_bytes_per_slot")
        if not self.has_full_pool and windowed and (self.kv_cell_bytes or
                                                    self.windowed_tokens != self.max_total_num_tokens):
            raise ValueError("a plan without full layers has no KV cell, and its windowed pool is its token pool")
        if not self.has_full_pool and not windowed and (self.kv_cell_bytes or self.max_total_num_tokens
                                                        < self.max_running_requests * self.context_len):
            raise ValueError("a plan without full or windowed layers has no KV cell and maps slots x context tokens")

    def _check_speculative(self):
        s, names = self.speculative, {t.name for t in self.terms}
        if (s is not None) != ("draft_kv_cache" in names):
            raise ValueError("draft_kv_cache term disagrees with the plan's speculative part")
        if s is not None and not (self.term("draft_kv_cache").num_bytes == s.draft_kv_bytes == draft_kv_pool_bytes(
                self.max_total_num_tokens, self.page_size, s.draft_kv_cell_bytes, s.draft_kv_fixed_bytes)
                and self.term("draft_weights").num_bytes == s.draft_weight_bytes):
            raise ValueError("draft_kv_cache / draft_weights terms disagree with (max_total_num_tokens + one dummy "
                             "page) x draft_kv_cell_bytes + draft_kv_fixed_bytes / draft_weight_bytes")

    # ---- derived ----
    @property
    def total_bytes(self) -> int:
        return sum(t.num_bytes for t in self.terms)

    @property
    def headroom_bytes(self) -> int:
        """Budget not claimed by any term (explicit y leaves the unused part of the runtime region here)."""
        return self.budget_bytes - self.total_bytes

    @property
    def full_context_requests(self) -> int:
        """Requests at the full context that can be held at once: the full pool (T // context), the windowed pool
        (each keeps window_slot_tokens beside one forward's new tokens) and the slots permitting. Without full
        layers the windowed pool is the token pool and counts as the full pool does: T_w // window_slot_tokens."""
        fits = [self.max_running_requests]
        if self.has_full_pool:
            fits.append(self.max_total_num_tokens // self.context_len)
        elif self.window_slot_tokens:
            fits.append(self.windowed_tokens // self.window_slot_tokens)
        if self.window_slot_tokens and self.has_full_pool:
            fits.append(max(self.windowed_tokens - self.windowed_forward_tokens, 0) // self.window_slot_tokens)
        return min(fits)

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
        optional = ("kv_window", "kv_windowed", "kv_windowed_map", "linear_state", "draft_weights", "draft_kv_cache",
                    "spec_hidden_states", "draft_cuda_graphs", "draft_attention_workspace")
        if name in optional and all(t.name != name for t in self.terms):
            return 0
        return self.term(name).num_bytes

    # ---- views ----
    def to_dict(self) -> dict:
        d = asdict(self)
        d["terms"] = [asdict(t) for t in self.terms]
        d["notes"] = list(self.notes)
        d["total_bytes"] = self.total_bytes
        d["headroom_bytes"] = self.headroom_bytes
        d["full_context_requests"] = self.full_context_requests
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
        lines = [self._full_pool_line(), *self._layer_pool_lines(),
            f"Request slots: {self.max_running_requests:,} (slot rule regime: {self.slot_regime}).",
            f"mem_fraction_static: {self.mem_fraction_static:.4f} ({self.mem_fraction_static_source}); "
            f"limited by: {self.limited_by}.",
            f"chunked_prefill_size {self.chunked_prefill_size}, cuda_graph_max_bs {self.cuda_graph_max_bs}, "
            f"page_size {self.page_size}.",
        ]
        lines.extend(self._speculative_lines())
        lines.extend(self.notes)
        return "\n".join(lines)

    def _speculative_lines(self) -> list[str]:
        s = self.speculative
        if s is None:
            return []
        rows = (f"{s.num_draft_tokens} tokens a request per verify" if s.verify_rows_per_req == s.num_draft_tokens
                else f"num_draft_tokens {s.num_draft_tokens}: a tree's nodes + 1, verified as "
                f"{s.verify_rows_per_req} expanded rows a request")
        out = [f"Speculative decoding ({s.algorithm}, {rows}): draft "
               f"{s.draft}; weights {gib(s.draft_weight_bytes):.3f} GiB, KV {s.draft_kv_cell_bytes:,} B/token over the "
               f"target's {self.max_total_num_tokens:,} token slots ({gib(s.draft_kv_bytes):.3f} GiB)."]
        out.append(f"A verify forward holds at most {s.verify_tokens:,} tokens (max(slots, min(slots x "
                   f"{s.verify_rows_per_req}, chunked_prefill_size {self.chunked_prefill_size}"
                   + (f", the CPU budget {s.verify_budget_tokens}" if s.verify_budget_tokens else "")
                   + "))): the logits term "
                   f"keeps a sampler row for each; its activations are no more than a prefill chunk's (the "
                   f"activation term's profile forward) or a decode step's of every slot, which the plan already holds.")
        if s.branch_rows:
            out.append(f"A tree has up to {s.tree_branches} branches; the side branches of one verify forward take "
                       f"at most {s.branch_rows:,} request-table rows beside the {self.max_running_requests:,} slots "
                       f"(slots x {s.tree_branches - 1}, or fewer where the verify budget holds fewer whole branches: "
                       f"spec_sizes.branch_rows), priced in req_to_token, the attention workspace's per-sequence "
                       f"buffers and the KV window map.")
        return out

    def _full_pool_line(self) -> str:
        if not self.has_full_pool and self.windowed_cell_bytes:
            return ("KV pool (full layers): none -- no layer keeps every token; the windowed pool is the token pool "
                    f"({self.max_total_num_tokens:,} tokens).")
        if not self.has_full_pool:
            return (f"KV pool (full layers): none -- no layer keeps every token; {self.max_total_num_tokens:,} "
                    f"tokens = {self.max_running_requests:,} slots x context {self.context_len:,} map to the "
                    f"windowed pool.")
        name = "KV pool (full layers)" if self.layer_kinds else "KV pool"
        return (f"{name}: {self.max_total_num_tokens:,} tokens (+ a {self.page_size}-token dummy page) x "
                f"{self.kv_cell_bytes:,} B = {gib(self.kv_bytes):.2f} GiB "
                f"({self.max_total_num_tokens / self.context_len:.2f} full-context requests at context "
                f"{self.context_len:,}).")

    def _layer_pool_lines(self) -> list[str]:
        if not self.layer_kinds:
            return []
        lines = [f"Layers: {self.layer_kinds}."]
        if self.windowed_cell_bytes:
            lines.append(f"Windowed pool (sliding/chunked layers): {self.windowed_tokens:,} tokens x "
                         f"{self.windowed_cell_bytes:,} B = {gib(self.bytes_of('kv_windowed')):.2f} GiB "
                         f"({self.window_slot_tokens:,} a request + {self.windowed_forward_tokens:,} a forward).")
        if self.state_bytes_per_slot:
            lines.append(f"Linear-state pool: {self.state_slots:,} slots (1 dummy) x {self.state_bytes_per_slot:,} B "
                         f"= {gib(self.bytes_of('linear_state')):.2f} GiB.")
        limits = (["the full pool"] if self.has_full_pool else []) + \
                 (["the windowed pool"] if self.windowed_cell_bytes else []) + ["the slots"]
        lines.append(f"Full-context requests that fit at once: {self.full_context_requests:,} "
                     f"({', '.join(limits)} permitting).")
        return lines
