"""Scheduler: continuous batching over the paged KV pool, composed of parts that each own their state.

One step (Scheduler.step, under torch.inference_mode: the sampler updates the logits the model returned in place):
prefill the waiting requests the planner admits (prefix-cache hits skip recomputation, long prompts are chunked,
room for future decode tokens is reserved); otherwise decode every running request by one token, after evicting
cached prefixes and then retracting requests if the pool runs short (they re-prefill and finish the same).
The parts, and what each owns (dependencies are constructor arguments; none sees the Scheduler):
    ReqMemory        req_memory.py          KV slots and request rows of requests, the prefix cache, repairs
    RequestQueues    request_queues.py      reqs, waiting, running, the chunked request
    FaultPolicy      fault_confinement.py   the fault count and the test-only fault injector
    OutputSink       output_sink.py         outputs not yet returned; finishing and failing requests
    GrammarGate      constrained/scheduler_hooks.py  the grammar backend: requests waiting for a compile
    PrefillPlanner   prefill_scheduler.py   admission budgets, the new-token ratio, encoder admission
    DecodeMemory     decode_memory.py       the OOM running cap, retraction
    BatchRunner      batch_runner.py        forward, sampling and commit of one batch; the forward count
    SpecDecoder      spec_decode.py         --speculative-algorithm: proposals, the verify step, acceptance counters
    OverlapSchedule  overlap_worker.py      text halves decoded while the next forward runs (None when off)
A fault in a step fails only the requests it concerns and the scheduler keeps serving (fault_confinement.py); faults
can be injected for tests (fault_injection.py).
The scheduler runs in-process for the offline Engine and in its own process behind ZMQ for the HTTP server
(scheduler_process.py); its public surface is add_request / abort_request / step / flush_cache / get_server_info /
get_stats / check_integrity.
"""

from __future__ import annotations

import logging
import weakref
from typing import List, Tuple

import torch

from sglang.srt.constrained.scheduler_hooks import GrammarGate, build_backend
from sglang.srt.managers import prompt_logprob_state
from sglang.srt.managers.batch_runner import BatchRunner
from sglang.srt.managers.decode_log import DecodeLog
from sglang.srt.managers.decode_memory import DecodeMemory
from sglang.srt.managers.fault_confinement import FATAL_ERRORS, FaultPolicy
from sglang.srt.managers.fault_injection import FaultInjector
from sglang.srt.managers.io_struct import ReqOutput, TokenizedGenerateReqInput, new_rid
from sglang.srt.managers.output_sink import OutputSink
from sglang.srt.managers.spec_decode import SpecDecoder, check_spec_model
from sglang.srt.managers.overlap_worker import OverlapSchedule, overlap_enabled
from sglang.srt.managers.prefill_scheduler import PrefillPlanner
from sglang.srt.managers.req_memory import ReqMemory
from sglang.srt.managers.request_queues import RequestQueues
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.mem_cache.linear_state_pool import prefix_cache_off_reason
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.spec_args import check_served

logger = logging.getLogger(__name__)


def _owned(part: str, *attrs: str) -> Tuple[property, ...]:
    """Scheduler attributes that are the state of one of its parts: reads and writes go to the part."""
    return tuple(property(lambda s, a=a: getattr(getattr(s, part), a),
                          lambda s, v, a=a: setattr(getattr(s, part), a, v)) for a in attrs)


