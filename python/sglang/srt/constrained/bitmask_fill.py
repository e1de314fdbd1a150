"""BitmaskFiller: the grammar bitmask rows of a batch, filled on a worker thread while the batch's forward runs, and
by two threads at once for whatever is left when the sampler needs them.

A matcher's next-token mask depends only on the tokens it has accepted, all committed before the batch is built, so
the fill (xgrammar, C++, the GIL released; most of the per-step cost of structured output) need not wait for the
logits:

    start(reqs)   before a decode forward: a job over the constrained rows; the worker thread claims rows one by one
    take()        in the sampler: this thread claims the rows still unclaimed too, then waits for the worker's
                  last one; returns {grammar: (row, tokens accepted)} of the rows the job filled, once (a second
                  take() gets {}: the rows may have been refilled since, e.g. by a retry in halves)
    fill(gs, rows) the rows the sampler must fill now (prefill batches, a retry): a job taken at once, so the worker
                  thread and this one share it
    wait(quiet)   before a matcher advances or is dropped: no job may still be reading it

Jobs run one at a time: a new one first finishes the previous one.
"""

from __future__ import annotations

import itertools
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

import torch


class _Job:
    """Rows to fill; any thread calling drain() claims the next unclaimed row until none is left."""

    def __init__(self, matchers: List[Any], rows: List[int], bitmask: torch.Tensor):
        self.matchers, self.rows, self.bitmask = matchers, rows, bitmask
        self._claims = itertools.count()  # next() on it is atomic under the GIL: each row is claimed once

    def drain(self) -> None:
        while True:
            k = next(self._claims)
            if k >= len(self.rows):
                return
            self.matchers[k].fill_next_token_bitmask(self.bitmask, self.rows[k])


class BitmaskFiller:
    def __init__(self, bitmask: torch.Tensor):
        self.bitmask = bitmask
        self._executor: Optional[ThreadPoolExecutor] = None  # made on the first job
        self._job: Optional[Tuple[_Job, Future]] = None
        self._filled: Dict[Any, Tuple[int, int]] = {}
        self.num_jobs = 0

    def _submit(self, grammars: List[Any], rows: List[int]) -> None:
        self.wait(quiet=True)  # normally long done; its rows are not used once a new job starts
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-fill")
        for g in grammars:
            g.filler = self
        job = _Job([g.matcher for g in grammars], rows, self.bitmask)
        self._job = (job, self._executor.submit(job.drain))
        self.num_jobs += 1

    def start(self, reqs: List[Any]) -> None:
        rows = [i for i, r in enumerate(reqs) if getattr(r, "grammar", None) is not None]
        if rows:
            grammars = [reqs[i].grammar for i in rows]
            self._submit(grammars, rows)
            self._filled = {g: (i, g.num_accepted) for g, i in zip(grammars, rows)}

    def wait(self, quiet: bool = False) -> None:
        """Finish the job in flight, this thread helping. A failed job leaves no row marked filled, and raises
        its error unless quiet (a matcher about to advance or be dropped only needs the job over)."""
        pending, self._job = self._job, None
        if pending is None:
            return
        job, fut = pending
        try:
            try:
                job.drain()
            finally:
                fut.result()  # also after a failure here: the worker must be done with the matchers
        except Exception:
            self._filled = {}
            if not quiet:
                raise

    def take(self) -> Dict[Any, Tuple[int, int]]:
        self.wait()
        filled, self._filled = self._filled, {}
        return filled

    def fill(self, grammars: List[Any], rows: List[int]) -> None:
        self._submit(grammars, rows)
        self._filled = {}
        self.wait()

    def shutdown(self) -> None:
        self.wait(quiet=True)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
