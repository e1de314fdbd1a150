"""GrammarCache: compiled grammars by (kind, text) for one tokenizer, compiled on a background thread.

get() returns a Future at once: the scheduler never waits for a compile (xgrammar compiles in C++ and releases the
GIL, so a slow grammar delays only the requests that carry it). Requests with the same grammar share one compile,
in flight or done. Finished compiles are kept while their summed `memory_size_bytes` fits the budget (the plan's
grammar-cache term); the least recently used go first. A failed compile is not kept: the error goes to the requests
waiting on it, and the next request with that text tries again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Tuple

GrammarKey = Tuple[str, str]  # (json_schema | regex | ebnf, text)


class GrammarCache:
    def __init__(self, compile_fn: Callable[[str, str], object], budget_bytes: int, num_threads: int = 1):
        # (kind, text) -> the engine's compiled grammar (it has memory_size_bytes); runs on the worker thread
        self._compile_fn = compile_fn
        self.budget_bytes = budget_bytes
        self._executor = ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="grammar-compile")
        self._lock = threading.Lock()
        self._entries: "OrderedDict[GrammarKey, Future]" = OrderedDict()
        self._sizes: dict = {}  # key -> bytes, for finished compiles still in the cache
        self.num_compiles = 0
        self.num_hits = 0

    def get(self, kind: str, text: str) -> Future:
        key = (kind, text)
        with self._lock:
            fut = self._entries.get(key)
            if fut is not None:
                self._entries.move_to_end(key)
                self.num_hits += 1
                return fut
            self.num_compiles += 1
            fut = self._executor.submit(self._compile_fn, kind, text)
            self._entries[key] = fut
        fut.add_done_callback(lambda f, key=key: self._on_done(key, f))
        return fut

    def _on_done(self, key: GrammarKey, fut: Future) -> None:
        with self._lock:
            if self._entries.get(key) is not fut:
                return
            if fut.exception() is not None:
                del self._entries[key]
                return
            self._sizes[key] = int(getattr(fut.result(), "memory_size_bytes", 0))
            self._evict_locked()

    def _evict_locked(self) -> None:
        total = sum(self._sizes.values())
        for key in list(self._entries):
            if total <= self.budget_bytes:
                break
            if key in self._sizes:  # only finished compiles; in-flight ones have waiters
                total -= self._sizes.pop(key)
                del self._entries[key]

    @property
    def cached_bytes(self) -> int:
        with self._lock:
            return sum(self._sizes.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
