"""Running one prefill (extend) or decode batch: build the ForwardBatch, forward, sample, commit — with faults
confined to the requests they concern (policy in fault_confinement.py).

A batch is a list of units; each attempt is forward + sample, and only when both succeed does it commit
(kv_len += n, then each request's new token is appended and detokenized, one request at a time).
With the overlap schedule (overlap_worker.py) the batch is built here and its forward + sample run while the window
thread decodes the previous step's text; a request that text finished is no longer alive at commit and its token
is dropped.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch

from sglang.srt.constrained.scheduler_hooks import GrammarGate
from sglang.srt.managers.decode_memory import DecodeMemory
from sglang.srt.managers.embedding_output import commit_pooled
from sglang.srt.managers.fault_confinement import (
    FATAL_ERRORS,
    FaultPolicy,
    StepFault,
    fault_message,
    is_oom,
    step_phase,
)
from sglang.srt.managers.output_sink import OutputSink
from sglang.srt.managers.req_memory import ReqMemory
from sglang.srt.managers.request_queues import RequestQueues
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.prefill_scheduler import PrefillPlan
from sglang.srt.managers.prompt_logprob_state import build_spec, record_results
from sglang.srt.mem_plan.sizes import prompt_logprob_block_rows
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.sampling.sampler import SampleOutput, argmax_only, greedy_output, sample

Unit = Tuple[Req, int]  # a request and how many of its tokens this forward computes from kv_len on (decode: 1)


def _int64(values: List[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def _alive(req: Req) -> bool:
    return req.req_pool_idx is not None and not req.finished()


class BatchRunner:
    """Owns the forward count (the fault injector's batch number)."""

    def __init__(self, model_runner: Any, memory: ReqMemory, queues: RequestQueues, sink: OutputSink,
                 decode_memory: DecodeMemory, grammar: GrammarGate, fault_policy: FaultPolicy):
        self.model_runner, self.memory, self.queues, self.sink = model_runner, memory, queues, sink
        self.decode_memory, self.grammar, self.fault_policy = decode_memory, grammar, fault_policy
        self.forward_ct = 0
        self.spec = None  # the speculative decode step (spec_decode.SpecDecoder) of a server with a SpecConfig

    def _run_confined(self, units: List[Unit], decode: bool) -> None:
        """Forward, sample and commit `units` (a decode unit is one token); a fault is confined to its requests."""
        if not units:
            return
        reqs = [r for r, _ in units]
        done = [i for i, (r, n) in enumerate(units) if r.kv_len + n == r.fill_len]  # these sample a token
        # a prompt-logprob request with max_new_tokens 0 ends with its prefill, sampling nothing
        prefill_only = [reqs[i] for i in done if reqs[i].remaining_new_tokens() <= 0]
        done = [i for i in done if reqs[i].remaining_new_tokens() > 0]
        done_reqs = [reqs[i] for i in done]
        phase = "decode" if decode else "prefill"
        bitmask, inject, overlap = self.grammar.bitmask, self.fault_policy.inject, self.sink.overlap

        def job() -> Optional[SampleOutput]:
            with step_phase(phase):
                inject(phase, reqs, self.forward_ct)
                logits = self.model_runner.forward(fb)
            if fb.pooling is not None:  # an embedding server: pooled rows, nothing is sampled
                return logits
            if not done:
                return None
            with step_phase("sample"):
                inject("sample", done_reqs, self.forward_ct)
                rows = logits if decode else logits[done]  # an extend's rows of requests sampled now (not a chunk's)
                if fb.greedy_fused:  # the lm_head chose the greedy tokens (logits_processor.py): `rows` are their ids
                    return greedy_output(rows, done_reqs)
                return sample(rows, done_reqs, bitmask)

        try:
            with step_phase(phase):
                fb = self._build_decode(reqs) if decode else self._build_extend(units)
                fb.greedy_only = self._greedy_only(done_reqs, reqs)
                if decode:
                    self.grammar.fill_ahead(reqs)  # grammar bitmask rows fill on a worker thread during the forward
            # with the overlap schedule, the text halves the sink deferred are decoded while this runs
            out = job() if overlap is None else overlap.run(job)
        except StepFault as f:  # the overlapped text of the previous step may have finished some requests
            self._recover([(r, n) for r, n in units if _alive(r)], decode, f)
            return
        if not decode and fb.prompt_logprob_rows is not None:
            assert fb.prompt_logprob_result is not None, "the model's forward did not score the prompt-logprob rows"
            record_results(fb.prompt_logprob_owners, fb.prompt_logprob_result)
        for r, n in units:
            if _alive(r):  # not finished by the overlapped text of the previous step
                r.kv_len += n
        if fb.pooling is not None:
            commit_pooled(units, out, fb.pooling, self.sink)
            return
        for j, i in enumerate(done):
            self._commit_token(units[i][0], out, j)
        for r in prefill_only:
            if _alive(r):
                r.finished_reason = {"type": "length", "length": 0}
                self.sink.finish(r)

    def _greedy_only(self, sampled: List[Req], reqs: List[Req]) -> bool:
        """ForwardBatch.greedy_only: the forward may return the greedy token ids of the batch's logits rows instead of
        the logits. Decode and extend alike: sample() is the argmax of the raw logits for the requests sampled now
        (argmax_only; an extend's chunk is not sampled, its row's id is dropped as its logits were), no speculative
        server (its steps read the target's logits and features), and no request of the batch asks for logprobs, one
        not sampled now included (a chunk or a prefill-only request scoring its prompt: those rows are scored before
        the logits rows are picked, but a batch returning logprobs keeps the one path they are checked on). An
        embedding server's forward pools before this is read (logits_processor.py)."""
        return self.spec is None and argmax_only(sampled) and not any(r.return_logprob for r in reqs)

    def _commit_token(self, req: Req, out: SampleOutput, row: int) -> None:
        """Append the sampled token; a fault while detokenizing fails this request only."""
        if not _alive(req):  # finished by the overlapped text of the previous step: this token is dropped
            if self.sink.overlap is not None:
                self.sink.overlap.num_dropped_tokens += 1
            return
        # step_phase("detokenize") spelled out: this runs once per token, a context manager costs more than the rest
        try:
            if self.fault_policy.faults is not None:
                self.fault_policy.inject("detokenize", [req], self.forward_ct)
            self.sink.append_token(req, out, row)
        except FATAL_ERRORS:
            raise
        except Exception as e:  # noqa: BLE001 - a fault while detokenizing fails this request only
            f = e if isinstance(e, StepFault) else StepFault("detokenize", e)
            self.fault_policy.on_fault(f"Request {req.rid} failed in the detokenize step", f.cause)
            self.sink.fail(req, fault_message(f.step, f.cause))
            return
        if req.finished():
            self.sink.finish(req)

    def _recover(self, units: List[Unit], decode: bool, f: StepFault) -> None:
        """A decode OOM retracts half the batch; other faults of a batch retry it in halves; a lone prefill that ran
        out of memory halves its chunk; a lone request that still fails, fails."""
        if not units:
            return
        on_fault, oom = self.fault_policy.on_fault, is_oom(f.cause)
        req, n = units[0]
        half = n // 2 // self.memory.page_size * self.memory.page_size  # a lone prefill's chunk, halved
        if len(units) > 1 and decode and oom:
            on_fault(f"Decode batch of {len(units)} requests ran out of memory in the {f.step} step", f.cause)
            self._run_confined([(r, 1) for r in self.decode_memory.retract_for_oom([r for r, _ in units])], decode)
        elif len(units) > 1:
            on_fault(f"{'Decode' if decode else 'Prefill'} batch of {len(units)} requests "
                     f"{'out of memory' if oom else 'failed'} in the {f.step} step; retrying it in halves", f.cause)
            mid = len(units) // 2
            for part in (units[:mid], units[mid:]):
                self._run_confined([(r, n) for r, n in part if _alive(r)], decode)
        elif oom and half > 0:
            on_fault(f"Prefill of {n} tokens of request {req.rid} ran out of memory; halving the chunk", f.cause)
            self._run_confined([(req, half)], decode)
            if _alive(req):
                self._run_confined([(req, n - half)], decode)
        else:
            on_fault(f"Request {req.rid} failed in the {f.step} step", f.cause)
            self.sink.fail(req, fault_message(f.step, f.cause))

    # ================================================================== extend
    def _build_extend(self, units: List[Unit]) -> ForwardBatch:
        reqs = [r for r, _ in units]
        lens = [n for _, n in units]
        rows = [r.req_pool_idx for r in reqs]
        prefix_lens = [r.kv_len for r in reqs]
        seq_lens = [r.kv_len + n for r, n in units]
        input_ids: List[int] = []
        positions: List[int] = []
        out_loc: List[torch.Tensor] = []
        pool = self.memory.req_to_token_pool
        for r, n in units:
            input_ids.extend(r.fill_ids[r.kv_len : r.kv_len + n])
            positions.extend(range(r.kv_len, r.kv_len + n))
            out_loc.append(pool.slots(r.req_pool_idx, r.kv_len, r.kv_len + n))  # host rows: no device read
        # M-RoPE requests: (t, h, w) positions of the chunk from the prompt's table (a chunk, or the rest after a
        # cached prefix, starts anywhere in it), then i + delta; other requests repeat their 1-D position
        mrope = None
        if any(r.uses_mrope for r in reqs):
            mrope = torch.cat([r.mm_inputs.positions_3d(r.kv_len, r.kv_len + n) if r.uses_mrope
                               else _int64(list(range(r.kv_len, r.kv_len + n))).expand(3, -1) for r, n in units], 1)
        lp_rows, lp_spec, lp_owners = build_spec(units)
        fb = ForwardBatch(
            ForwardMode.EXTEND, len(reqs), input_ids=_int64(input_ids), positions=_int64(positions),
            mrope_positions=mrope,
            req_pool_indices=_int64(rows), seq_lens=_int64(seq_lens), out_cache_loc=torch.cat(out_loc),
            seq_lens_cpu=seq_lens, req_pool_indices_cpu=rows, extend_prefix_lens_cpu=prefix_lens,
            extend_seq_lens_cpu=lens, extend_prefix_lens=_int64(prefix_lens), extend_seq_lens=_int64(lens),
            logits_indices=torch.tensor(lens).cumsum(0) - 1,
            mm_inputs=[r.mm_inputs for r in reqs] if any(r.mm_inputs is not None for r in reqs) else None,
            pooling=getattr(self.model_runner, "pooling", None),
        )
        if lp_spec is not None:  # prompt logprobs, projected a request-slot count of rows at a time
            fb.prompt_logprob_rows, fb.prompt_logprob_spec = _int64(lp_rows), lp_spec
            fb.prompt_logprob_block_rows = prompt_logprob_block_rows(self.memory.req_to_token_pool.size)
            fb.prompt_logprob_owners = lp_owners
        return fb

    def run_extend(self, plan: PrefillPlan) -> None:
        self._run_confined(list(zip(plan.reqs, plan.extend_lens)), decode=False)
        self.memory.free_out_of_window(r for r in plan.reqs if _alive(r))  # windowed layers: pages the window left
        if self.spec is not None:
            self.spec.on_extend(list(zip(plan.reqs, plan.extend_lens)))
        for r in plan.reqs:
            # a live request with more to prefill stays queues.chunked (set by the prefill planner)
            if _alive(r) and r is not self.queues.chunked:
                self.queues.running.append(r)
        self.forward_ct += 1

    # ================================================================== decode
    def _build_decode(self, reqs: List[Req]) -> ForwardBatch:
        r2t = self.memory.req_to_token_pool.req_to_token_host  # host rows: no device read
        rows = _int64([r.req_pool_idx for r in reqs])
        cols = _int64([r.kv_len for r in reqs])
        # past the prompt an M-RoPE position is the same on all three axes: one rotary position, kv_len + delta
        positions = _int64([r.kv_len + r.mrope_delta for r in reqs])
        seq_lens = [r.kv_len + 1 for r in reqs]
        return ForwardBatch(
            ForwardMode.DECODE, len(reqs), input_ids=_int64([r.output_ids[-1] for r in reqs]), positions=positions,
            req_pool_indices=rows, seq_lens=_int64(seq_lens), out_cache_loc=r2t[rows, cols],
            seq_lens_cpu=seq_lens, req_pool_indices_cpu=rows.tolist(), mm_inputs=None,
        )

    def run_decode(self) -> bool:
        """Decode every running request by one token (their memory was made room for); False if none ran."""
        reqs = list(self.queues.running)
        if not reqs:
            return False
        allocated = self.memory.alloc_decode(reqs)
        assert allocated, "decode memory was checked"
        if self.spec is None or not self.spec.try_verify(reqs):  # a verify step when some request has proposals
            self._run_confined([(r, 1) for r in reqs], decode=True)
            if self.spec is not None:
                self.spec.on_decoded(reqs)
        self.queues.running = [r for r in self.queues.running if _alive(r)]
        self.memory.free_out_of_window(self.queues.running)
        self.forward_ct += 1
        return True
