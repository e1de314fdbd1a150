"""plan_memory(): PlanInputs -> MemoryPlan. Pure integer arithmetic; the equation itself is in budget.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sglang.srt.mem_plan import budget as B
from sglang.srt.mem_plan.errors import MemoryPlanError
from sglang.srt.mem_plan.inputs import PlanInputs
from sglang.srt.mem_plan.layer_pools import (WINDOWED_MAP_ENTRY_BYTES, PoolCost, forward_tokens, request_pool_tokens,
                                             window_tokens_per_slot)
from sglang.srt.mem_plan.kv_window import (KV_WINDOW_BUDGET_SHARE, KV_WINDOW_MAP_ENTRY_BYTES, KV_WINDOW_SCRATCH_ROWS,
                                           WindowedSlotCost, planned_window_rows, window_rows_for, window_term_bytes)
from sglang.srt.mem_plan.plan import MemoryPlan, MemoryTerm
from sglang.srt.mem_plan.rounding import align_up
from sglang.srt.mem_plan.shortfall import raise_nothing_fits, runtime_breakdown
from sglang.srt.mem_plan.slots import SlotRule
from sglang.srt.mem_plan.solver import SlotCost, solve_max_tokens
from sglang.srt.mem_plan.sizes import kv_pool_rows, req_to_token_bytes, req_to_token_row_len
from sglang.srt.mem_plan.spec_sizes import SpecPlan, draft_kv_pool_bytes
from sglang.srt.mem_plan.spec_terms import spec_terms
from sglang.srt.mem_plan.tiers import tier_defaults
from sglang.srt.mem_plan.units import MiB, gib


@dataclass(frozen=True)
class _Resolved:
    """Everything derived from PlanInputs before solving."""

    inputs: PlanInputs
    budget: int
    margin: int
    graph_bs: int
    rule: SlotRule
    slot_cost: WindowedSlotCost
    fixed_runtime: int  # activations, logits, cuda graphs, encoder, mm cache, grammar cache, MoE workspace, margin
    min_kv_tokens: int
    max_tokens: Optional[int]  # page-aligned user cap on T (or the zero-cell fallback)
    pools: PoolCost  # windowed KV and linear state (layer_pools.py)

    @classmethod
    def of(cls, x: PlanInputs) -> "_Resolved":
        budget = B.budget_bytes(x.pre_load_free_bytes, x.cap_bytes)
        margin = B.default_safety_margin_bytes(budget) if x.safety_margin_bytes is None else x.safety_margin_bytes
        if x.cuda_graph_max_bs is not None:
            graph_bs = x.cuda_graph_max_bs
        elif x.device_total_bytes is not None:
            graph_bs = tier_defaults(x.device_total_bytes // MiB, x.tp_size)[1]
        else:
            graph_bs = 0
        row_bytes = req_to_token_bytes(0, x.context_len, x.req_to_token_elem_bytes)  # one row
        spec = x.speculative  # its verify rows replace the sampler's row per slot (spec_sizes.py)
        draft_fixed, draft_row = ((spec.draft_workspace_fixed_bytes, spec.draft_workspace_per_row_bytes) if spec
                                  else (0, 0))  # the draft backend's buffers: per request-table row
        slot_cost = WindowedSlotCost(
            fixed_bytes=x.workspace.fixed_bytes + row_bytes + draft_fixed,  # + the dummy row 0 of req_to_token
            per_slot_bytes=(x.workspace.per_req_bytes + row_bytes + (0 if spec else x.logits_per_req_bytes)
                            + x.grammar_per_req_bytes + draft_row),
            verify_row_bytes=spec.row_bytes if spec else 0,
            verify_tokens_per_slot=spec.verify_rows_per_req if spec else 1,  # a tree's expanded rows
            verify_cap_tokens=spec.cap_tokens(x.chunked_prefill_size) if spec else 0,
            per_graph_bs_bytes=x.workspace.per_graph_bs_bytes,
            cuda_graph_max_bs=graph_bs,
            # a tree's side-branch rows: a table row, the backends' per-sequence buffers, a window map entry
            branch_row_bytes=(row_bytes + x.workspace.per_branch_row_bytes + draft_row
                              + (KV_WINDOW_MAP_ENTRY_BYTES if x.kv_window_row_bytes else 0)) if spec else 0,
            spec=spec,
            chunk_tokens=x.chunked_prefill_size,
            window_row_bytes=x.kv_window_row_bytes,  # a quantized KV's recent window: rows by budget (kv_window.py)
            window_cap_rows=planned_window_rows(budget, x.kv_window_row_bytes),
        )
        fixed_runtime = (x.activation_bytes + x.logits_bytes + x.cuda_graph_bytes + x.encoder_total_bytes
                         + x.mm_cache_bytes + x.grammar_cache_bytes + x.moe_workspace_bytes + margin
                         + (spec.draft_cuda_graph_bytes if spec else 0))
        pools = x.layer_pools
        windowed_pool = pools.windowed_token_pool  # T: the windowed tokens (layer_pools.py)
        kind = ("upstream" if not pools.per_slot_layers or windowed_pool else
                "first-context" if pools.has_full_pool else "context-per-slot")
        chunk = x.chunked_prefill_size if x.chunked_prefill_size > 0 else x.context_len
        pool_cost = PoolCost(pools, chunk, x.page_size)
        rule_context = (request_pool_tokens(pools.window_tokens, x.page_size, x.context_len) if windowed_pool
                        else x.context_len)
        rule = SlotRule(rule_context, x.max_running_requests, kind=kind, full_cell_bytes=x.kv_cell_bytes,
                        pools=pool_cost)  # the balance cap (slots.py)
        max_tokens = x.max_total_tokens
        if kind == "context-per-slot" and max_tokens is None:
            max_tokens = align_up(rule.slot_cap * x.context_len, x.page_size)  # no token pool: T = R x context
        if windowed_pool:  # never more windowed tokens than the most slots can hold: U(slot cap)
            bound = pool_cost.windowed_bound(rule.slot_cap) // x.page_size * x.page_size
            max_tokens = bound if max_tokens is None else min(max_tokens, bound)
        if x.kv_cell_bytes == 0 and max_tokens is None:
            max_tokens = x.context_len  # no KV layers on this rank: upstream falls back to the context length
        if max_tokens is not None:
            max_tokens = max_tokens // x.page_size * x.page_size
        min_kv = x.min_kv_tokens if x.min_kv_tokens is not None else min(x.context_len, chunk)
        if kind == "context-per-slot":
            min_kv = x.context_len  # one slot: T = R x context
        min_kv = align_up(max(min_kv, 2), x.page_size)  # >= 2 so that R(T) <= T // 2 allows one request
        if max_tokens is not None and kind != "context-per-slot":
            min_kv = min(min_kv, max(max_tokens, x.page_size))
        return cls(x, budget, margin, graph_bs, rule, slot_cost, fixed_runtime, min_kv, max_tokens, pool_cost)

    # ---- terms at a given pool size ----
    @property
    def windowed_pool(self) -> bool:
        """No full layer, windowed layers: T is the windowed pool's tokens (layer_pools.py)."""
        return self.pools.pools.windowed_token_pool

    def snap(self, num_tokens: int) -> int:
        """Without a full pool: the windowed pool's T -> T_w(T, R(T)) (= T but for a 1-token window at page 1), and
        the every-layer-linear model's logical T -> exactly the slots' contexts (R x context, page-aligned up; the
        same R, and no more bytes since nothing is charged per logical token)."""
        if self.windowed_pool:  # T_w <= T; a smaller T may have fewer slots, so down to a fixed point (T decreases)
            while (pooled := self.pools.windowed_tokens(num_tokens, self.rule.slots(num_tokens))) != num_tokens:
                num_tokens = pooled
            return num_tokens
        num_slots = self.rule.slots(num_tokens)
        if self.rule.kind != "context-per-slot" or not num_slots:
            return num_tokens
        return align_up(num_slots * self.inputs.context_len, self.inputs.page_size)

    def pool_bytes(self, num_tokens: int) -> int:
        """The windowed and state pools at T: static, allocated beside the KV pool."""
        return self.pools.bytes_for(num_tokens, self.rule.slots(num_tokens))

    def runtime_bytes(self, num_tokens: int) -> int:
        return self.slot_cost.bytes_for(self.rule.slots(num_tokens)) + self.fixed_runtime

    def terms(self, num_tokens: int) -> tuple[MemoryTerm, ...]:
        x = self.inputs
        num_reqs = self.rule.slots(num_tokens)
        graph_bs = min(self.graph_bs, num_reqs)
        branch = self.slot_cost.branch_rows(num_reqs)
        src = x.source_of
        ws = x.workspace
        return (
            MemoryTerm("weights", x.weight_bytes, src("weights")),
            MemoryTerm("kv_cache", kv_pool_rows(num_tokens, x.page_size) * x.kv_cell_bytes + x.kv_fixed_bytes,
                       src("kv_cache"), "no full-attention layer: no token is kept by every layer"
                       if not x.layer_pools.has_full_pool else
                       f"({num_tokens:,} tokens + {x.page_size} dummy) x {x.kv_cell_bytes:,} B"
                       + (f" + {x.kv_fixed_bytes:,} B of scales" if x.kv_fixed_bytes else "")
                       + (f"; {x.kv_detail}" if x.kv_detail else "")),
            *((self.window_term(num_reqs, branch),) if x.kv_window_row_bytes else ()),
            *self.pool_terms(num_tokens, num_reqs),
            MemoryTerm("req_to_token", req_to_token_bytes(num_reqs + branch, x.context_len, x.req_to_token_elem_bytes),
                       src("req_to_token"),
                       f"{num_reqs + branch + 1:,} rows x {req_to_token_row_len(x.context_len):,} x "
                       f"{x.req_to_token_elem_bytes} B" + (f" ({num_reqs:,} slots, {branch:,} rows for speculative "
                                                            f"trees' side branches, 1 dummy)" if branch else "")),
            MemoryTerm("attention_workspace", ws.bytes_for(num_reqs, graph_bs, branch), src("attention_workspace"),
                       f"{ws.name}: {ws.fixed_bytes:,} + {ws.per_req_bytes:,} x {num_reqs:,} slots"
                       f" + {ws.per_graph_bs_bytes:,} x {graph_bs} graph bs"
                       + (f" + {ws.per_branch_row_bytes:,} x {branch:,} branch rows" if branch else "")),
            self.logits_term(num_reqs),
            MemoryTerm("activations", x.activation_bytes, src("activations"),
                       f"forward at chunked_prefill_size {x.chunked_prefill_size}"),
            MemoryTerm("moe_workspace", x.moe_workspace_bytes, src("moe_workspace"), x.moe_workspace_detail),
            MemoryTerm("cuda_graphs", x.cuda_graph_bytes, src("cuda_graphs"), f"max bs {graph_bs}"),
            *_encoder_terms(x),
            MemoryTerm("mm_embedding_cache", x.mm_cache_bytes, src("mm_embedding_cache"),
                       "image embeddings by content hash" if x.mm_cache_bytes else ""),
            MemoryTerm("grammar", x.grammar_cache_bytes + x.grammar_per_req_bytes * num_reqs, src("grammar"),
                       f"compiled-grammar cache {x.grammar_cache_bytes:,} + bitmask {x.grammar_per_req_bytes:,} x "
                       f"{num_reqs:,} slots" if x.grammar_cache_bytes or x.grammar_per_req_bytes else ""),
            *spec_terms(x, num_tokens, num_reqs),
            MemoryTerm("safety_margin", self.margin, src("safety_margin"),
                       "stated by caller" if x.safety_margin_bytes is not None else
                       f"{B.SAFETY_MARGIN_FRACTION:.0%} of budget in [64 MiB, 1 GiB]"),
        )

    def logits_term(self, num_reqs: int) -> MemoryTerm:
        """The sampler's rows: one per slot, or with speculative decoding one per verify row (spec_sizes.py)."""
        x, spec = self.inputs, self.inputs.speculative
        if spec is None:
            return MemoryTerm("logits", x.logits_bytes + x.logits_per_req_bytes * num_reqs, x.source_of("logits"),
                              f"{x.logits_bytes:,} + {x.logits_per_req_bytes:,} x {num_reqs:,} slots")
        rows, budget = spec.verify_tokens(num_reqs, x.chunked_prefill_size), spec.verify_budget_tokens
        return MemoryTerm("logits", x.logits_bytes + spec.verify_row_bytes * rows, x.source_of("logits"),
                          f"{x.logits_bytes:,} + {spec.verify_row_bytes:,} x {rows:,} verify rows (max({num_reqs:,} slots, "
                          f"min({num_reqs:,} x {spec.verify_rows_per_req} rows a request, chunk {x.chunked_prefill_size}"
                          + (f", CPU budget {budget}" if budget else "") + ")))")

    def window_rows(self, num_tokens: int) -> int:
        """R_w: the recent-window rows requests can hold (kv_window.py); 0 without a window."""
        return window_rows_for(self.slot_cost.window_cap_rows, self.rule.slots(num_tokens))

    def window_term(self, num_reqs: int, branch_rows: int = 0) -> MemoryTerm:
        x, cap = self.inputs, self.slot_cost.window_cap_rows
        rows = window_rows_for(cap, num_reqs)
        return MemoryTerm("kv_window", window_term_bytes(cap, x.kv_window_row_bytes, num_reqs)
                          + KV_WINDOW_MAP_ENTRY_BYTES * branch_rows, x.source_of("kv_window"),
                          f"({rows:,} rows + {KV_WINDOW_SCRATCH_ROWS} scratch) x {x.kv_window_row_bytes:,} B + "
                          f"{num_reqs + branch_rows + 1:,} x {KV_WINDOW_MAP_ENTRY_BYTES} B map (a request-table row "
                          f"each): running requests' recent tokens "
                          f"uncompressed ({KV_WINDOW_BUDGET_SHARE:.0%} of budget, at most one row a slot)")

    def pool_terms(self, num_tokens: int, num_reqs: int) -> tuple[MemoryTerm, ...]:
        """kv_windowed and linear_state, for a model that has such layers (none for an all-full model)."""
        x, pc = self.inputs, self.pools
        p, out = pc.pools, []
        if p.windowed_layers:
            tokens = pc.windowed_tokens(num_tokens, num_reqs)
            per_slot = window_tokens_per_slot(p.window_tokens, x.page_size)
            bound = "the token pool (no full layer), sized by the budget" if self.windowed_pool else \
                "= the full pool's tokens (never more)" if tokens == num_tokens else \
                f"{num_reqs:,} slots x {per_slot:,} (window {p.window_tokens:,} + 2 x (page - 1)) + " \
                f"{forward_tokens(pc.chunk_tokens, num_reqs):,} forward tokens"
            out.append(MemoryTerm(
                "kv_windowed", pc.windowed_bytes(num_tokens, num_reqs), x.source_of("kv_windowed"),
                f"({tokens:,} tokens + {x.page_size} dummy) x {p.windowed_cell_bytes:,} B"
                + (f" + {p.windowed_fixed_bytes:,} B of scales" if p.windowed_fixed_bytes else "")
                + f"; {p.sliding_layers + p.chunked_layers} sliding/chunked layers; tokens {bound}"))
            if p.has_full_pool:
                out.append(MemoryTerm(
                    "kv_windowed_map", pc.map_bytes(num_tokens), x.source_of("kv_windowed_map"),
                    f"({num_tokens:,} tokens + {x.page_size} dummy) x {WINDOWED_MAP_ENTRY_BYTES} B: each token-pool "
                    f"slot's windowed slot"))
        if p.linear_layers:
            out.append(MemoryTerm(
                "linear_state", pc.state_bytes(num_reqs), x.source_of("linear_state"),
                f"({num_reqs:,} slots + 1 dummy) x {p.state_bytes_per_slot:,} B: {p.linear_layers} linear layers' "
                f"per-request state"))
        return tuple(out)

    # ---- explicit y ----
    def explicit_outcome(self, y: float) -> tuple[str, int]:
        """('ok' | 'startup' | 'runtime', T) for an explicit mem_fraction_static y."""
        x = self.inputs
        static = B.static_region_bytes(self.budget, y)
        kv_room = static - x.static_weight_bytes - dummy_page_bytes(x)
        if x.layer_pools.per_slot_layers:  # the pools are static too: the largest T whose pools fit the room
            num_tokens = 0 if kv_room < 0 else solve_max_tokens(kv_room, x.token_cell_bytes, self.rule, SlotCost(),
                                                                x.page_size, self.max_tokens, self.pools)
            num_tokens = self.snap(num_tokens)
        elif x.token_cell_bytes == 0:
            num_tokens = self.max_tokens if kv_room >= 0 else 0
        else:
            num_tokens = max(kv_room, 0) // x.token_cell_bytes // x.page_size * x.page_size
            if self.max_tokens is not None:
                num_tokens = min(num_tokens, self.max_tokens)
        if num_tokens < self.min_kv_tokens:
            return "startup", num_tokens
        if self.runtime_bytes(num_tokens) > self.budget - static:
            return "runtime", num_tokens
        return "ok", num_tokens

    def working_fractions(self) -> list[float]:
        """Every y on the 0.001 grid that works (an interval: startup needs y large, runtime needs y small)."""
        ys = [k / B.FRACTION_GRID for k in B.fraction_grid()]
        return [y for y in ys if self.explicit_outcome(y)[0] == "ok"]


