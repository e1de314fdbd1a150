"""The server's running batch size while a benchmark measures, sampled from its Prometheus GET /metrics.

Throughput that falls while inter-token latency stays flat means the batch shrank: requests reach the scheduler,
or leave it, too slowly. Sampling the server's own gauge shows that directly. Known gauges: this runtime's (and
upstream SGLang's) `sglang:num_running_reqs`, which needs the server started with --enable-metrics, and vLLM's
`vllm:num_requests_running`. A server without /metrics, or without either gauge, gives no samples and a note.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import List, Optional

RUNNING_GAUGES = ("sglang:num_running_reqs", "vllm:num_requests_running")
DEFAULT_INTERVAL_S = 0.5
SCRAPE_TIMEOUT_S = 5.0


def parse_running_reqs(text: str) -> Optional[float]:
    """The first known running-requests gauge in a Prometheus text exposition, summed over its label sets
    (one per model / engine / replica); None if the text has none of them."""
    for name in RUNNING_GAUGES:
        total, found = 0.0, False
        for line in text.splitlines():
            if not line.startswith(name) or line[len(name):len(name) + 1] not in ("{", " "):
                continue
            rest = line[line.rindex("}") + 1:] if line[len(name)] == "{" else line[len(name):]
            total += float(rest.split()[0])  # `value [timestamp]`
            found = True
        if found:
            return total
    return None


class RunningBatchSampler:
    """Scrapes `base_url`/metrics every `interval_s` from start() until stop(); interval 0 disables it."""

    def __init__(self, session, base_url: str, headers: dict, interval_s: float = DEFAULT_INTERVAL_S):
        self.session = session
        self.url = f"{base_url}/metrics"
        self.headers = headers
        self.interval_s = interval_s
        self.samples: List[float] = []
        self.note = "" if interval_s > 0 else "not sampled (--metrics-interval-s 0)"
        self._task: Optional[asyncio.Task] = None

    def start(self) -> None:
        if self.interval_s > 0:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
        next_at = time.perf_counter() + self.interval_s
        while True:
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            next_at = max(next_at + self.interval_s, time.perf_counter())  # late scrapes are not made up for
            try:
                async with self.session.get(self.url, headers=self.headers, timeout=timeout) as resp:
                    if resp.status != 200:
                        self.note = f"no /metrics (HTTP {resp.status}); start the server with --enable-metrics"
                        return
                    value = parse_running_reqs(await resp.text())
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                if not self.samples:
                    self.note = f"/metrics unreachable ({type(e).__name__})"
                continue  # one slow scrape under load is not the end of the series
            if value is None:
                self.note = f"/metrics has none of {', '.join(RUNNING_GAUGES)}"
                return
            self.samples.append(value)
            self.note = ""

    def summary(self) -> dict:
        xs = self.samples
        return {
            "running_batch_samples": len(xs),
            "running_batch_mean": statistics.fmean(xs) if xs else None,
            "running_batch_p50": statistics.median(xs) if xs else None,
            "running_batch_min": min(xs) if xs else None,
            "running_batch_max": max(xs) if xs else None,
            "running_batch_note": self.note if not xs else "",
        }
