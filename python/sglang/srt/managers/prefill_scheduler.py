"""Building one prefill batch: take the chunked request and waiting requests, match prefixes, allocate KV slots.

The budgets (see schedule_policy.py): remaining tokens after the running requests' reservations, the chunk size,
the batch size, request slots, the running-request limit (lowered for a while after a decode OOM), and the
encoder reservation of multimodal models. Every request this function touches is recorded in
`sched.batch_reqs` first, so a fault while preparing fails exactly those requests (fault_confinement.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.schedule_policy import PrefillPlan, order_waiting_queue, reserved_tokens

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import Scheduler


def _admit_encoder(sched: "Scheduler", req: Req, start: int, n: int, must_progress: bool) -> int:
    """Cut n so the images this chunk must encode fit the encoder reservation (0: wait for the next batch)."""
    if sched.encoder_admission is None or req.mm_inputs is None:
        return n
    return sched.encoder_admission.admit(req.mm_inputs, start, n, sched.page_size, must_progress)


def schedule_prefill(sched: "Scheduler") -> PrefillPlan:
    plan = PrefillPlan()
    if sched.encoder_admission is not None:
        sched.encoder_admission.end_batch()  # nothing is held between batches
    if not sched.waiting_queue and sched.chunked_req is None:
        return plan
    mem = sched.memory
    ratio = sched.new_token_ratio.value
    evictable = mem.evictable_tokens()
    free = mem.allocator.available_size()
    rem_total = free + evictable - sum(reserved_tokens(r, ratio) for r in sched.running)
    rem_chunk = sched.chunked_prefill_size
    rem_batch = sched.max_prefill_tokens
    ps = sched.page_size

    if sched.chunked_req is not None:
        req = sched.chunked_req
        sched.batch_reqs.append(req)
        n = _admit_encoder(sched, req, req.kv_len, min(req.extend_len, rem_chunk), must_progress=True)
        plan.reqs.append(req)
        plan.extend_lens.append(n)
        rem_chunk -= n
        rem_batch -= n
        rem_total -= n
        if n < req.extend_len:
            plan.chunked = req
            return _allocate_prefill(sched, plan)

    if sched.server_args.schedule_policy != "fcfs":
        order_waiting_queue(sched.waiting_queue, sched.server_args.schedule_policy,
                            lambda r: len(mem.match_prefix(r)[0]))
    free_slots = mem.req_to_token_pool.available_size()
    num_running = len(sched.running) + (1 if sched.chunked_req else 0)
    max_running = sched.running_limit()
    for req in list(sched.waiting_queue):
        if num_running + len(plan.reqs) >= max_running or free_slots <= 0:
            break
        if rem_chunk < ps or rem_batch < ps:
            break
        sched.batch_reqs.append(req)
        slots, node = mem.match_prefix(req)
        ext = req.fill_len - len(slots)
        cost = ext + reserved_tokens(req, ratio)
        nothing_else = not sched.running and not plan.reqs and sched.chunked_req is None
        if cost > rem_total and not (nothing_else and ext <= free + evictable):
            sched.batch_reqs.pop()
            break
        n = min(ext, rem_chunk, rem_batch)
        if n < ext:
            n = n // ps * ps
        if n > 0:
            n = _admit_encoder(sched, req, len(slots), n, must_progress=not plan.reqs)
        if n <= 0:
            sched.batch_reqs.pop()
            break
        sched.waiting_queue.remove(req)
        mem.admit(req, slots, node)
        free_slots -= 1
        if req.num_retractions == 0 and not req.output_ids:
            req.cached_tokens = len(slots)
            sched.total_prompt_tokens += len(req.origin_input_ids)
            sched.total_cached_tokens += len(slots)
        plan.reqs.append(req)
        plan.extend_lens.append(n)
        rem_total -= cost
        rem_chunk -= n
        rem_batch -= n
        if n < ext:
            plan.chunked = req
            break
    return _allocate_prefill(sched, plan)


def _allocate_prefill(sched: "Scheduler", plan: PrefillPlan) -> PrefillPlan:
    """Give each admitted request KV slots for the tokens it prefills now; requests that do not fit go back."""
    kept = PrefillPlan(chunked=plan.chunked)
    for req, n in zip(plan.reqs, plan.extend_lens):
        if sched.memory.alloc(req, n) is None:
            sched.memory.release(req, cache=False)
            if req is sched.chunked_req:
                sched.chunked_req = None
            sched.waiting_queue.insert(0, req)
            sched.batch_reqs.remove(req)
            if kept.chunked is req:
                kept.chunked = None
            continue
        kept.reqs.append(req)
        kept.extend_lens.append(n)
    sched.chunked_req = kept.chunked
    return kept