def _encoder_terms(x: PlanInputs) -> tuple[MemoryTerm, ...]:
    """encoder_<modality> per encoded modality, or the one shared `encoder` term (--encoder-mem-reserve, or 0)."""
    if x.encoder_terms:
        return tuple(MemoryTerm(t.name, t.num_bytes, t.source, t.detail) for t in x.encoder_terms)
    return (MemoryTerm("encoder", x.encoder_total_bytes, x.source_of("encoder"), x.encoder_detail),)


def dummy_page_bytes(x: PlanInputs) -> int:
    """The KV pool's dummy page that padded reads point at (sizes.kv_pool_rows) and its fixed scales (fp8):
    allocated beside the T tokens, so the kv_cache term charges them too; likewise a draft's pool (draft_kv_cache)."""
    spec = x.speculative
    draft = draft_kv_pool_bytes(0, x.page_size, spec.draft_kv_cell_bytes, spec.draft_kv_fixed_bytes) if spec else 0
    return kv_pool_rows(0, x.page_size) * x.kv_cell_bytes + x.kv_fixed_bytes + draft


def plan_memory(inputs: PlanInputs) -> MemoryPlan:
    """Plan device memory: the largest KV pool such that every declared/measured term fits the budget.

    Auto mem_fraction_static (None): solve T exactly with all terms charged; report y = (weights + KV) / budget.
    Explicit y: honour it; raise MemoryPlanError naming the direction and a working value when it cannot work.
    Raises MemoryPlanError when nothing fits at all (with the shortfall in bytes).
    """
    r = _Resolved.of(inputs)
    if inputs.mem_fraction_static is None:
        return _plan_auto(r)
    return _plan_explicit(r, inputs.mem_fraction_static)


