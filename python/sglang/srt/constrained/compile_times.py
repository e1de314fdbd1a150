"""Grammar compile durations as a cumulative histogram, kept where the compiles run (the scheduler's compile thread)
and pushed with the scheduler's stats; the HTTP process exports it as upstream's
`sglang:grammar_compilation_time_seconds` (metrics/collector.py).

Stats keys: grammar_compile_time_s_sum (float), grammar_compile_time_s_count (int) and
grammar_compile_time_s_buckets (cumulative counts per edge of GRAMMAR_COMPILE_BUCKETS_S, so replicas add up).
"""

from __future__ import annotations

import bisect
import threading
from typing import List

# upstream's edges (seconds): a cached grammar is ~0, a large JSON schema on a CPU can take seconds
GRAMMAR_COMPILE_BUCKETS_S = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 90.0,
                             120.0, 240.0)


class CompileTimes:
    def __init__(self):
        self._lock = threading.Lock()
        self._counts: List[int] = [0] * len(GRAMMAR_COMPILE_BUCKETS_S)  # per bucket, not cumulative
        self.sum_s = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        i = bisect.bisect_left(GRAMMAR_COMPILE_BUCKETS_S, seconds)
        with self._lock:
            if i < len(self._counts):
                self._counts[i] += 1
            self.sum_s += seconds
            self.count += 1

    def stats(self) -> dict:
        with self._lock:
            cumulative, total = [], 0
            for c in self._counts:
                total += c
                cumulative.append(total)
            return {"grammar_compile_time_s_sum": self.sum_s, "grammar_compile_time_s_count": self.count,
                    "grammar_compile_time_s_buckets": cumulative}
