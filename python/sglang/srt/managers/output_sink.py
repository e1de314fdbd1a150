"""OutputSink: sampled tokens become output deltas here, and requests leave the scheduler here.

    append_token   a committed token (and its logprobs); with the overlap schedule its text half is decoded later;
                   a request whose grammar reached a dead end ends instead, as the client's error (a 400)
    finish         the request's computed tokens enter the prefix cache; its last output is queued
    fail           a fault hit the request: it finishes with a 500 abort, its memory freed without caching
    settle         after an overlapped forward: finish what the text halves stopped, fail what they faulted
Outputs accumulate in pending_outputs until the step returns them (the process loop may send some mid-step).
"""

from __future__ import annotations

from typing import List, Tuple

from sglang.srt.constrained.request_grammar import GRAMMAR_DEAD_END_STATUS
from sglang.srt.managers.fault_confinement import FAULT_STATUS_CODE, FaultPolicy, StepFault, fault_message, log_fault
from sglang.srt.managers.io_struct import ReqOutput
from sglang.srt.managers.prompt_logprob_state import PROMPT_LOGPROB_FIELDS, take_output
from sglang.srt.managers.req_memory import ReqMemory
from sglang.srt.managers.request_queues import RequestQueues
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.sampling.sampler import SampleOutput


class OutputSink:
    def __init__(self, queues: RequestQueues, memory: ReqMemory, fault_policy: FaultPolicy, stream_interval: int):
        self.queues, self.memory, self.fault_policy = queues, memory, fault_policy
        self.stream_interval = stream_interval
        # the overlap schedule (overlap_worker.py): it queues text halves, and the batch runner runs its forward while
        # a window thread decodes them; None: text is decoded at commit
        self.overlap = None
        # a finishing request, before its computed tokens enter the prefix cache: the draft's KV of the positions it
        # never saw (DraftProposer.on_finish, EagleProposer.on_finish; set by the scheduler for a server whose
        # proposer has one); None: nothing to add
        self.before_cache = None
        self.pending_outputs: List[ReqOutput] = []
        self.total_generated_tokens = self.num_failed_reqs = 0

    def take_outputs(self) -> List[ReqOutput]:
        outputs, self.pending_outputs = self.pending_outputs, []
        return outputs

    def append_token(self, req: Req, out: SampleOutput, row: int) -> None:
        """Record row `row` of a sampling result for `req` (detokenizes; may finish the request)."""
        if req.grammar is not None and req.grammar.dead_end:  # its grammar allowed no token: the row was a dummy
            self.end_dead_grammar(req)
            return
        if req.return_logprob:
            req.output_token_logprobs.append(out.token_logprobs[row])
            if out.top_logprobs is not None and out.top_logprobs[row] is not None:
                req.output_top_logprobs.append(out.top_logprobs[row])
            if out.token_ids_logprobs is not None and out.token_ids_logprobs[row] is not None:
                req.output_token_ids_logprobs.append(out.token_ids_logprobs[row])
        self.total_generated_tokens += 1
        req.append_token_id(out.next_token_ids[row])
        if self.overlap is None:
            self.decode_text(req, len(req.output_ids))
            return
        self.overlap.defer(req)  # its text is decoded while the next forward runs
        if req.finished():
            self.overlap.flush(req)  # a finished request's output needs its text now

    def end_dead_grammar(self, req: Req) -> None:
        """The request's grammar allows nothing more (request_grammar.py): it finishes as the client's error, a 400
        naming the grammar's field, with the output so far; no fault, nothing logged as one."""
        kind, text = req.sampling_params.grammar
        req.abort(str(req.grammar.dead_end_error(text)), status_code=GRAMMAR_DEAD_END_STATUS)
        req.finished_reason["param"] = kind

    def decode_text(self, req: Req, n_out: int) -> None:
        """The text half of output token n_out (detokenize, stop strings), then a streamed output if one is due."""
        req.add_token_text(n_out)
        self._maybe_stream(req)

    def flush_text(self, req: Req) -> None:
        """Before a request finishes outside a commit: decode its queued text (a fault there is logged only)."""
        if self.overlap is None:
            return
        try:
            self.overlap.flush(req)
        except Exception as e:  # noqa: BLE001 - the request is finishing anyway
            log_fault(f"Request {req.rid}: decoding its last text failed", e)

    def _maybe_stream(self, req: Req) -> None:
        if req.stream and not req.finished() and (len(req.output_ids) - req.sent_token_len) >= self.stream_interval:
            self.pending_outputs.append(self._make_output(req))

    def finish(self, req: Req) -> None:
        """A finished request: its computed tokens enter the prefix cache, its last output is queued."""
        self.flush_text(req)
        if self.before_cache is not None and req.req_pool_idx is not None and self.memory.tree_cache is not None:
            self.before_cache(req)
        self.memory.release(req, cache=True)
        if req.grammar is not None:
            req.grammar.release()
        self.queues.reqs.pop(req.rid, None)
        self.fault_policy.forget(req.rid)
        self.pending_outputs.append(self._make_output(req))

    def fail(self, req: Req, message: str) -> None:
        """A fault hit this request: it finishes with a 500 abort; its memory is freed without caching."""
        self.flush_text(req)
        self.queues.take_out(req)
        self.memory.release(req, cache=False)
        req.abort(message, status_code=FAULT_STATUS_CODE)
        self.num_failed_reqs += 1
        self.finish(req)

    def settle(self, stopped: List[Req], faulted: List[Tuple[Req, StepFault]]) -> None:
        """After an overlapped forward is joined: finish what its window's text halves stopped, fail what faulted
        (their memory is free to release now)."""
        for req in stopped:
            if req.rid in self.queues.reqs:
                self.queues.take_out(req)
                self.finish(req)
        for req, f in faulted:
            if req.rid in self.queues.reqs:
                self.fault_policy.on_fault(f"Request {req.rid} failed in the detokenize step", f.cause)
                self.fail(req, fault_message(f.step, f.cause))

    def _make_output(self, req: Req) -> ReqOutput:
        start = req.sent_token_len
        new_ids = req.output_ids[start:]
        req.sent_token_len = len(req.output_ids)
        lp = top = None
        if req.return_logprob:
            lp = req.output_token_logprobs[start:]
            top = req.output_top_logprobs[start:] if req.top_logprobs_num else None
        prompt_lp = take_output(req)
        return ReqOutput(
            rid=req.rid, new_token_ids=new_ids, new_text=req.text_delta(), finished=req.finished(),
            finish_reason=req.finished_reason, prompt_tokens=len(req.origin_input_ids),
            completion_tokens=len(req.output_ids), cached_tokens=req.cached_tokens, new_token_logprobs=lp,
            new_top_logprobs=top, embedding=req.embedding,
            new_token_ids_logprobs=req.output_token_ids_logprobs[start:] or None,
            spec_verify_ct=req.spec_verify_ct, spec_verify_tokens=req.spec_verify_tokens,
            **({} if prompt_lp is None else dict(zip(PROMPT_LOGPROB_FIELDS, prompt_lp))),
        )