def _plan_auto(r: _Resolved) -> MemoryPlan:
    x = r.inputs
    avail = r.budget - x.static_weight_bytes - dummy_page_bytes(x) - r.fixed_runtime
    num_tokens = 0
    if avail >= 0:
        num_tokens = solve_max_tokens(avail, x.token_cell_bytes, r.rule, r.slot_cost, x.page_size, r.max_tokens,
                                      r.pools)
        num_tokens = r.snap(num_tokens)
    if num_tokens < r.min_kv_tokens:
        raise_nothing_fits(r)
    y = B.effective_mem_fraction(x.static_weight_bytes, kv_pool_rows(num_tokens, x.page_size) * x.token_cell_bytes
                                 + x.kv_fixed_bytes + r.pool_bytes(num_tokens)
                                 + (x.speculative.draft_kv_fixed_bytes if x.speculative else 0), r.budget)
    return _build(r, num_tokens, y, "auto", _limited_by(r, num_tokens))


def _plan_explicit(r: _Resolved, y: float) -> MemoryPlan:
    x = r.inputs
    status, num_tokens = r.explicit_outcome(y)
    if status == "ok":
        limited = "--max-total-tokens" if r.max_tokens is not None and num_tokens == r.max_tokens else \
            f"--mem-fraction-static={y} (static region {gib(B.static_region_bytes(r.budget, y)):.2f} GiB)"
        return _build(r, num_tokens, y, "user", limited)
    working = r.working_fractions()
    if not working:
        raise_nothing_fits(r, prefix=f"--mem-fraction-static={y} cannot work, and no other value can either. ")
    static = B.static_region_bytes(r.budget, y)
    if status == "startup":
        suggested = working[0]
        raise MemoryPlanError(
            f"Startup would fail: --mem-fraction-static={y} gives a static region of {gib(static):.2f} GiB "
            f"(= {y} x budget {gib(r.budget):.2f} GiB); weights take {gib(x.static_weight_bytes):.2f} GiB, leaving "
            f"{gib(static - x.static_weight_bytes):.2f} GiB for the KV cache, but the pool needs at least "
            f"{r.min_kv_tokens:,} tokens ({gib(r.min_kv_tokens * x.token_cell_bytes):.2f} GiB)"
            + (f" and its windowed / linear-state pools {gib(r.pool_bytes(r.min_kv_tokens)):.2f} GiB"
               if x.layer_pools.per_slot_layers else "") + ". "
            f"Raise --mem-fraction-static to {suggested:.3f} (any value in [{working[0]:.3f}, {working[-1]:.3f}] "
            f"works), or leave it unset for the auto plan.",
            knob="--mem-fraction-static", direction="raise", suggested_value=suggested)
    suggested = working[-1]
    need = r.runtime_bytes(num_tokens)
    raise MemoryPlanError(
        f"Runtime OOM risk: --mem-fraction-static={y} leaves a runtime region of {gib(r.budget - static):.2f} GiB "
        f"(= (1 - {y}) x budget {gib(r.budget):.2f} GiB), but with a KV pool of {num_tokens:,} tokens and "
        f"{r.rule.slots(num_tokens):,} request slots the runtime terms need {gib(need):.2f} GiB "
        f"({runtime_breakdown(r, num_tokens)}). Lower --mem-fraction-static to {suggested:.3f} (any value in "
        f"[{working[0]:.3f}, {working[-1]:.3f}] works), or leave it unset for the auto plan.",
        knob="--mem-fraction-static", direction="lower", suggested_value=suggested)


