"""Memory for decoding: room for one more token per running request, retraction when there is none, and the
running-request cap that follows an out-of-memory error in a decode forward.

Retraction sends a request back to the front of the waiting queue with no memory; it re-prefills its prompt and the
tokens it already produced, and finishes with the same output. Victims go in this order: fewest output tokens
first, then the longest input.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, List, Optional

from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.schedule_policy import RETRACT_DECODE_STEPS

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import Scheduler

logger = logging.getLogger(__name__)

# After a decode OOM, the running batch stays at the size that survived; it grows by one request per this many
# decode steps without another OOM, until the configured limit is back.
OOM_CAP_GROWTH_STEPS = 16


class OomRunningCap:
    def __init__(self):
        self.value: Optional[int] = None
        self.steps_since_oom = 0

    def lower_to(self, num_reqs: int) -> None:
        self.value = max(1, num_reqs)
        self.steps_since_oom = 0

    def on_decode_success(self, configured_limit: int) -> None:
        if self.value is None:
            return
        self.steps_since_oom += 1
        if self.steps_since_oom % OOM_CAP_GROWTH_STEPS == 0:
            self.value += 1
            if self.value >= configured_limit:
                self.value = None


def _retraction_order(reqs: List[Req]) -> List[Req]:
    """Most valuable first: victims are popped from the end."""
    return sorted(reqs, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)), reverse=True)


def _take_out(sched: "Scheduler", victim: Req) -> None:
    sched.memory.release(victim, cache=False)
    victim.num_retractions += 1
    sched.running.remove(victim)


def _requeue(sched: "Scheduler", victims: List[Req]) -> None:
    """Victims (least valuable first) go back to the front of the queue, the most progressed first."""
    sched.waiting_queue[0:0] = victims[::-1]
    sched.num_retractions += len(victims)
    sched.new_token_ratio.after_retract(sched.running)


def retract_for_oom(sched: "Scheduler", batch: List[Req]) -> List[Req]:
    """A decode forward of `batch` ran out of memory: retract half of it, cap the running batch, return the rest."""
    order = _retraction_order(batch)
    keep = order[: len(order) // 2] or order[:1]
    victims = order[len(keep):][::-1]  # least valuable first
    for victim in victims:
        _take_out(sched, victim)
    _requeue(sched, victims)
    sched.oom_cap.lower_to(len(keep))
    logger.warning("Out of memory in a decode batch of %d requests: retracted %d, retrying %d; running requests "
                   "capped at %d for now", len(batch), len(victims), len(keep), sched.oom_cap.value)
    kept = set(map(id, keep))
    return [r for r in batch if id(r) in kept]


def ensure_decode_memory(sched: "Scheduler") -> None:
    """Make room for one more token per running request: evict cached prefixes, then retract requests."""
    ps = sched.page_size
    mem = sched.memory

    def shortfall_tokens() -> int:
        need = sum(mem.allocator.pages_needed(r.alloc_len, 1) for r in sched.running)
        return (need - mem.allocator.num_free_pages()) * ps

    short = shortfall_tokens()
    if short > 0 and mem.tree_cache is not None:
        mem.tree_cache.evict(short)
        short = shortfall_tokens()
    if short <= 0:
        return
    # Retract until the survivors have RETRACT_DECODE_STEPS tokens of headroom each, always keeping one.
    order = _retraction_order(sched.running)
    victims = []
    while len(order) > 1:
        victim = order.pop()
        victims.append(victim)
        _take_out(sched, victim)
        headroom = mem.allocator.available_size() - len(sched.running) * RETRACT_DECODE_STEPS
        if shortfall_tokens() <= 0 and headroom >= 0:
            break
    _requeue(sched, victims)
    if shortfall_tokens() > 0 and mem.tree_cache is not None:
        mem.tree_cache.evict(shortfall_tokens())
    if shortfall_tokens() > 0:  # one request that cannot fit even alone: validation makes this unreachable
        last = sched.running.pop()
        last.abort("The KV cache is too small for this request; lower max_new_tokens or raise the memory limit.",
                   status_code=400)
        sched.finish(last)
    logger.info("KV cache pool is full. Retract requests. #retracted_reqs: %d, #new_token_ratio: %.4f",
                len(victims), sched.new_token_ratio.value)