class Scheduler:
    # the parts' state under the names the process loop, the Engine and tests use
    reqs, waiting_queue, running, chunked_req = _owned("queues", "reqs", "waiting", "running", "chunked")
    req_to_token_pool, allocator, tree_cache, num_memory_repairs = _owned(
        "memory", "req_to_token_pool", "allocator", "tree_cache", "num_memory_repairs")
    faults, num_faults, on_fault = _owned("fault_policy", "faults", "num_faults", "on_fault")
    pending_outputs, overlap = _owned("sink", "pending_outputs", "overlap")  # overlap: swapped only while idle
    (grammar_backend,) = _owned("grammar", "backend")
    chunked_prefill_size, total_cached_tokens = _owned("planner", "chunked_prefill_size", "total_cached_tokens")
    oom_cap, num_retractions = _owned("decode_memory", "oom_cap", "num_retractions")

    def __init__(self, server_args: ServerArgs, model_runner=None, tokenizer=None):
        from sglang.srt.model_executor.model_runner import ModelRunner

        self.server_args = server_args
        spec = server_args.speculative()  # resolved once: refused here before the model loads
        check_served(spec)
        self.model_runner = mr = model_runner or ModelRunner(server_args)
        self.model_config = mr.model_config
        self.tokenizer_path = mr.tokenizer_path
        if tokenizer is None and not server_args.skip_tokenizer_init:
            from sglang.srt.utils.hf_transformers_utils import get_tokenizer

            from sglang.srt.configs.cache_dirs import startup_cache_dir

            tokenizer = get_tokenizer(self.tokenizer_path, startup_cache_dir(server_args))
        self.tokenizer = tokenizer
        self.device = mr.device
        allocator = mr.token_to_kv_pool_allocator
        self.page_size = server_args.page_size
        self.max_total_num_tokens = allocator.size
        self.max_running_requests = min(mr.max_running_requests, mr.req_to_token_pool.size)
        self.context_len = mr.context_len
        # a request never needs more KV than this, so it can always run once everything else is retracted
        self.max_req_len = min(self.context_len, self.max_total_num_tokens)

        self.prefix_cache_off = self._prefix_cache_off_reason()
        if self.prefix_cache_off and not server_args.disable_radix_cache:
            logger.info("%s", self.prefix_cache_off)
        tree_cache = None if self.prefix_cache_off else RadixCache(self.page_size, allocator.free)
        self.memory = ReqMemory(mr.req_to_token_pool, allocator, tree_cache, self.page_size)
        self.queues = RequestQueues()
        self.fault_policy = FaultPolicy(FaultInjector.from_env())  # no injector unless SGLANG_FAULT_INJECT is set
        self.sink = OutputSink(self.queues, self.memory, self.fault_policy, server_args.stream_interval)
        backend = build_backend(server_args, tokenizer, self.model_config, self.max_running_requests, mr)
        self.grammar = GrammarGate(backend, self.queues, self.sink)
        self.planner = PrefillPlanner(
            self.memory, self.queues, getattr(mr, "encoder_admission", None),
            chunked_prefill_size=mr.chunked_prefill_size,
            max_prefill_tokens=max(server_args.max_prefill_tokens, mr.chunked_prefill_size),
            schedule_policy=server_args.schedule_policy, conservativeness=server_args.schedule_conservativeness)
        self.decode_memory = DecodeMemory(self.memory, self.queues, self.sink, self.planner.new_token_ratio,
                                          self.max_running_requests)
        self.runner = BatchRunner(mr, self.memory, self.queues, self.sink, self.decode_memory, self.grammar,
                                  self.fault_policy)
        check_spec_model(spec, server_args, self.model_config.shape.text, self.memory.window_tokens)
        if spec is not None:
            self.runner.spec = SpecDecoder(spec, self.runner, self.max_running_requests, mr.chunked_prefill_size,
                                           self.device)
            # a draft model's KV completed before a finished request's tokens enter the prefix cache
            self.sink.before_cache = getattr(self.runner.spec.proposer, "on_finish", None)
        # overlap schedule: None when off (--disable-overlap-schedule, or the device's default)
        self.overlap = OverlapSchedule(self.sink) if overlap_enabled(server_args, self.device) else None
        if self.overlap is not None:
            weakref.finalize(self, self.overlap.shutdown)
        self.decode_log = DecodeLog(server_args.decode_log_interval, self.max_total_num_tokens)

    def _prefix_cache_off_reason(self) -> str:
        """Why this server keeps no prefix cache, or "" when it keeps one."""
        if self.server_args.disable_radix_cache:
            return "--disable-radix-cache"
        if self.server_args.is_embedding:  # mean pooling needs every prompt token's hidden state
            return "an embedding server keeps no prefix cache: its requests' KV is not needed once the vector is out"
        # linear layers: a re-admitted (retracted) request then re-prefills from position 0, rebuilding its state
        return prefix_cache_off_reason(self.model_config.shape.text)

    # ================================================================== public API
    def add_request(self, recv: TokenizedGenerateReqInput) -> None:
        """Queue a request the edge (generate_builder / RequestTokenizer) has already checked; only the invariants
        the scheduler relies on are asserted here."""
        ids = recv.input_ids
        sp = recv.sampling_params
        assert 0 < len(ids) < self.max_req_len, f"request {recv.rid}: {len(ids)} input tokens"
        assert sp.max_new_tokens is not None and len(ids) + sp.max_new_tokens <= self.max_req_len, (
            f"request {recv.rid}: {len(ids)} + {sp.max_new_tokens} tokens exceed max_req_len {self.max_req_len}")
        assert recv.rid not in self.queues.reqs, f"duplicate request id {recv.rid!r}"
        assert recv.custom_logit_processor is None or self.server_args.enable_custom_logit_processor, (
            f"request {recv.rid}: a custom_logit_processor without --enable-custom-logit-processor")
        req = Req(recv.rid, ids, sp, tokenizer=self.tokenizer, stream=recv.stream, return_logprob=recv.return_logprob,
                  top_logprobs_num=recv.top_logprobs_num, eos_token_ids=self.model_config.eos_token_ids,
                  mm_inputs=recv.mm_inputs)
        prompt_logprob_state.attach(req, recv.logprob_start_len, recv.token_ids_logprob)
        req.custom_logit_processor = recv.custom_logit_processor  # the sampler reads it (None: none)
        req.cache_salt = recv.cache_salt
        self.queues.reqs[req.rid] = req
        if sp.max_new_tokens == 0 and req.prompt_logprobs is None:  # with prompt logprobs: a prefill, no token
            req.finished_reason = {"type": "length", "length": 0}
            self.sink.finish(req)
        elif not self.grammar.hold(req):
            self.queues.waiting.append(req)

    def abort_request(self, rid: str, message: str = "Request aborted") -> None:
        req = self.queues.reqs.get(rid)
        if req is None:
            return
        self.sink.flush_text(req)
        self.queues.take_out(req)
        self.grammar.remove(req)
        req.abort(message)
        self.sink.finish(req)

    def has_work(self) -> bool:
        return bool(self.queues.busy() or self.sink.pending_outputs or len(self.grammar)
                    or (self.overlap is not None and self.overlap.num_pending()))

    def step(self) -> List[ReqOutput]:
        """Run one prefill or decode batch; return output deltas of the requests that advanced or finished.

        Faults fail the requests they concern (their outputs are in the return value); only FATAL_ERRORS
        (SchedulerStateCorrupt, TpRankFailure) leave this method."""
        faults_before = self.fault_policy.num_faults
        self.queues.in_step = []
        self.grammar.admit_compiled()  # requests whose grammar compiled join the waiting queue
        with torch.inference_mode():
            try:
                self._schedule_and_run()
            except FATAL_ERRORS:
                raise
            except Exception as e:  # noqa: BLE001 - a fault outside a confined forward/sample/detokenize
                involved = [r for r in self.queues.in_step if r.rid in self.queues.reqs]
                self.fault_policy.on_fault(
                    f"Scheduler step failed while preparing a batch; failing {len(involved)} request(s)", e)
                for r in involved:
                    self.sink.fail(r, f"The scheduler failed while preparing this request's batch: "
                                      f"{type(e).__name__}: {e}")
        if self.fault_policy.num_faults != faults_before:
            self.memory.repair(self.queues.memory_holders())
        return self.sink.take_outputs()

    def _schedule_and_run(self) -> None:
        """Prefill what the planner admits; with nothing to admit, decode every running request by one token."""
        forward_ct_before = self.runner.forward_ct
        plan = self.planner.schedule(self.decode_memory.oom_cap.limit())
        if plan.reqs:
            self.runner.run_extend(plan)
            self.planner.end_batch()
        elif self.queues.running:
            self.queues.in_step.extend(self.queues.running)
            self.decode_log.begin_step(self.sink.total_generated_tokens, lambda: (
                self.queues.num_running(), self.memory.used_tokens(), len(self.queues.waiting)))
            self.decode_memory.make_room()  # evict cached prefixes, then retract, until each has room for a token
            if self.runner.run_decode():
                self.decode_memory.on_decode_success()
            self.decode_log.end_step(self.sink.total_generated_tokens)
        if self.overlap is not None and self.runner.forward_ct == forward_ct_before:
            self.overlap.drain_now()  # no forward to overlap the previous step's text with

    def warmup(self, num_tokens: int = 8, batch_size: int = 4, max_new_tokens: int = 4) -> None:
        """Run a few tiny requests through prefill and decode so the first real request does not pay for kernel
        setup (oneDNN primitives, allocator growth); leaves the pools and the prefix cache as they were. 4 x 8 tokens
        already take the prefill GEMM path (more than 8 rows) and batch-4 decode the GEMV path; more tokens only add
        compute to the ready time."""
        from sglang.srt.sampling.sampling_params import SamplingParams

        vocab = self.model_config.vocab_size
        self.decode_log.muted = True  # warmup steps are not traffic
        n = max(1, min(num_tokens, self.max_req_len - max_new_tokens - 1))
        for b in range(min(batch_size, self.max_running_requests)):
            sp = SamplingParams.from_dict({"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True})
            ids = [(7 * b + 13 * i) % vocab for i in range(n)]
            self.add_request(TokenizedGenerateReqInput(new_rid(), None, ids, sp))
        while self.has_work():
            self.step()
        self.flush_cache()
        self.planner.total_prompt_tokens = self.planner.total_cached_tokens = self.sink.total_generated_tokens = 0
        self.planner.new_token_ratio.reset()
        self.decode_log.reset()
        self.decode_log.muted = False

    def flush_cache(self) -> bool:
        """Drop the prefix cache. Only allowed when idle (cached slots may be locked by running requests)."""
        if self.queues.busy():
            return False
        self.memory.flush()
        return True

    def check_integrity(self) -> None:
        """free + held by requests + cached == total, for KV pages and for request slots (AssertionError if not)."""
        self.memory.check_integrity(self.queues.memory_holders())

    def get_stats(self) -> dict:
        used = self.memory.used_tokens()
        return {
            "num_running_reqs": self.queues.num_running(),
            "num_waiting_reqs": len(self.waiting_queue),
            "num_used_tokens": used,
            "token_usage": used / self.max_total_num_tokens,
            "num_free_tokens": self.allocator.available_size(),
            "num_cached_tokens": self.tree_cache.total_size() if self.tree_cache else 0,
            "new_token_ratio": self.planner.new_token_ratio.value,
            "num_retractions": self.num_retractions,
            "total_prompt_tokens": self.planner.total_prompt_tokens,
            "total_cached_tokens": self.planner.total_cached_tokens,
            "total_generated_tokens": self.sink.total_generated_tokens,
            "num_faults": self.num_faults,
            "num_failed_reqs": self.sink.num_failed_reqs,
            "num_memory_repairs": self.num_memory_repairs,
            **self.grammar.stats(),
            **self._spec_stats(),
        }

    def _spec_stats(self) -> dict:
        if self.runner.spec is None:
            return {}
        return {f"spec_{name}": n for name, n in self.runner.spec.counters.totals().items()}

    def get_server_info(self) -> dict:
        plan = getattr(self.model_runner, "memory_plan", None)
        return {
            "model_path": self.model_runner.model_path,
            "tokenizer_path": self.tokenizer_path,
            "context_len": self.context_len,
            "vocab_size": self.model_config.vocab_size,
            "hidden_size": self.model_config.hidden_size,
            "max_total_num_tokens": self.max_total_num_tokens,
            "max_running_requests": self.max_running_requests,
            "max_req_len": self.max_req_len,
            "max_req_input_len": self.max_req_len - 1,
            "chunked_prefill_size": self.chunked_prefill_size,
            "max_prefill_tokens": self.planner.max_prefill_tokens,
            "page_size": self.page_size,
            "device": self.device,
            "dtype": str(self.model_runner.dtype).replace("torch.", ""),
            "cpu_isa": getattr(self.model_runner, "cpu_isa", None),
            "cpu_kernels": getattr(self.model_runner, "cpu_kernels", None),
            "cpu_threads": getattr(self.model_runner, "cpu_threads", None) and self.model_runner.cpu_threads.to_dict(),
            "quantization": getattr(self.model_runner, "quantization", None),
            "attention_backend": getattr(self.model_runner, "attention_backend_choice", None) and
            self.model_runner.attention_backend_choice.to_dict(),
            "cuda_graphs": self.model_runner.cuda_graph_info(),
            "overlap_schedule": self.overlap is not None,
            "prefix_cache": {"enabled": self.tree_cache is not None, "reason": self.prefix_cache_off or None},
            "memory_plan": plan.to_dict() if plan is not None else None,
            "kv_cache": self.model_runner.kv_cache_info() if plan is not None else None,
            "tp_size": self.server_args.tp_size,
            # what each TP rank measured and allocated under the (shared, per-rank) plan above
            "memory_plan_per_rank": getattr(self.model_runner, "rank_memory", None),
            "speculative": None if self.runner.spec is None else {**self.runner.spec.cfg.to_dict(),
                                                                  **self.runner.spec.counters.to_dict()},
            "stats": self.get_stats(),
        }
