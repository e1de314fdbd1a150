"""GrammarBackend: the scheduler's side of constrained decoding for one tokenizer, whichever engine compiles and
matches (backend_table.py: xgrammar_engine.py or llguidance_engine.py; both fill the same packed token bitmask).

Holds the compiled-grammar cache (host memory), the token bitmask (token_bitmask.py: filled on the host, one device
buffer sized by the memory plan's grammar term) and the requests waiting for their grammar to compile. The scheduler calls:
    hold(req)      a request with a grammar: start (or join) its compile; it waits here, not in the waiting queue
    pop_ready()    requests whose compile finished: ready ones get a matcher (req.grammar), failed ones an error
    remove(req)    an aborted request leaves the queue
    filler.start(reqs)  before a decode forward: fill the batch's bitmask rows on a worker thread meanwhile
    wait(s)        block up to s seconds for a compile when there is nothing else to run
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any, List, Optional, Sequence, Tuple

import torch

from sglang.srt.constrained.backend_table import NO_BACKEND, engine_class, grammar_backend_refusal
from sglang.srt.constrained.bitmask_fill import BitmaskFiller
from sglang.srt.constrained.empty_language import (NEVER_FINISHES_REASON, EmptyGrammarError, admits_nothing_from_start,
                                                   never_finishes)
from sglang.srt.constrained.grammar_cache import GrammarCache
from sglang.srt.constrained.grammar_check import invalid_grammar_error
from sglang.srt.constrained.request_grammar import RequestGrammar
from sglang.srt.constrained.compile_times import CompileTimes
from sglang.srt.constrained.token_bitmask import TokenBitmask

logger = logging.getLogger(__name__)


class GrammarBackend:
    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int], max_batch_rows: int,
                 cache_budget_bytes: int, num_compile_threads: int = 1, device: str = "cpu", engine: str = "xgrammar"):
        self.engine_name = engine
        self._engine_cls = engine_class(engine)
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(set(stop_token_ids))
        self.device = torch.device(device)
        # one row per request a batch can sample at once, filled on the host, masked with on the device
        self.bitmask = TokenBitmask(max_batch_rows, vocab_size, self.device)
        self.filler = BitmaskFiller(self.bitmask.host)  # a decode batch's rows, filled while its forward runs
        self._info_lock = threading.Lock()
        self._engine = None  # built on the first compile, on the compile thread (tokenizer scan ~0.3 s)
        self.cache = GrammarCache(self._timed_compile, cache_budget_bytes, num_compile_threads)
        self.compile_times = CompileTimes()  # for /metrics (sglang:grammar_compilation_time_seconds)
        self.waiting: List[Tuple[Any, Future]] = []
        self.num_live_matchers = 0

    # ------------------------------------------------------------------ compile (worker thread)
    def _get_engine(self):
        with self._info_lock:
            if self._engine is None:
                self._engine = self._engine_cls(self.tokenizer, self.vocab_size, self.stop_token_ids)
            return self._engine

    def _timed_compile(self, kind: str, text: str):
        start = time.perf_counter()
        try:
            engine = self._get_engine()
            compiled = engine.compile(kind, text)
            if admits_nothing_from_start(engine.matcher(compiled), self.vocab_size, self.stop_token_ids):  # sampling would have no token
                raise EmptyGrammarError()
            if self.engine_name == "xgrammar" and never_finishes(compiled):  # also for a request that skipped the edge
                raise EmptyGrammarError(NEVER_FINISHES_REASON)
            return compiled
        finally:
            self.compile_times.observe(time.perf_counter() - start)

    # ------------------------------------------------------------------ scheduler side
    def hold(self, req: Any) -> None:
        kind, text = req.sampling_params.grammar
        self.waiting.append((req, self.cache.get(kind, text)))

    def remove(self, req: Any) -> bool:
        for i, (r, _) in enumerate(self.waiting):
            if r is req:
                del self.waiting[i]
                return True
        return False

    def pop_ready(self) -> Tuple[List[Any], List[Tuple[Any, str]]]:
        """(requests now holding a matcher, [(request, 400 message)] for grammars the engine refused), in arrival
        order; both leave the queue."""
        ready, failed, still = [], [], []
        for req, fut in self.waiting:
            if not fut.done():
                still.append((req, fut))
                continue
            kind, text = req.sampling_params.grammar
            err = fut.exception()
            if err is not None:
                failed.append((req, str(invalid_grammar_error(kind, text, err, self.engine_name))))
                continue
            req.grammar = self.new_matcher(kind, fut.result())
            ready.append(req)
        self.waiting = still
        return ready, failed

    def new_matcher(self, kind: str, compiled: Any) -> RequestGrammar:
        matcher = self._get_engine().matcher(compiled)
        self.num_live_matchers += 1
        return RequestGrammar(kind, matcher, self._released, self.filler)

    def _released(self) -> None:
        self.num_live_matchers -= 1

    def wait(self, timeout_s: float) -> None:
        if self.waiting:
            wait([f for _, f in self.waiting], timeout=timeout_s, return_when=FIRST_COMPLETED)

    def __len__(self) -> int:
        return len(self.waiting)

    def stats(self) -> dict:
        return {"num_grammar_waiting_reqs": len(self.waiting), "num_live_grammar_matchers": self.num_live_matchers,
                "grammar_cache_entries": len(self.cache), "grammar_cache_bytes": self.cache.cached_bytes,
                "grammar_compiles": self.cache.num_compiles, "grammar_cache_hits": self.cache.num_hits,
                **self.compile_times.stats()}

    def planned_bytes(self) -> int:
        """What this backend holds of the memory the plan covers (mem_plan/build.grammar_terms): the device bitmask,
        and on a CPU, where the device is the host, the compiled-grammar cache budget too."""
        cache = self.cache.budget_bytes if self.device.type == "cpu" else 0
        return self.bitmask.device_bytes() + cache

    def shutdown(self) -> None:
        self.filler.shutdown()
        self.cache.shutdown()


def build_grammar_backend(server_args: Any, tokenizer: Any, vocab_size: int, eos_token_ids: Optional[Sequence[int]],
                          max_batch_rows: int, device: str = "cpu") -> Optional[GrammarBackend]:
    """The scheduler's backend, or None with --grammar-backend none or without a tokenizer. A backend that cannot
    run here (outlines, a missing package) stops the launch with the reason (backend_table.py)."""
    from sglang.srt.mem_plan.sizes import grammar_cache_budget_bytes

    refusal = grammar_backend_refusal(server_args.grammar_backend)
    if refusal is not None:
        raise ValueError(refusal)
    if server_args.grammar_backend == NO_BACKEND or getattr(server_args, "is_embedding", False) or tokenizer is None:
        return None
    return GrammarBackend(tokenizer, vocab_size, list(eos_token_ids or []), max_batch_rows,
                          grammar_cache_budget_bytes(server_args.grammar_cache_mb), device=device,
                          engine=server_args.grammar_backend)
