"""The speculative decode step: proposals -> slots -> one verify forward -> speculative/verify.py -> commit -> give
back the rejected slots. BatchRunner.run_decode calls SpecDecoder.try_verify after every running request got its
decode slot; with no proposal in the batch the step is an ordinary decode (decode kernels, CUDA graphs).

A request with k proposals d1..dk contributes [x0, d1..dk] (x0 = its last output token) at positions p..p+k, p =
kv_len, to one EXTEND forward with logits for every row (row j: the target's distribution after input j); a request
without proposals contributes x0 alone. Invariants:
    - proposals take slots from free pages only (ReqMemory.alloc_if_free): speculation never evicts, retracts or OOMs;
    - kv_len is set before each append (p + tokens committed so far), so kv_len == fill_len - 1 whenever the sink
      may finish or release the request; then the slots past kv_len are given back (ReqMemory.truncate);
    - faults are confined like a decode's: a forward fault (an OOM too) gives the proposals' slots back and the
      batch is recovered as an ordinary decode (BatchRunner._recover: an OOM retracts, others retry in halves); a
      sampling fault does the same for the requests that had committed nothing yet.
With the overlap schedule the verify forward runs under OverlapSchedule.run (the previous step's text is decoded
meanwhile); verification and commits follow the join, on this thread: a request commits several tokens per step, and
all but its last have their text decoded at once (the window queues one text half per request).
"""

from __future__ import annotations

from typing import Any, List

import torch

from sglang.srt.managers.fault_confinement import StepFault, step_phase
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.spec_policy import SpecPolicy
from sglang.srt.managers.spec_tree import TreeStep, may_commit
from sglang.srt.mem_plan.spec_sizes import verify_budget, verify_rows_per_request
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.speculative.ngram_proposer import NgramProposer
from sglang.srt.speculative.proposer import Proposer
from sglang.srt.speculative.verify import verify