def _limited_by(r: _Resolved, num_tokens: int) -> str:
    x = r.inputs
    if x.max_total_tokens is not None and num_tokens == x.max_total_tokens // x.page_size * x.page_size:
        return "--max-total-tokens"
    if r.windowed_pool and num_tokens == r.max_tokens:
        return (f"the windowed bound: {r.rule.slot_cap:,} slots x "
                f"{window_tokens_per_slot(x.layer_pools.window_tokens, x.page_size):,} + forward tokens")
    if r.rule.kind == "context-per-slot" and r.rule.slots(num_tokens) == r.rule.slot_cap:
        return "--max-running-requests" if r.inputs.max_running_requests is not None else \
            f"the slot cap ({r.rule.slot_cap:,})"
    if r.inputs.cap_bytes is not None and r.inputs.cap_bytes < r.inputs.pre_load_free_bytes:
        return r.inputs.cap_source
    return "device memory"


def _build(r: _Resolved, num_tokens: int, y: float, source: str, limited_by: str) -> MemoryPlan:
    x = r.inputs
    num_reqs = r.rule.slots(num_tokens)
    notes = []
    if num_tokens < x.context_len:
        notes.append(f"The KV pool ({num_tokens:,} tokens) is smaller than the context length "
                     f"({x.context_len:,}): a single request can use at most {num_tokens - 1:,} tokens.")
    return MemoryPlan(
        budget_bytes=r.budget,
        pre_load_free_bytes=x.pre_load_free_bytes,
        cap_bytes=x.cap_bytes,
        cap_source=x.cap_source,
        max_total_num_tokens=num_tokens,
        max_running_requests=num_reqs,
        mem_fraction_static=y,
        mem_fraction_static_source=source,
        chunked_prefill_size=x.chunked_prefill_size,
        cuda_graph_max_bs=min(r.graph_bs, num_reqs),
        page_size=x.page_size,
        context_len=x.context_len,
        kv_cell_bytes=x.kv_cell_bytes,
        kv_fixed_bytes=x.kv_fixed_bytes,
        kv_window_rows=r.window_rows(num_tokens) if x.kv_window_row_bytes else 0,
        layer_kinds=x.layer_pools.describe_kinds() if x.layer_pools.mixed_kinds else "",
        windowed_tokens=r.pools.windowed_tokens(num_tokens, num_reqs),
        windowed_cell_bytes=x.layer_pools.windowed_cell_bytes,
        windowed_fixed_bytes=x.layer_pools.windowed_fixed_bytes,
        window_slot_tokens=(window_tokens_per_slot(x.layer_pools.window_tokens, x.page_size)
                            if x.layer_pools.windowed_layers else 0),
        windowed_forward_tokens=forward_tokens(r.pools.chunk_tokens, num_reqs) if x.layer_pools.windowed_layers else 0,
        state_slots=r.pools.state_slots(num_reqs),
        state_bytes_per_slot=x.layer_pools.state_bytes_per_slot,
        has_full_pool=x.layer_pools.has_full_pool,
        terms=r.terms(num_tokens),
        speculative=(SpecPlan.of(x.speculative, num_tokens, num_reqs, x.page_size, x.chunked_prefill_size)
                     if x.speculative is not None else None),
        slot_regime=r.rule.regime(num_tokens),
        limited_by=limited_by,
        notes=tuple(notes),
    )
