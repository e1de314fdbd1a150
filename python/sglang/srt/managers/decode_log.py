"""The decode-batch log line (upstream's --decode-log-interval): every N decode steps the scheduler logs, at info
level, the running requests and the KV tokens in use (against the pool size) of the batch that step decodes, the
generation throughput over the window of N steps and the waiting queue's length. Only decode steps are counted; a
prefill between them is part of the wall time the throughput is measured over, as a client sees it. Warmup steps
are not logged."""

from __future__ import annotations

import logging
import time
from typing import Callable, Tuple

logger = logging.getLogger(__name__)


class DecodeLog:
    def __init__(self, interval_steps: int, pool_tokens: int):
        assert interval_steps > 0
        self.interval_steps = interval_steps
        self.pool_tokens = pool_tokens
        self.muted = False
        self.reset()

    def reset(self) -> None:
        self.steps = 0  # decode steps in the current window
        self.window_start_s = 0.0
        self.window_start_tokens = 0
        self.batch = (0, 0, 0)

    def begin_step(self, total_generated_tokens: int, snapshot: Callable[[], Tuple[int, int, int]]) -> None:
        """Before a decode step. snapshot() -> (running requests, KV tokens in use, queued requests) of the batch
        about to run, read only when this step's line is due. The first step of a window starts its clock."""
        if self.steps == 0:
            self.window_start_s = time.perf_counter()
            self.window_start_tokens = total_generated_tokens
        if self.steps + 1 >= self.interval_steps and not self.muted:
            self.batch = snapshot()

    def end_step(self, total_generated_tokens: int) -> None:
        """After a decode step: logs the line every interval_steps steps (none while muted: the warmup)."""
        self.steps += 1
        if self.steps < self.interval_steps:
            return
        self.steps = 0
        if self.muted:
            return
        elapsed_s = max(time.perf_counter() - self.window_start_s, 1e-9)
        throughput = (total_generated_tokens - self.window_start_tokens) / elapsed_s
        num_running, used_tokens, num_queued = self.batch
        logger.info(
            "Decode batch. #running-req: %d, #token: %d / %d (token usage: %.2f), gen throughput (token/s): %.2f, "
            "#queue-req: %d", num_running, used_tokens, self.pool_tokens, used_tokens / max(self.pool_tokens, 1),
            throughput, num_queued)
