"""Scheduler: continuous batching over the paged KV pool.

One step = schedule -> run -> process, all under torch.inference_mode (the sampler updates the logits the model
returned in place):
    * prefill first: admit waiting requests (prefix-cache hits skip recomputation, long prompts are chunked,
      room for future decode tokens is reserved; prefill_scheduler.py, schedule_policy.py);
    * otherwise decode every running request by one token; if the pool runs short, evict cached prefixes, then
      retract requests back to the waiting queue (they re-prefill later and finish with the same output;
      decode_memory.py).
Forward, sampling and commit live in batch_runner.py. With the overlap schedule (overlap_worker.py) a step's
forward + sampling run on a second thread while this one decodes the previous step's text (stop strings, outputs).
A fault in a step fails only the requests it concerns and the scheduler keeps serving (fault_confinement.py); faults
can be injected for tests (fault_injection.py).
The scheduler runs in-process for the offline Engine and in its own process behind ZMQ for the HTTP server
(scheduler_process.py); its public surface is add_request / abort_request / step / flush_cache / get_server_info /
get_stats / check_integrity.
"""

from __future__ import annotations

import logging
import weakref
from typing import Dict, List, Optional

import torch

from sglang.srt.constrained.scheduler_hooks import admit_compiled, build_backend, hold_for_grammar
from sglang.srt.managers.batch_runner import run_decode, run_extend
from sglang.srt.managers.decode_memory import OomRunningCap
from sglang.srt.managers.fault_confinement import (
    FAULT_STATUS_CODE,
    SchedulerStateCorrupt,
    log_fault,
)
from sglang.srt.managers.fault_injection import FaultInjector
from sglang.srt.managers.io_struct import ReqOutput, TokenizedGenerateReqInput
from sglang.srt.managers.overlap_worker import OverlapSchedule, overlap_enabled
from sglang.srt.managers.prefill_scheduler import schedule_prefill
from sglang.srt.managers.req_memory import ReqMemory
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.schedule_policy import NewTokenRatio
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.sampling.sampler import SampleOutput
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, server_args: ServerArgs, model_runner=None, tokenizer=None):
        from sglang.srt.model_executor.model_runner import ModelRunner

        self.server_args = server_args
        self.model_runner = model_runner or ModelRunner(server_args)
        mr = self.model_runner
        self.model_config = mr.model_config
        self.tokenizer_path = mr.tokenizer_path
        if tokenizer is None and not server_args.skip_tokenizer_init:
            from sglang.srt.utils.hf_transformers_utils import get_tokenizer

            from sglang.srt.model_loader.model_path import startup_cache_dir

            tokenizer = get_tokenizer(self.tokenizer_path, startup_cache_dir(server_args))
        self.tokenizer = tokenizer
        self.device = mr.device

        self.req_to_token_pool = mr.req_to_token_pool
        self.allocator = mr.token_to_kv_pool_allocator
        self.page_size = server_args.page_size
        self.max_total_num_tokens = self.allocator.size
        self.max_running_requests = min(mr.max_running_requests, self.req_to_token_pool.size)
        self.context_len = mr.context_len
        # a request never needs more KV than this, so it can always run once everything else is retracted
        self.max_req_len = min(self.context_len, self.max_total_num_tokens)
        self.chunked_prefill_size = mr.chunked_prefill_size
        self.max_prefill_tokens = max(server_args.max_prefill_tokens, self.chunked_prefill_size)
        # multimodal: limits the images one prefill batch encodes to the planned encoder reservation
        self.encoder_admission = getattr(mr, "encoder_admission", None)
        self.tree_cache: Optional[RadixCache] = (
            None if server_args.disable_radix_cache else RadixCache(self.page_size, self.allocator.free)
        )
        self.memory = ReqMemory(self.req_to_token_pool, self.allocator, self.tree_cache, self.page_size)
        self.faults = FaultInjector.from_env()  # None unless SGLANG_FAULT_INJECT is set

        self.waiting_queue: List[Req] = []
        self.running: List[Req] = []
        self.chunked_req: Optional[Req] = None
        self.reqs: Dict[str, Req] = {}  # every unfinished request by rid
        self.new_token_ratio = NewTokenRatio(server_args.schedule_conservativeness)
        self.pending_outputs: List[ReqOutput] = []
        self.batch_reqs: List[Req] = []  # requests the step in progress has taken in (failed by a stray fault)
        self.oom_cap = OomRunningCap()
        # structured output: compiled grammars, the batch bitmask, requests waiting for a compile (None: off)
        self.grammar_backend = build_backend(self)
        # overlap schedule: None when off (--disable-overlap-schedule, or the device's default)
        self.overlap: Optional[OverlapSchedule] = (
            OverlapSchedule(self) if overlap_enabled(server_args, self.device) else None)
        if self.overlap is not None:
            weakref.finalize(self, self.overlap.shutdown)

        # counters
        self.num_retractions = 0
        self.total_prompt_tokens = 0
        self.total_cached_tokens = 0
        self.total_generated_tokens = 0
        self.forward_ct = 0
        self.num_faults = 0
        self.num_failed_reqs = 0
        self.num_memory_repairs = 0  # faults whose cleanup left the free lists wrong (a bug to fix; should stay 0)

    # ================================================================== public API
    def add_request(self, recv: TokenizedGenerateReqInput) -> None:
        """Queue a request the edge (generate_builder / RequestTokenizer) has already checked; only the invariants
        the scheduler relies on are asserted here."""
        ids = recv.input_ids
        sp = recv.sampling_params
        assert 0 < len(ids) < self.max_req_len, f"request {recv.rid}: {len(ids)} input tokens"
        assert sp.max_new_tokens is not None and len(ids) + sp.max_new_tokens <= self.max_req_len, (
            f"request {recv.rid}: {len(ids)} + {sp.max_new_tokens} tokens exceed max_req_len {self.max_req_len}")
        assert recv.rid not in self.reqs, f"duplicate request id {recv.rid!r}"
        req = Req(
            recv.rid, ids, sp, tokenizer=self.tokenizer, stream=recv.stream, return_logprob=recv.return_logprob,
            top_logprobs_num=recv.top_logprobs_num, eos_token_ids=self.model_config.eos_token_ids,
            mm_inputs=recv.mm_inputs,
        )
        self.reqs[req.rid] = req
        if sp.max_new_tokens == 0:
            req.finished_reason = {"type": "length", "length": 0}
            self.finish(req)
            return
        if hold_for_grammar(self, req):
            return
        self.waiting_queue.append(req)

    def abort_request(self, rid: str, message: str = "Request aborted") -> None:
        req = self.reqs.get(rid)
        if req is None:
            return
        self._flush_text(req)
        self._take_out(req)
        req.abort(message)
        self.finish(req)

    def has_work(self) -> bool:
        return bool(self.waiting_queue or self.running or self.chunked_req or self.pending_outputs
                    or (self.grammar_backend is not None and len(self.grammar_backend))
                    or (self.overlap is not None and self.overlap.num_pending()))

    def step(self) -> List[ReqOutput]:
        """Run one prefill or decode batch; return output deltas of the requests that advanced or finished.

        Faults fail the requests they concern (their outputs are in the return value); only SchedulerStateCorrupt
        leaves this method."""
        faults_before = self.num_faults
        forward_ct_before = self.forward_ct
        self.batch_reqs = []
        admit_compiled(self)  # requests whose grammar compiled join the waiting queue
        with torch.inference_mode():
            try:
                plan = schedule_prefill(self)
                if plan.reqs:
                    run_extend(self, plan)
                elif self.running:
                    run_decode(self)
                if self.overlap is not None and self.forward_ct == forward_ct_before:
                    self.overlap.drain_now()  # no forward to overlap the previous step's text with
            except SchedulerStateCorrupt:
                raise
            except Exception as e:  # noqa: BLE001 - a fault outside a confined forward/sample/detokenize
                involved = [r for r in self.batch_reqs if r.rid in self.reqs]
                self.on_fault(f"Scheduler step failed while preparing a batch; failing {len(involved)} request(s)", e)
                for r in involved:
                    self.fail(r, f"The scheduler failed while preparing this request's batch: {type(e).__name__}: {e}")
        self.batch_reqs = []
        if self.num_faults != faults_before:
            self.repair()
        outputs, self.pending_outputs = self.pending_outputs, []
        return outputs

    def warmup(self, num_tokens: int = 8, batch_size: int = 4, max_new_tokens: int = 4) -> None:
        """Run a few tiny requests through prefill and decode so the first real request does not pay for kernel
        setup (oneDNN primitives, allocator growth); leaves the pools and the prefix cache as they were. 4 x 8 tokens
        already take the prefill GEMM path (more than 8 rows) and batch-4 decode the GEMV path; more tokens only add
        compute to the ready time."""
        from sglang.srt.managers.io_struct import new_rid
        from sglang.srt.sampling.sampling_params import SamplingParams

        vocab = self.model_config.vocab_size
        n = max(1, min(num_tokens, self.max_req_len - max_new_tokens - 1))
        for b in range(min(batch_size, self.max_running_requests)):
            sp = SamplingParams.from_dict({"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True})
            ids = [(7 * b + 13 * i) % vocab for i in range(n)]
            self.add_request(TokenizedGenerateReqInput(new_rid(), None, ids, sp))
        while self.has_work():
            self.step()
        self.flush_cache()
        self.total_prompt_tokens = self.total_cached_tokens = self.total_generated_tokens = 0
        self.new_token_ratio = NewTokenRatio(self.server_args.schedule_conservativeness)

    def flush_cache(self) -> bool:
        """Drop the prefix cache. Only allowed when idle (cached slots may be locked by running requests)."""
        if self.running or self.chunked_req or self.waiting_queue:
            return False
        self.memory.flush()
        return True

    def check_integrity(self) -> None:
        """free + held by requests + cached == total, for KV pages and for request slots (AssertionError if not)."""
        self.memory.check_integrity(self._memory_holders())

    def repair(self) -> None:
        """After a fault: check the memory invariants; rebuild the free lists if they do not hold; raise
        SchedulerStateCorrupt if even that does not restore them."""
        try:
            self.check_integrity()
            return
        except AssertionError as e:
            logger.error("Memory integrity violated after a fault (%s); rebuilding the free lists", e)
        self.num_memory_repairs += 1
        try:
            self.memory.rebuild_free_lists(self._memory_holders())
            self.check_integrity()
        except AssertionError as e:
            raise SchedulerStateCorrupt(f"memory bookkeeping could not be repaired after a fault: {e}") from e
        logger.warning("Free lists rebuilt; memory integrity restored")

    def running_limit(self) -> int:
        """Most requests that may run at once (lower for a while after a decode ran out of memory)."""
        cap = self.oom_cap.value
        return self.max_running_requests if cap is None else min(cap, self.max_running_requests)

    def get_stats(self) -> dict:
        used = self.memory.used_tokens()
        return {
            "num_running_reqs": len(self.running) + (1 if self.chunked_req else 0),
            "num_waiting_reqs": len(self.waiting_queue),
            "num_used_tokens": used,
            "token_usage": used / self.max_total_num_tokens,
            "num_free_tokens": self.allocator.available_size(),
            "num_cached_tokens": self.tree_cache.total_size() if self.tree_cache else 0,
            "new_token_ratio": self.new_token_ratio.value,
            "num_retractions": self.num_retractions,
            "total_prompt_tokens": self.total_prompt_tokens,
            "total_cached_tokens": self.total_cached_tokens,
            "total_generated_tokens": self.total_generated_tokens,
            "num_faults": self.num_faults,
            "num_failed_reqs": self.num_failed_reqs,
            "num_memory_repairs": self.num_memory_repairs,
            **(self.grammar_backend.stats() if self.grammar_backend is not None else {}),
        }

    def get_server_info(self) -> dict:
        plan = getattr(self.model_runner, "memory_plan", None)
        return {
            "model_path": self.model_runner.model_path,
            "tokenizer_path": self.tokenizer_path,
            "context_len": self.context_len,
            "vocab_size": self.model_config.vocab_size,
            "max_total_num_tokens": self.max_total_num_tokens,
            "max_running_requests": self.max_running_requests,
            "max_req_len": self.max_req_len,
            "max_req_input_len": self.max_req_len - 1,
            "chunked_prefill_size": self.chunked_prefill_size,
            "max_prefill_tokens": self.max_prefill_tokens,
            "page_size": self.page_size,
            "device": self.device,
            "dtype": str(self.model_runner.dtype).replace("torch.", ""),
            "cpu_kernels": getattr(self.model_runner, "cpu_kernels", None),
            "quantization": getattr(self.model_runner, "quantization", None),
            "attention_backend": getattr(self.model_runner, "attention_backend_choice", None) and
            self.model_runner.attention_backend_choice.to_dict(),
            "cuda_graphs": self.model_runner.cuda_graph_info(),
            "overlap_schedule": self.overlap is not None,
            "memory_plan": plan.to_dict() if plan is not None else None,
            "tp_size": self.server_args.tp_size,
            # what each TP rank measured and allocated under the (shared, per-rank) plan above
            "memory_plan_per_rank": getattr(self.model_runner, "rank_memory", None),
            "stats": self.get_stats(),
        }

    # ================================================================== bookkeeping
    def _memory_holders(self) -> List[Req]:
        holders = self.running + ([self.chunked_req] if self.chunked_req else [])
        seen, out = set(), []
        for r in holders:
            if r.req_pool_idx is not None and id(r) not in seen:
                seen.add(id(r))
                out.append(r)
        return out

    def _take_out(self, req: Req) -> None:
        """Remove an unfinished request from whichever queue holds it."""
        if req in self.waiting_queue:
            self.waiting_queue.remove(req)
        if req in self.running:
            self.running.remove(req)
        if req is self.chunked_req:
            self.chunked_req = None
        if self.grammar_backend is not None:
            self.grammar_backend.remove(req)

    def append_token(self, req: Req, out: SampleOutput, row: int) -> None:
        """Record row `row` of a sampling result for `req` (detokenizes; may finish the request)."""
        if req.return_logprob:
            req.output_token_logprobs.append(out.token_logprobs[row])
            if out.top_logprobs is not None and out.top_logprobs[row] is not None:
                req.output_top_logprobs.append(out.top_logprobs[row])
        self.total_generated_tokens += 1
        if self.overlap is None:
            req.append_token(out.next_token_ids[row])
            self._maybe_stream(req)
            return
        req.append_token_id(out.next_token_ids[row])
        self.overlap.defer(req)  # its text is decoded while the next forward runs
        if req.finished():
            self.overlap.flush(req)  # a finished request's output needs its text now

    def decode_text(self, req: Req, n_out: int) -> None:
        """The text half of output token n_out (detokenize, stop strings), then a streamed output if one is due."""
        req.add_token_text(n_out)
        self._maybe_stream(req)

    def _flush_text(self, req: Req) -> None:
        """Before a request finishes outside a commit: decode its queued text (a fault there is logged only)."""
        if self.overlap is None:
            return
        try:
            self.overlap.flush(req)
        except Exception as e:  # noqa: BLE001 - the request is finishing anyway
            log_fault(f"Request {req.rid}: decoding its last text failed", e)

    def _maybe_stream(self, req: Req) -> None:
        interval = self.server_args.stream_interval
        if req.stream and not req.finished() and (len(req.output_ids) - req.sent_token_len) >= interval:
            self.pending_outputs.append(self._make_output(req))

    def finish(self, req: Req) -> None:
        """A finished request: its computed tokens enter the prefix cache, its last output is queued."""
        self._flush_text(req)
        self.memory.release(req, cache=True)
        if req.grammar is not None:
            req.grammar.release()
        self.reqs.pop(req.rid, None)
        if self.faults is not None:
            self.faults.forget(req.rid)
        self.pending_outputs.append(self._make_output(req))

    def on_fault(self, what: str, cause: BaseException) -> None:
        """Log a fault with its traceback; the step that saw it checks (and repairs) memory afterwards."""
        log_fault(what, cause)
        self.num_faults += 1

    def fail(self, req: Req, message: str) -> None:
        """A fault hit this request: it finishes with a 500 abort; its memory is freed without caching."""
        self._flush_text(req)
        self._take_out(req)
        self.memory.release(req, cache=False)
        req.abort(message, status_code=FAULT_STATUS_CODE)
        self.num_failed_reqs += 1
        self.finish(req)

    def _make_output(self, req: Req) -> ReqOutput:
        start = req.sent_token_len
        new_ids = req.output_ids[start:]
        req.sent_token_len = len(req.output_ids)
        lp = top = None
        if req.return_logprob:
            lp = req.output_token_logprobs[start:]
            top = req.output_top_logprobs[start:] if req.top_logprobs_num else None
        return ReqOutput(
            rid=req.rid,
            new_token_ids=new_ids,
            new_text=req.text_delta(),
            finished=req.finished(),
            finish_reason=req.finished_reason,
            prompt_tokens=len(req.origin_input_ids),
            completion_tokens=len(req.output_ids),
            cached_tokens=req.cached_tokens,
            new_token_logprobs=lp,
            new_top_logprobs=top,
        )
