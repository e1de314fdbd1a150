"""Running one prefill (extend) or decode batch: build the ForwardBatch, forward, sample, commit — with faults
confined to the requests they concern (policy in fault_confinement.py).

A batch is a list of units; each attempt is forward + sample, and only when both succeed does it commit
(kv_len += n, then each request's new token is appended and detokenized, one request at a time).
With the overlap schedule (overlap_worker.py) the batch is built here, its forward + sample run on the forward
thread while the scheduler thread decodes the previous step's text; a request that text finished is no longer
alive at commit and its token is dropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, List, Optional, Tuple

import torch

from sglang.srt.constrained.scheduler_hooks import fill_ahead
from sglang.srt.managers.decode_memory import ensure_decode_memory, retract_for_oom
from sglang.srt.managers.fault_confinement import StepFault, fault_message, is_oom, step_phase
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.schedule_policy import PrefillPlan
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.sampling.sampler import SampleOutput, sample

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import Scheduler

ExtendUnit = Tuple[Req, int]  # a request and how many of its tokens this forward computes, from kv_len on


def _inject(sched: "Scheduler", step: str, reqs: List[Req]) -> None:
    if sched.faults is not None:
        sched.faults.check(step, [r.rid for r in reqs], sched.forward_ct)


def _halves(items: list) -> Tuple[list, list]:
    mid = len(items) // 2
    return items[:mid], items[mid:]


def grammar_bitmask(sched: "Scheduler"):
    """The preallocated token bitmask of structured output (None when the grammar backend is off)."""
    return sched.grammar_backend.bitmask if sched.grammar_backend is not None else None


def _alive(req: Req) -> bool:
    return req.req_pool_idx is not None and not req.finished()


def _attempt(sched: "Scheduler", job: Callable[[], SampleOutput]) -> SampleOutput:
    """Forward + sample of a built batch: here, or on the forward thread overlapped with the previous text."""
    return job() if sched.overlap is None else sched.overlap.run(job)


# ====================================================================== commit
def _commit_token(sched: "Scheduler", req: Req, out: SampleOutput, row: int) -> None:
    """Append the sampled token; a fault while detokenizing fails this request only."""
    if not _alive(req):  # finished by the overlapped text of the previous step: this token is dropped
        if sched.overlap is not None:
            sched.overlap.num_dropped_tokens += 1
        return
    try:
        with step_phase("detokenize"):
            _inject(sched, "detokenize", [req])
            sched.append_token(req, out, row)
    except StepFault as f:
        sched.on_fault(f"Request {req.rid} failed in the detokenize step", f.cause)
        sched.fail(req, fault_message(f.step, f.cause))
        return
    if req.finished():
        sched.finish(req)


# ====================================================================== extend
def _build_extend(sched: "Scheduler", units: List[ExtendUnit]) -> ForwardBatch:
    reqs = [r for r, _ in units]
    lens = [n for _, n in units]
    input_ids: List[int] = []
    positions: List[int] = []
    out_loc: List[torch.Tensor] = []
    prefix_lens = [r.kv_len for r in reqs]
    seq_lens = [r.kv_len + n for r, n in units]
    pool = sched.memory.req_to_token_pool
    for r, n in units:
        input_ids.extend(r.fill_ids[r.kv_len : r.kv_len + n])
        positions.extend(range(r.kv_len, r.kv_len + n))
        out_loc.append(pool.slots(r.req_pool_idx, r.kv_len, r.kv_len + n))  # host rows: no device read
    return ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        batch_size=len(reqs),
        input_ids=torch.tensor(input_ids, dtype=torch.int64),
        positions=torch.tensor(positions, dtype=torch.int64),
        req_pool_indices=torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
        out_cache_loc=torch.cat(out_loc),
        seq_lens_cpu=seq_lens,
        req_pool_indices_cpu=[r.req_pool_idx for r in reqs],
        extend_prefix_lens_cpu=prefix_lens,
        extend_seq_lens_cpu=list(lens),
        extend_prefix_lens=torch.tensor(prefix_lens, dtype=torch.int64),
        extend_seq_lens=torch.tensor(lens, dtype=torch.int64),
        logits_indices=torch.tensor(lens).cumsum(0) - 1,
        mm_inputs=[r.mm_inputs for r in reqs] if any(r.mm_inputs is not None for r in reqs) else None,
    )


def _extend_confined(sched: "Scheduler", units: List[ExtendUnit]) -> None:
    if not units:
        return
    reqs = [r for r, _ in units]
    done = [i for i, (r, n) in enumerate(units) if r.kv_len + n == r.fill_len]
    done_reqs = [reqs[i] for i in done]
    bitmask = grammar_bitmask(sched)

    def job() -> Optional[SampleOutput]:
        with step_phase("prefill"):
            _inject(sched, "prefill", reqs)
            logits = sched.model_runner.forward(fb)
        if not done:
            return None
        with step_phase("sample"):
            _inject(sched, "sample", done_reqs)
            return sample(logits[done], done_reqs, bitmask)

    try:
        with step_phase("prefill"):
            fb = _build_extend(sched, units)
        out = _attempt(sched, job)
    except StepFault as f:
        _recover_extend(sched, [(r, n) for r, n in units if _alive(r)], f)
        return
    for r, n in units:
        if _alive(r):  # not finished by the overlapped text of the previous step
            r.kv_len += n
    for j, i in enumerate(done):
        _commit_token(sched, units[i][0], out, j)


def _recover_extend(sched: "Scheduler", units: List[ExtendUnit], f: StepFault) -> None:
    if not units:
        return
    rids = [r.rid for r, _ in units]
    if len(units) > 1:
        what = "out of memory" if is_oom(f.cause) else "failed"
        sched.on_fault(f"Prefill batch of {len(units)} requests {what} in the {f.step} step; retrying it in halves", f.cause)
        for half in _halves(units):
            _extend_confined(sched, [(r, n) for r, n in half if _alive(r)])
        return
    req, n = units[0]
    half = n // 2 // sched.page_size * sched.page_size
    if is_oom(f.cause) and half > 0:
        sched.on_fault(f"Prefill of {n} tokens of request {rids[0]} ran out of memory; halving the chunk", f.cause)
        _extend_confined(sched, [(req, half)])
        if _alive(req):
            _extend_confined(sched, [(req, n - half)])
        return
    sched.on_fault(f"Request {req.rid} failed in the {f.step} step", f.cause)
    sched.fail(req, fault_message(f.step, f.cause))


def run_extend(sched: "Scheduler", plan: PrefillPlan) -> None:
    _extend_confined(sched, list(zip(plan.reqs, plan.extend_lens)))
    if sched.encoder_admission is not None:
        sched.encoder_admission.end_batch()
    for r in plan.reqs:
        # a live request with more to prefill stays sched.chunked_req (set by the prefill scheduler)
        if _alive(r) and r is not sched.chunked_req:
            sched.running.append(r)
    sched.forward_ct += 1


# ====================================================================== decode
def _build_decode(sched: "Scheduler", reqs: List[Req]) -> ForwardBatch:
    r2t = sched.memory.req_to_token_pool.req_to_token_host  # host rows: no device read
    rows = torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64)
    positions = torch.tensor([r.kv_len for r in reqs], dtype=torch.int64)
    seq_lens = [r.kv_len + 1 for r in reqs]
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=len(reqs),
        input_ids=torch.tensor([r.output_ids[-1] for r in reqs], dtype=torch.int64),
        positions=positions,
        req_pool_indices=rows,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
        out_cache_loc=r2t[rows, positions],
        seq_lens_cpu=seq_lens,
        req_pool_indices_cpu=rows.tolist(),
        mm_inputs=None,
    )


def _decode_confined(sched: "Scheduler", reqs: List[Req]) -> None:
    if not reqs:
        return
    bitmask = grammar_bitmask(sched)

    def job() -> SampleOutput:
        with step_phase("decode"):
            _inject(sched, "decode", reqs)
            logits = sched.model_runner.forward(fb)
        with step_phase("sample"):
            _inject(sched, "sample", reqs)
            return sample(logits, reqs, bitmask)

    try:
        with step_phase("decode"):
            fb = _build_decode(sched, reqs)
            fill_ahead(sched, reqs)  # grammar bitmask rows fill on a worker thread during the forward
        out = _attempt(sched, job)
    except StepFault as f:
        reqs = [r for r in reqs if _alive(r)]  # the overlapped text may have finished some
        if not reqs:
            return
        if len(reqs) > 1 and is_oom(f.cause):
            sched.on_fault(f"Decode batch of {len(reqs)} requests ran out of memory in the {f.step} step", f.cause)
            _decode_confined(sched, retract_for_oom(sched, reqs))
        elif len(reqs) > 1:
            sched.on_fault(f"Decode batch of {len(reqs)} requests failed in the {f.step} step; retrying it in halves",
                      f.cause)
            for half in _halves(reqs):
                _decode_confined(sched, [r for r in half if _alive(r)])
        else:
            sched.on_fault(f"Request {reqs[0].rid} failed in the {f.step} step", f.cause)
            sched.fail(reqs[0], fault_message(f.step, f.cause))
        return
    for r in reqs:
        if _alive(r):  # not finished by the overlapped text of the previous step
            r.kv_len += 1
    for j, r in enumerate(reqs):
        _commit_token(sched, r, out, j)


def run_decode(sched: "Scheduler") -> None:
    sched.batch_reqs.extend(sched.running)
    ensure_decode_memory(sched)
    reqs = list(sched.running)
    if not reqs:
        return
    for r in reqs:
        slots = sched.memory.alloc(r, 1)
        assert slots is not None, "decode memory was checked"
    _decode_confined(sched, reqs)
    sched.running = [r for r in sched.running if _alive(r)]
    sched.oom_cap.on_decode_success(sched.max_running_requests)
    sched.new_token_ratio.step()
    sched.forward_ct += 1
