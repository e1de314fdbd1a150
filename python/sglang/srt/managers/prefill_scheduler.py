"""Prefill admission: the PrefillPlanner builds one prefill batch from the chunked request and waiting requests,
matching prefixes and allocating KV slots, within these budgets:

    rem_total_tokens = free + evictable cache - sum(reservations of running requests)
A waiting request is admitted while its uncached prompt plus its own reservation fits in rem_total_tokens,
the chunk budget (chunked_prefill_size) and the batch budget (max_prefill_tokens) allow, request slots remain,
the running-request limit allows (lowered for a while after a decode OOM; the caller passes it), and the images its
chunk must encode fit the encoder reservation of multimodal models.
A running request will still need up to min(remaining_new_tokens, CLIP) KV slots (CLIP: 4096, or upstream's
SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION when set); we reserve that times
`new_token_ratio`, an estimate of how much of the budget requests really use. The ratio starts high, decays while
decode proceeds without trouble and jumps back up after a retraction (decode_memory.py moves it; the planner owns
it). On a model whose layers are all windowed (mem_cache/swa_allocator.py: the windowed pool is the token pool) a
request never holds more than its window (W + 2 (page - 1)) and the chunk it prefills, whatever its length: its
cost and reservation are capped there (request_pool_cap), or such a model would be admitted one request at a time.
Every request the planner touches is recorded in `queues.in_step` first, so a fault while preparing fails
exactly those requests (fault_confinement.py).
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, field
from typing import Any, List, Optional

from sglang.srt.managers.req_memory import ReqMemory
from sglang.srt.managers.request_queues import RequestQueues
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.mem_plan.layer_pools import window_tokens_per_slot

# Named after upstream's env vars, with upstream's defaults. Only the one upstream documents is read from the
# environment (docs/upstream_compatibility.md); the others upstream keeps undocumented, and they stay constants here.
INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS
CLIP_MAX_NEW_TOKENS = 4096  # default of SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
CLIP_MAX_NEW_TOKENS_ENV = "SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION"


def clip_max_new_tokens() -> int:
    """The most new tokens one running request is assumed to still need (before new_token_ratio): upstream's
    documented SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION when set, else CLIP_MAX_NEW_TOKENS. A bad value stops the
    scheduler's start with this message."""
    raw = os.environ.get(CLIP_MAX_NEW_TOKENS_ENV, "").strip()
    if not raw:
        return CLIP_MAX_NEW_TOKENS
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{CLIP_MAX_NEW_TOKENS_ENV}={raw!r}: expected a positive integer (tokens; upstream's "
                         f"default is {CLIP_MAX_NEW_TOKENS}), or leave it unset.")
    return int(raw)


@dataclass
class NewTokenRatio:
    conservativeness: float = 1.0

    def __post_init__(self):
        self.init = min(INIT_NEW_TOKEN_RATIO * self.conservativeness, 1.0)
        self.min = min(self.init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.decay = (self.init - self.min) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.value = self.init

    def reset(self) -> None:
        self.value = self.init

    def step(self) -> None:
        self.value = max(self.value - self.decay, self.min)

    def after_retract(self, running: List[Req]) -> None:
        decoded = sum(len(r.output_ids) for r in running)
        budget = sum(r.max_new_tokens for r in running)
        if budget:
            self.value = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(running)) / budget)


def reserved_tokens(req: Req, ratio: float, clip: int = CLIP_MAX_NEW_TOKENS) -> int:
    return math.ceil(min(req.remaining_new_tokens(), clip) * ratio)


def order_waiting_queue(queue: List[Req], policy: str, prefix_len_of) -> None:
    """In-place: fcfs keeps arrival order, lpm puts the longest cached prefix first, random shuffles."""
    if policy == "lpm" and len(queue) > 1:
        queue.sort(key=lambda r: -prefix_len_of(r))
    elif policy == "random":
        random.shuffle(queue)


@dataclass
class PrefillPlan:
    """Requests picked for one prefill batch and how many tokens each prefills now."""

    reqs: List[Req] = field(default_factory=list)
    extend_lens: List[int] = field(default_factory=list)
    chunked: Optional[Req] = None  # a request that prefills only part of its prompt in this batch


