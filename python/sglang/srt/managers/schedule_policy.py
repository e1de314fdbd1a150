"""Admission of waiting requests into a prefill batch, and the future-token reservation it relies on.

A running request will still need up to min(remaining_new_tokens, CLIP) KV slots; we reserve that times
`new_token_ratio`, an estimate of how much of the budget requests really use. The ratio starts high, decays while
decode proceeds without trouble and jumps back up after a retraction (see Scheduler).

    rem_total_tokens = free + evictable cache - sum(reservations of running requests)
A waiting request is admitted while its uncached prompt plus its own reservation fits in rem_total_tokens,
the chunk budget (chunked_prefill_size) and the batch budget (max_prefill_tokens) allow, and request slots remain.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import List, Optional

from sglang.srt.managers.schedule_batch import Req

# Environment-free constants, named after upstream's env vars (values are upstream's defaults).
INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS
CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION


@dataclass
class NewTokenRatio:
    conservativeness: float = 1.0

    def __post_init__(self):
        self.init = min(INIT_NEW_TOKEN_RATIO * self.conservativeness, 1.0)
        self.min = min(self.init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.decay = (self.init - self.min) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.value = self.init

    def step(self) -> None:
        self.value = max(self.value - self.decay, self.min)

    def after_retract(self, running: List[Req]) -> None:
        decoded = sum(len(r.output_ids) for r in running)
        budget = sum(r.max_new_tokens for r in running)
        if budget:
            self.value = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(running)) / budget)


def reserved_tokens(req: Req, ratio: float) -> int:
    return math.ceil(min(req.remaining_new_tokens(), CLIP_MAX_NEW_TOKENS) * ratio)


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
