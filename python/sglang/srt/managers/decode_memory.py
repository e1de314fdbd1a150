"""Memory for decoding: room for one more token per running request, retraction when there is none, and the
running-request cap that follows an out-of-memory error in a decode forward.

Retraction sends a request back to the front of the waiting queue with no memory; it re-prefills its prompt and the
tokens it already produced, and finishes with the same output. Victims go in this order: fewest output tokens
first, then the longest input.
"""

from __future__ import annotations

import logging
from typing import List, Optional

from sglang.srt.managers.output_sink import OutputSink
from sglang.srt.managers.req_memory import ReqMemory
from sglang.srt.managers.request_queues import RequestQueues
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.prefill_scheduler import RETRACT_DECODE_STEPS, NewTokenRatio

logger = logging.getLogger(__name__)

# After a decode OOM, the running batch stays at the size that survived; it grows by one request per this many
# decode steps without another OOM, until the configured limit is back.
OOM_CAP_GROWTH_STEPS = 16


class OomRunningCap:
    """The running-request limit: the configured one, or lower for a while after a decode ran out of memory."""

    def __init__(self, configured_limit: int):
        self.configured_limit = configured_limit
        self.value: Optional[int] = None  # the lowered limit (None: the configured one applies)
        self.steps_since_oom = 0

    def limit(self) -> int:
        return self.configured_limit if self.value is None else min(self.value, self.configured_limit)

    def lower_to(self, num_reqs: int) -> None:
        self.value = max(1, num_reqs)
        self.steps_since_oom = 0

    def on_decode_success(self) -> None:
        if self.value is None:
            return
        self.steps_since_oom += 1
        if self.steps_since_oom % OOM_CAP_GROWTH_STEPS == 0:
            self.value += 1
            if self.value >= self.configured_limit:
                self.value = None


def _retraction_order(reqs: List[Req]) -> List[Req]:
    """Most valuable first: victims are popped from the end."""
    return sorted(reqs, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)), reverse=True)


class DecodeMemory:
    """Owns the OOM running cap and the retraction count; moves the planner's new-token ratio (decay per decode
    step, a jump after a retraction)."""

    def __init__(self, memory: ReqMemory, queues: RequestQueues, sink: OutputSink, ratio: NewTokenRatio,
                 max_running_requests: int):
        self.memory, self.queues, self.sink, self.ratio = memory, queues, sink, ratio
        self.oom_cap = OomRunningCap(max_running_requests)
        self.num_retractions = 0

    def on_decode_success(self) -> None:
        self.oom_cap.on_decode_success()
        self.ratio.step()

    def _retract(self, victim: Req) -> None:
        self.memory.release(victim, cache=False)
        victim.num_retractions += 1
        self.queues.running.remove(victim)

    def _requeue(self, victims: List[Req]) -> None:
        """Victims (least valuable first) go back to the front of the queue, the most progressed first."""
        self.queues.waiting[0:0] = victims[::-1]
        self.num_retractions += len(victims)
        self.ratio.after_retract(self.queues.running)

    def retract_for_oom(self, batch: List[Req]) -> List[Req]:
        """A decode forward of `batch` ran out of memory: retract half of it, cap the running batch, return the
        rest."""
        order = _retraction_order(batch)
        keep = order[: len(order) // 2] or order[:1]
        victims = order[len(keep):][::-1]  # least valuable first
        for victim in victims:
            self._retract(victim)
        self._requeue(victims)
        self.oom_cap.lower_to(len(keep))
        logger.warning("Out of memory in a decode batch of %d requests: retracted %d, retrying %d; running requests "
                       "capped at %d for now", len(batch), len(victims), len(keep), self.oom_cap.value)
        kept = set(map(id, keep))
        return [r for r in batch if id(r) in kept]

    def _shortfall_tokens(self) -> int:
        alloc = self.memory.allocator
        need = sum(alloc.pages_needed(r.alloc_len, 1) for r in self.queues.running)
        return (need - alloc.num_allocatable_pages()) * self.memory.page_size  # windowed models: both pools

    def _evict_shortfall(self) -> None:
        if self._shortfall_tokens() > 0:  # free in every pool a page comes from (req_memory.evict_for)
            alloc = self.memory.allocator
            self.memory.evict_for(sum(alloc.pages_needed(r.alloc_len, 1) for r in self.queues.running)
                                  * self.memory.page_size)

    def make_room(self) -> None:
        """Room for one more token per running request: evict cached prefixes, then retract requests."""
        self._evict_shortfall()
        if self._shortfall_tokens() <= 0:
            return
        # Retract until the survivors have RETRACT_DECODE_STEPS tokens of headroom each, always keeping one.
        running = self.queues.running
        order = _retraction_order(running)
        victims = []
        while len(order) > 1:
            victim = order.pop()
            victims.append(victim)
            self._retract(victim)
            headroom = self.memory.allocator.available_size() - len(running) * RETRACT_DECODE_STEPS
            if self._shortfall_tokens() <= 0 and headroom >= 0:
                break
        self._requeue(victims)
        self._evict_shortfall()
        if self._shortfall_tokens() > 0:  # one request that cannot fit even alone: validation makes this unreachable
            last = running.pop()
            last.abort("The KV cache is too small for this request; lower max_new_tokens or raise the memory limit.",
                       status_code=400)
            self.sink.finish(last)
        logger.info("KV cache pool is full. Retract requests. #retracted_reqs: %d, #new_token_ratio: %.4f",
                    len(victims), self.ratio.value)