def _int64(values: List[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def _alive(req: Req) -> bool:
    return req.req_pool_idx is not None and not req.finished()


def build_proposer(cfg, model_runner: Any) -> Proposer:
    """The proposer of a resolved SpecConfig (speculative/spec_args.py)."""
    if cfg.algorithm == "NGRAM":
        return NgramProposer(cfg.ngram_min_window, cfg.ngram_max_window)
    if cfg.algorithm == "STANDALONE":
        from sglang.srt.speculative.draft_proposer import DraftProposer

        return DraftProposer(model_runner.draft_runner, cfg.num_steps, model_runner.chunked_prefill_size)
    if cfg.algorithm in ("EAGLE", "EAGLE3", "NEXTN"):
        from sglang.srt.speculative.eagle_proposer import EagleProposer

        return EagleProposer(model_runner.draft_runner, model_runner, cfg.num_steps, cfg.topk)
    raise ValueError(f"--speculative-algorithm {cfg.algorithm}: no proposer in this runtime yet")


class SpecCounters:
    """Server totals: verify forwards, proposed / accepted proposal tokens, request-steps with proposals and the
    tokens those committed (accept_length = committed / request-steps: tokens a request gains per verify)."""

    TOTALS = ("verify_steps", "proposed_tokens", "accepted_tokens", "req_steps", "committed_tokens")

    def __init__(self):
        self.verify_steps = self.proposed_tokens = self.accepted_tokens = 0
        self.req_steps = self.committed_tokens = 0

    def accept_length(self) -> float:
        return self.committed_tokens / self.req_steps if self.req_steps else 0.0

    def totals(self) -> dict:
        """Every counter by name (the scheduler's stats push sends them prefixed spec_)."""
        return {name: getattr(self, name) for name in self.TOTALS}

    def to_dict(self) -> dict:
        """/server_info's "speculative" counters."""
        return {"verify_steps": self.verify_steps, "proposed_tokens": self.proposed_tokens,
                "accepted_tokens": self.accepted_tokens, "accept_length": self.accept_length()}


class SpecDecoder:
    def __init__(self, cfg, runner: Any, max_running_requests: int, chunked_prefill_size: int, device: str):
        self.cfg, self.runner = cfg, runner
        self.memory, self.queues, self.sink = runner.memory, runner.queues, runner.sink
        self.proposer = build_proposer(cfg, runner.model_runner)
        # a head's KV at a cached prefix's last position belongs to another continuation: prefix hits stop short
        self.memory.trim_prefix_page = bool(getattr(self.proposer, "next_token_kv", False))
        # a request's verify rows (a chain's num_draft_tokens, a tree's branches expanded) and the batch budget: the
        # rows the plan prices (mem_plan/spec_sizes.py), so a full batch of whole trees runs within them
        rows = verify_rows_per_request(cfg.topk, cfg.num_steps, cfg.num_draft_tokens)
        budget = verify_budget(max_running_requests, rows, chunked_prefill_size, str(device))
        self.tree = TreeStep(self) if cfg.topk > 1 else None
        self.policy = SpecPolicy(rows - 1, budget)
        self.counters = SpecCounters()

    def on_extend(self, units) -> None:
        self.proposer.on_extend(units)

    def on_decoded(self, reqs: List[Req]) -> None:
        """After an ordinary decode step (no proposals): a hidden-state draft catches up on its features."""
        hook = getattr(self.proposer, "on_decoded", None)
        if hook is not None:
            hook(reqs)

    def _forget_left(self) -> None:
        """Proposer and policy state of requests that left the scheduler."""
        live = self.queues.reqs
        for rid in [rid for rid in self.policy.stats if rid not in live]:
            self.policy.release(rid)
        tracked = getattr(self.proposer, "indexes", None)
        if tracked is not None and len(tracked) > len(live):
            for rid in [rid for rid in tracked if rid not in live]:
                tracked.pop(rid, None)

    def try_verify(self, reqs: List[Req]) -> bool:
        """Run the batch as a verify step if a request gets a proposal (and slots for it); False: decode as usual."""
        self._forget_left()
        max_k = self.policy.max_k(reqs)
        if not any(max_k):
            return False
        if self.tree is not None:
            return self.tree.try_verify(reqs, max_k)
        if getattr(self.proposer, "writes_kv", False):  # a draft model writes its KV into the proposals' slots
            max_k = [self.memory.alloc_if_free(r, k) if k else 0 for r, k in zip(reqs, max_k)]
            proposals = self.proposer.propose(reqs, max_k)
            for r, p in zip(reqs, proposals):
                self.memory.truncate(r, r.kv_len + 1 + len(p))
        else:
            proposals = self.proposer.propose(reqs, max_k)
            for i, (r, p) in enumerate(zip(reqs, proposals)):
                if p:
                    proposals[i] = p[: self.memory.alloc_if_free(r, len(p))]
        if not any(proposals):
            return False
        self._run_verify(reqs, proposals)
        return True

    def _build_verify(self, reqs: List[Req], proposals: List[List[int]]) -> ForwardBatch:
        pool = self.memory.req_to_token_pool
        input_ids: List[int] = []
        positions: List[int] = []
        out_loc, lens = [], []
        for r, p in zip(reqs, proposals):
            kv, n = r.kv_len, len(p) + 1
            input_ids.append(r.output_ids[-1])
            input_ids.extend(p)
            positions.extend(range(kv + r.mrope_delta, kv + n + r.mrope_delta))  # past the prompt: one M-RoPE axis
            out_loc.append(pool.slots(r.req_pool_idx, kv, kv + n))  # host rows: no device read
            lens.append(n)
        prefix = [r.kv_len for r in reqs]
        seq_lens = [kv + n for kv, n in zip(prefix, lens)]
        rows = [r.req_pool_idx for r in reqs]
        pos = _int64(positions)
        return ForwardBatch(
            ForwardMode.EXTEND, len(reqs), input_ids=_int64(input_ids), positions=pos,
            mrope_positions=pos.expand(3, -1) if any(r.uses_mrope for r in reqs) else None,
            req_pool_indices=_int64(rows), seq_lens=_int64(seq_lens), out_cache_loc=torch.cat(out_loc),
            seq_lens_cpu=seq_lens, req_pool_indices_cpu=rows, extend_prefix_lens_cpu=prefix,
            extend_seq_lens_cpu=lens, extend_prefix_lens=_int64(prefix), extend_seq_lens=_int64(lens),
            logits_indices=torch.arange(len(input_ids)), mm_inputs=None,
        )

    def _recover_as_decode(self, reqs: List[Req], f: StepFault) -> None:
        """Give the proposals' slots back (keeping each request's decode slot) and recover as a decode batch. With
        none to recover (a sampling fault after every live request had committed a token: the step just ends there,
        each keeping what it committed) the fault is still counted and logged."""
        if not reqs:
            self.runner.fault_policy.on_fault(f"Verify step failed in the {f.step} step after every request had "
                                              "committed a token; the step ends there", f.cause)
            return
        for r in reqs:
            self.memory.truncate(r, r.kv_len + 1)
        self.runner._recover([(r, 1) for r in reqs], True, f)

    def _run_verify(self, reqs: List[Req], proposals: List[List[int]]) -> None:
        runner, fp, overlap = self.runner, self.runner.fault_policy, self.sink.overlap

        def job() -> torch.Tensor:
            with step_phase("decode"):
                fp.inject("decode", reqs, runner.forward_ct)
                return runner.model_runner.forward(fb)

        try:
            with step_phase("decode"):
                fb = self._build_verify(reqs, proposals)
            logits = job() if overlap is None else overlap.run(job)
        except StepFault as f:
            self._recover_as_decode([r for r in reqs if _alive(r)], f)
            return
        offsets, acc = [], 0
        for p in proposals:
            offsets.append(acc)
            acc += len(p) + 1
        base = [r.kv_len for r in reqs]
        committed, accepted = [0] * len(reqs), [0] * len(reqs)

        def commit(i: int, out, row: int) -> bool:
            r, j = reqs[i], committed[i]
            if not may_commit(r, j, self.sink):
                return False
            committed[i] = j + 1
            accepted[i] += j < len(proposals[i]) and out.next_token_ids[row] == proposals[i][j]
            r.kv_len = base[i] + j + 1  # x0 and the accepted proposals before this token have their KV
            runner._commit_token(r, out, row)
            return _alive(r)

        try:
            with step_phase("sample"):
                fp.inject("sample", reqs, runner.forward_ct)
                verify(logits, reqs, proposals, offsets, commit, runner.grammar.bitmask)
        except StepFault as f:
            self._recover_as_decode([r for i, r in enumerate(reqs) if not committed[i] and _alive(r)], f)
        for i, r in enumerate(reqs):
            if committed[i] and _alive(r):
                self.memory.truncate(r)
        self._count(reqs, proposals, committed, accepted)

    def _count(self, reqs, proposals, committed, accepted) -> None:
        c = self.counters
        c.verify_steps += 1
        for r, p, n, a in zip(reqs, proposals, committed, accepted):
            if not p:
                continue
            c.proposed_tokens += len(p)
            c.accepted_tokens += a
            c.req_steps += 1
            c.committed_tokens += n
            r.spec_verify_ct += 1
            r.spec_verify_tokens += n
            self.policy.on_verified(r, len(p), a)
        self.proposer.on_verified(reqs, committed)


def check_spec_model(cfg, server_args, text_shape, window_tokens: int) -> None:
    """Refuse, naming why, a server whose model or mode speculative decoding cannot serve: a rejected token's KV must
    be given back, which recurrent state and windowed pages cannot do."""
    if cfg is None:
        return
    from sglang.srt.mem_cache.linear_state_pool import linear_layer_count

    flag = f"--speculative-algorithm {cfg.algorithm}"
    if server_args.is_embedding:
        raise ValueError(f"{flag} with --is-embedding: an embedding server decodes nothing; drop the flag.")
    if linear_layer_count(text_shape):
        raise ValueError(f"{flag}: {text_shape.model_type} has linear-attention / state-space layers, whose "
                         "recurrent state cannot take back a rejected proposal; drop the flag to serve it.")
    if window_tokens:
        raise ValueError(f"{flag}: {text_shape.model_type} has windowed-attention layers (window {window_tokens} "
                         "tokens), whose pages cannot take back a rejected proposal; drop the flag to serve it.")