class PrefillPlanner:
    def __init__(self, memory: ReqMemory, queues: RequestQueues, encoder_admission: Optional[Any], *,
                 chunked_prefill_size: int, max_prefill_tokens: int, schedule_policy: str, conservativeness: float):
        self.memory, self.queues = memory, queues
        # multimodal: limits the images one prefill batch encodes to the planned encoder reservation
        self.encoder_admission = encoder_admission
        self.chunked_prefill_size, self.max_prefill_tokens = chunked_prefill_size, max_prefill_tokens
        self.schedule_policy = schedule_policy
        self.new_token_ratio = NewTokenRatio(conservativeness)
        self.clip_max_new_tokens = clip_max_new_tokens()
        alloc = memory.allocator
        # the most a request holds at once on a windowed-only model (module docstring); None: no cap
        self.request_pool_cap = (window_tokens_per_slot(alloc.window_tokens, memory.page_size) + chunked_prefill_size
                                 if getattr(alloc, "windowed_only", False) and alloc.window_tokens else None)
        self.total_prompt_tokens = self.total_cached_tokens = 0

    def _admit_encoder(self, req: Req, start: int, n: int, must_progress: bool) -> int:
        """Cut n so the images this chunk must encode fit the encoder reservation (0: wait for the next batch)."""
        if self.encoder_admission is None or req.mm_inputs is None:
            return n
        return self.encoder_admission.admit(req.mm_inputs, start, n, self.memory.page_size, must_progress)

    def _capped(self, tokens: int) -> int:
        return tokens if self.request_pool_cap is None else min(tokens, self.request_pool_cap)

    def end_batch(self) -> None:
        """Nothing is held between batches: the encoder reservation is free again."""
        if self.encoder_admission is not None:
            self.encoder_admission.end_batch()

    def schedule(self, running_limit: int) -> PrefillPlan:
        plan = PrefillPlan()
        self.end_batch()
        queues = self.queues
        if not queues.waiting and queues.chunked is None:
            return plan
        mem = self.memory
        ratio = self.new_token_ratio.value
        evictable = mem.evictable_tokens()
        free = mem.allocator.available_size()
        rem_total = free + evictable - sum(self._capped(reserved_tokens(r, ratio, self.clip_max_new_tokens))
                                           for r in queues.running)
        rem_chunk = self.chunked_prefill_size
        rem_batch = self.max_prefill_tokens
        ps = mem.page_size

        if queues.chunked is not None:
            req = queues.chunked
            queues.in_step.append(req)
            n = self._admit_encoder(req, req.kv_len, min(req.extend_len, rem_chunk), must_progress=True)
            plan.reqs.append(req)
            plan.extend_lens.append(n)
            rem_chunk -= n
            rem_batch -= n
            rem_total -= n
            if n < req.extend_len:
                plan.chunked = req
                return self._allocate(plan)

        if self.schedule_policy != "fcfs":
            order_waiting_queue(queues.waiting, self.schedule_policy, lambda r: len(mem.match_prefix(r)[0]))
        free_slots = mem.req_to_token_pool.available_size()
        num_running = queues.num_running()
        for req in list(queues.waiting):
            if num_running + len(plan.reqs) >= running_limit or free_slots <= 0:
                break
            if rem_chunk < ps or rem_batch < ps:
                break
            queues.in_step.append(req)
            slots, node = mem.match_prefix(req)
            ext = req.fill_len - len(slots)
            cost = self._capped(ext + reserved_tokens(req, ratio, self.clip_max_new_tokens))
            nothing_else = not queues.running and not plan.reqs and queues.chunked is None
            if cost > rem_total and not (nothing_else and self._capped(ext) <= free + evictable):
                queues.in_step.pop()
                break
            n = min(ext, rem_chunk, rem_batch)
            if n < ext:
                n = n // ps * ps
            if n > 0:
                n = self._admit_encoder(req, len(slots), n, must_progress=not plan.reqs)
            if n <= 0:
                queues.in_step.pop()
                break
            queues.waiting.remove(req)
            mem.admit(req, slots, node)
            free_slots -= 1
            if req.num_retractions == 0 and not req.output_ids:
                req.cached_tokens = len(slots)
                self.total_prompt_tokens += len(req.origin_input_ids)
                self.total_cached_tokens += len(slots)
            plan.reqs.append(req)
            plan.extend_lens.append(n)
            rem_total -= cost
            rem_chunk -= n
            rem_batch -= n
            if n < ext:
                plan.chunked = req
                break
        return self._allocate(plan)

    def _allocate(self, plan: PrefillPlan) -> PrefillPlan:
        """Give each admitted request KV slots for the tokens it prefills now; requests that do not fit go back."""
        queues = self.queues
        kept = PrefillPlan(chunked=plan.chunked)
        for req, n in zip(plan.reqs, plan.extend_lens):
            if self.memory.alloc(req, n) is None:
                self.memory.release(req, cache=False)
                if req is queues.chunked:
                    queues.chunked = None
                queues.waiting.insert(0, req)
                queues.in_step.remove(req)
                if kept.chunked is req:
                    kept.chunked = None
                continue
            kept.reqs.append(req)
            kept.extend_lens.append(n)
        queues.chunked = kept.chunked
        return kept
