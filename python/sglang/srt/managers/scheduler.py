"""Scheduler: continuous batching over the paged KV pool.

One step = schedule -> run -> process:
    * prefill first: admit waiting requests (prefix-cache hits skip recomputation, long prompts are chunked,
      room for future decode tokens is reserved; see schedule_policy.py);
    * otherwise decode every running request by one token; if the pool runs short, evict cached prefixes, then
      retract requests back to the waiting queue (they re-prefill later and finish with the same output).
The scheduler runs in-process for the offline Engine and in its own process behind ZMQ for the HTTP server
(scheduler_process.py); its public surface is add_request / abort_request / step / flush_cache / get_server_info /
get_stats / check_integrity.
"""

from __future__ import annotations

import logging
from typing import Dict, List, Optional

import torch

from sglang.srt.managers.io_struct import ReqOutput, TokenizedGenerateReqInput
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.schedule_policy import (
    RETRACT_DECODE_STEPS,
    NewTokenRatio,
    PrefillPlan,
    order_waiting_queue,
    reserved_tokens,
)
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.sampling.sampler import sample
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

            tokenizer = get_tokenizer(self.tokenizer_path)
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

        self.waiting_queue: List[Req] = []
        self.running: List[Req] = []
        self.chunked_req: Optional[Req] = None
        self.reqs: Dict[str, Req] = {}  # every unfinished request by rid
        self.new_token_ratio = NewTokenRatio(server_args.schedule_conservativeness)
        self.pending_outputs: List[ReqOutput] = []

        # counters
        self.num_retractions = 0
        self.total_prompt_tokens = 0
        self.total_cached_tokens = 0
        self.total_generated_tokens = 0
        self.forward_ct = 0

    # ================================================================== public API
    def add_request(self, recv: TokenizedGenerateReqInput) -> None:
        """Queue a request, or raise ValueError with a message that says what to change."""
        ids = recv.input_ids
        sp = recv.sampling_params
        if not ids:
            raise ValueError("The prompt is empty; send at least one token of input.")
        vocab = self.model_config.vocab_size
        bad = [t for t in ids if not (0 <= t < vocab)]
        if bad:
            raise ValueError(f"input_ids contain token id {bad[0]} outside the vocabulary [0, {vocab}).")
        sp.verify(vocab_size=vocab)
        n = len(ids)
        if n >= self.max_req_len:
            raise ValueError(
                f"The input ({n} tokens) is longer than the model's maximum request length of "
                f"{self.max_req_len - 1} input tokens (context length {self.context_len}, KV pool "
                f"{self.max_total_num_tokens} tokens). Shorten the prompt."
            )
        if sp.max_new_tokens is None:
            sp.max_new_tokens = self.max_req_len - n
        elif n + sp.max_new_tokens > self.max_req_len:
            raise ValueError(
                f"Requested token count exceeds the model's maximum context length of {self.max_req_len} tokens. "
                f"You requested a total of {n + sp.max_new_tokens} tokens: {n} tokens from the input messages and "
                f"{sp.max_new_tokens} tokens for the completion. Please reduce the number of tokens in the input "
                f"messages or the completion to fit within the limit."
            )
        if recv.rid in self.reqs:
            raise ValueError(f"Duplicate request id {recv.rid!r}.")
        req = Req(
            recv.rid, ids, sp, tokenizer=self.tokenizer, stream=recv.stream, return_logprob=recv.return_logprob,
            top_logprobs_num=recv.top_logprobs_num, eos_token_ids=self.model_config.eos_token_ids,
            mm_inputs=recv.mm_inputs,
        )
        self.reqs[req.rid] = req
        if sp.max_new_tokens == 0:
            req.finished_reason = {"type": "length", "length": 0}
            self._finish(req)
            return
        self.waiting_queue.append(req)

    def abort_request(self, rid: str, message: str = "Request aborted") -> None:
        req = self.reqs.get(rid)
        if req is None:
            return
        if req in self.waiting_queue:
            self.waiting_queue.remove(req)
        elif req in self.running:
            self.running.remove(req)
        elif req is self.chunked_req:
            self.chunked_req = None
        req.abort(message)
        self._finish(req)

    def has_work(self) -> bool:
        return bool(self.waiting_queue or self.running or self.chunked_req or self.pending_outputs)

    def step(self) -> List[ReqOutput]:
        """Run one prefill or decode batch; return output deltas of the requests that advanced or finished."""
        plan = self._schedule_prefill()
        if plan.reqs:
            self._run_extend(plan)
        elif self.running:
            self._run_decode()
        outputs, self.pending_outputs = self.pending_outputs, []
        return outputs

    def warmup(self, num_tokens: int = 32, batch_size: int = 4, max_new_tokens: int = 4) -> None:
        """Run a few tiny requests through prefill and decode so the first real request does not pay for kernel
        setup (oneDNN primitives, allocator growth); leaves the pools and the prefix cache as they were."""
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
        if self.tree_cache is not None:
            self.tree_cache.reset()
        self.allocator.clear()
        self.req_to_token_pool.clear()
        return True

    def check_integrity(self) -> None:
        """free + held by requests + cached == total, for KV pages and for request slots."""
        ps = self.page_size
        holders = [r for r in self._memory_holders()]
        in_use = sum(-(-r.kv_len // ps) - r.prefix_len // ps for r in holders)
        if self.tree_cache is not None:
            self.tree_cache.check_integrity()
            in_use += self.tree_cache.total_size() // ps
        self.allocator.check_integrity(in_use)
        self.req_to_token_pool.check_integrity(len(holders))

    def get_stats(self) -> dict:
        used = self.max_total_num_tokens - self.allocator.available_size()
        if self.tree_cache is not None:
            used -= self.tree_cache.evictable_size()
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
            "memory_plan": plan.to_dict() if plan is not None else None,
            "stats": self.get_stats(),
        }

    # ================================================================== scheduling
    def _memory_holders(self):
        seen = set()
        for r in self.running + ([self.chunked_req] if self.chunked_req else []):
            if r.req_pool_idx is not None and id(r) not in seen:
                seen.add(id(r))
                yield r

    def _match_prefix(self, req: Req):
        if self.tree_cache is None:
            return [], None
        # keep at least one token to compute: the logits of the last prompt token are needed
        return self.tree_cache.match_prefix(req.fill_ids[: req.fill_len - 1])

    def _admit_encoder(self, req: Req, start: int, n: int, must_progress: bool) -> int:
        """Cut n so the images this chunk must encode fit the encoder reservation (0: wait for the next batch)."""
        if self.encoder_admission is None or req.mm_inputs is None:
            return n
        return self.encoder_admission.admit(req.mm_inputs, start, n, self.page_size, must_progress)

    def _schedule_prefill(self) -> PrefillPlan:
        plan = PrefillPlan()
        if self.encoder_admission is not None:
            self.encoder_admission.end_batch()  # nothing is held between batches
        if not self.waiting_queue and self.chunked_req is None:
            return plan
        ratio = self.new_token_ratio.value
        evictable = self.tree_cache.evictable_size() if self.tree_cache else 0
        rem_total = self.allocator.available_size() + evictable - sum(reserved_tokens(r, ratio) for r in self.running)
        rem_chunk = self.chunked_prefill_size
        rem_batch = self.max_prefill_tokens
        ps = self.page_size

        if self.chunked_req is not None:
            req = self.chunked_req
            n = self._admit_encoder(req, req.kv_len, min(req.extend_len, rem_chunk), must_progress=True)
            plan.reqs.append(req)
            plan.extend_lens.append(n)
            rem_chunk -= n
            rem_batch -= n
            rem_total -= n
            if n < req.extend_len:
                plan.chunked = req
                return self._allocate_prefill(plan)

        if self.server_args.schedule_policy != "fcfs":
            order_waiting_queue(self.waiting_queue, self.server_args.schedule_policy,
                                lambda r: len(self._match_prefix(r)[0]))
        free_slots = self.req_to_token_pool.available_size()
        num_running = len(self.running) + (1 if self.chunked_req else 0)
        for req in list(self.waiting_queue):
            if num_running + len(plan.reqs) >= self.max_running_requests or free_slots <= 0:
                break
            if rem_chunk < ps or rem_batch < ps:
                break
            slots, node = self._match_prefix(req)
            ext = req.fill_len - len(slots)
            cost = ext + reserved_tokens(req, ratio)
            nothing_else = not self.running and not plan.reqs and self.chunked_req is None
            if cost > rem_total and not (nothing_else and ext <= self.allocator.available_size() + evictable):
                break
            n = min(ext, rem_chunk, rem_batch)
            if n < ext:
                n = n // ps * ps
                if n <= 0:
                    break
            n = self._admit_encoder(req, len(slots), n, must_progress=not plan.reqs)
            if n <= 0:
                break
            # admit
            self.waiting_queue.remove(req)
            req.prefix_len = len(slots)
            req.last_node = node
            if node is not None:
                self.tree_cache.inc_lock_ref(node)
            req.req_pool_idx = self.req_to_token_pool.alloc()
            free_slots -= 1
            if slots:
                self.req_to_token_pool.req_to_token[req.req_pool_idx, : len(slots)] = torch.tensor(slots)
            req.kv_len = len(slots)
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
        return self._allocate_prefill(plan)

    def _alloc_slots(self, req: Req, num_new: int) -> Optional[List[int]]:
        # the slot of the request's last token matters only when its last page may have room (page_size > 1)
        last = 0
        if self.page_size > 1 and req.kv_len:
            last = int(self.req_to_token_pool.req_to_token[req.req_pool_idx, req.kv_len - 1])
        slots = self.allocator.alloc(req.kv_len, last, num_new)
        if slots is None and self.tree_cache is not None:
            need = self.allocator.pages_needed(req.kv_len, num_new) * self.page_size
            self.tree_cache.evict(need - self.allocator.available_size())
            slots = self.allocator.alloc(req.kv_len, last, num_new)
        return slots

    def _allocate_prefill(self, plan: PrefillPlan) -> PrefillPlan:
        """Give each admitted request KV slots for the tokens it prefills now; requests that do not fit go back."""
        kept = PrefillPlan(chunked=plan.chunked)
        for req, n in zip(plan.reqs, plan.extend_lens):
            slots = self._alloc_slots(req, n)
            if slots is None:
                self._release_memory(req, cache=False)
                req.reset_memory_state()
                if req is self.chunked_req:
                    self.chunked_req = None
                self.waiting_queue.insert(0, req)
                if kept.chunked is req:
                    kept.chunked = None
                continue
            row = req.req_pool_idx
            self.req_to_token_pool.req_to_token[row, req.kv_len : req.kv_len + n] = torch.tensor(slots)
            kept.reqs.append(req)
            kept.extend_lens.append(n)
        self.chunked_req = kept.chunked
        return kept

    # ================================================================== running batches
    def _run_extend(self, plan: PrefillPlan) -> None:
        reqs, lens = plan.reqs, plan.extend_lens
        input_ids: List[int] = []
        positions: List[int] = []
        out_loc: List[torch.Tensor] = []
        prefix_lens = [r.kv_len for r in reqs]
        seq_lens = [r.kv_len + n for r, n in zip(reqs, lens)]
        r2t = self.req_to_token_pool.req_to_token
        for r, n in zip(reqs, lens):
            input_ids.extend(r.fill_ids[r.kv_len : r.kv_len + n])
            positions.extend(range(r.kv_len, r.kv_len + n))
            out_loc.append(r2t[r.req_pool_idx, r.kv_len : r.kv_len + n])
        ends = torch.tensor(lens).cumsum(0) - 1
        fb = ForwardBatch(
            forward_mode=ForwardMode.EXTEND,
            batch_size=len(reqs),
            input_ids=torch.tensor(input_ids, dtype=torch.int64),
            positions=torch.tensor(positions, dtype=torch.int64),
            req_pool_indices=torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
            out_cache_loc=torch.cat(out_loc),
            seq_lens_cpu=seq_lens,
            extend_prefix_lens_cpu=prefix_lens,
            extend_seq_lens_cpu=list(lens),
            extend_prefix_lens=torch.tensor(prefix_lens, dtype=torch.int64),
            extend_seq_lens=torch.tensor(lens, dtype=torch.int64),
            logits_indices=ends,
            mm_inputs=[r.mm_inputs for r in reqs] if any(r.mm_inputs is not None for r in reqs) else None,
        )
        logits = self.model_runner.forward(fb)
        if self.encoder_admission is not None:
            self.encoder_admission.end_batch()
        for r, n in zip(reqs, lens):
            r.kv_len += n
        done = [i for i, r in enumerate(reqs) if r.kv_len == r.fill_len]
        if done:
            out = sample(logits[done], [reqs[i] for i in done])
            for j, i in enumerate(done):
                r = reqs[i]
                self._append(r, out, j)
                if r.finished():
                    self._finish(r)
                else:
                    self.running.append(r)
        self.forward_ct += 1

    def _run_decode(self) -> None:
        self._ensure_decode_memory()
        reqs = self.running
        if not reqs:
            return
        locs = []
        for r in reqs:
            slots = self._alloc_slots(r, 1)
            assert slots is not None, "decode memory was checked"
            locs.append(slots[0])
        rows = torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64)
        positions = torch.tensor([r.kv_len for r in reqs], dtype=torch.int64)
        out_cache_loc = torch.tensor(locs, dtype=torch.int64)
        self.req_to_token_pool.req_to_token[rows, positions] = out_cache_loc
        seq_lens = [r.kv_len + 1 for r in reqs]
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=len(reqs),
            input_ids=torch.tensor([r.output_ids[-1] for r in reqs], dtype=torch.int64),
            positions=positions,
            req_pool_indices=rows,
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
            out_cache_loc=out_cache_loc,
            seq_lens_cpu=seq_lens,
            mm_inputs=None,
        )
        logits = self.model_runner.forward(fb)
        for r in reqs:
            r.kv_len += 1
        out = sample(logits, reqs)
        still = []
        for j, r in enumerate(reqs):
            self._append(r, out, j)
            if r.finished():
                self._finish(r)
            else:
                still.append(r)
        self.running = still
        self.new_token_ratio.step()
        self.forward_ct += 1

    def _ensure_decode_memory(self) -> None:
        """Make room for one more token per running request: evict cached prefixes, then retract requests."""
        ps = self.page_size

        def shortfall_tokens() -> int:
            need = sum(self.allocator.pages_needed(r.kv_len, 1) for r in self.running)
            return (need - self.allocator.num_free_pages()) * ps

        short = shortfall_tokens()
        if short > 0 and self.tree_cache is not None:
            self.tree_cache.evict(short)
            short = shortfall_tokens()
        if short <= 0:
            return
        # Retract: the request with the fewest output tokens (and then the longest input) goes first; keep going
        # until the survivors have RETRACT_DECODE_STEPS tokens of headroom each, always keeping one.
        order = sorted(self.running, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)), reverse=True)
        retracted = []
        while len(order) > 1:
            victim = order.pop()
            self._release_memory(victim, cache=False)
            victim.reset_memory_state()
            victim.num_retractions += 1
            retracted.append(victim)
            self.running.remove(victim)
            headroom = self.allocator.available_size() - len(self.running) * RETRACT_DECODE_STEPS
            if shortfall_tokens() <= 0 and headroom >= 0:
                break
        if shortfall_tokens() > 0 and self.tree_cache is not None:
            self.tree_cache.evict(shortfall_tokens())
        if shortfall_tokens() > 0:  # one request that cannot fit even alone: validation makes this unreachable
            last = self.running.pop()
            last.abort("The KV cache is too small for this request; lower max_new_tokens or raise the memory limit.",
                       status_code=400)
            self._finish(last)
        # retracted requests go back to the front of the queue, the last retracted (most progressed) first
        self.waiting_queue[0:0] = retracted[::-1]
        self.num_retractions += len(retracted)
        self.new_token_ratio.after_retract(self.running)
        logger.info("KV cache pool is full. Retract requests. #retracted_reqs: %d, #new_token_ratio: %.4f",
                    len(retracted), self.new_token_ratio.value)

    # ================================================================== bookkeeping
    def _append(self, req: Req, out, j: int) -> None:
        tok = out.next_token_ids[j]
        if req.return_logprob:
            req.output_token_logprobs.append(out.token_logprobs[j])
            if out.top_logprobs is not None and out.top_logprobs[j] is not None:
                req.output_top_logprobs.append(out.top_logprobs[j])
        req.append_token(tok)
        self.total_generated_tokens += 1
        interval = self.server_args.stream_interval
        if req.stream and not req.finished() and (len(req.output_ids) - req.sent_token_len) >= interval:
            self.pending_outputs.append(self._make_output(req))

    def _release_memory(self, req: Req, cache: bool) -> None:
        """Give back a request's KV slots and request slot; with cache=True its tokens enter the prefix cache."""
        if req.req_pool_idx is None:
            return
        ps = self.page_size
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        slots = row[: req.kv_len].tolist()
        if cache and self.tree_cache is not None:
            aligned = req.kv_len // ps * ps
            n_cached = self.tree_cache.insert(req.fill_ids[:aligned], slots[:aligned])
            self.allocator.free(slots[req.prefix_len : n_cached])  # our duplicates of already cached pages
            self.allocator.free(slots[aligned:])  # the partly filled last page
        else:
            self.allocator.free(slots[req.prefix_len :])
        if req.last_node is not None:
            self.tree_cache.dec_lock_ref(req.last_node)
            req.last_node = None
        self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx = None

    def _finish(self, req: Req) -> None:
        self._release_memory(req, cache=True)
        self.reqs.pop(req.rid, None)
        self.pending_outputs.append(self._make_output(req))

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
