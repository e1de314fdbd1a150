"""Bytes received on HTTP connections are parsed a few chunks per event-loop iteration (ReadPacer), so a burst of
connections cannot hold /health for a whole iteration of request parsing.

Why: asyncio runs, in one iteration, the read callback of every socket that became readable, and uvicorn parses each
request there (h11, pure Python: ~0.35 ms a request with a small image, ~0.7 ms while the pool threads hold the GIL).
200 requests arriving together made one 70-160 ms iteration; /health, read in the same iteration or the next, waited
behind it. Paced, each iteration parses at most PARSES_PER_ITERATION chunks; the rest wait in arrival order (their
sockets paused, so nothing more is read from them meanwhile) and a tick at the start of each following iteration
parses the next few. A chunk that begins a /health or /metrics request (a load balancer's probe, a scraper) is parsed
at once, and so is anything when the pace is not exceeded: an idle server parses as before.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from sglang.srt.entrypoints.http_middleware import UNGATED_PATHS

PARSES_PER_ITERATION = 8
# the paths the admission gate never holds either (http_middleware.UNGATED_PATHS)
PROBE_PREFIXES = tuple(f"GET {path}{end}".encode() for path in sorted(UNGATED_PATHS) for end in (" ", "?"))


class ReadPacer:
    def __init__(self, per_iteration: int = PARSES_PER_ITERATION):
        self.per_iteration = per_iteration
        self.left = per_iteration  # parses left in this iteration
        self.queue: collections.deque = collections.deque()  # (protocol, chunk), in arrival order
        self.tick_scheduled = False
        self.num_deferred = 0  # chunks that waited for a later iteration (for tests and logs)

    def offer(self, proto: Any, data: bytes) -> bool:
        """True: parse `data` now. False: it is queued (and the connection paused) until a later iteration."""
        if not self.tick_scheduled:  # call_soon from a callback runs at the start of the next iteration
            asyncio.get_running_loop().call_soon(self._tick)
            self.tick_scheduled = True
        if not proto.paced_pending:  # a connection's chunks keep their order
            if data.startswith(PROBE_PREFIXES):
                return True
            if self.left > 0 and not self.queue:
                self.left -= 1
                return True
        self.queue.append((proto, data))
        self.num_deferred += 1
        proto.paced_pending += 1
        if proto.transport is not None and proto.transport.is_reading():
            proto.transport.pause_reading()
            proto.paced_paused = True
        return False

    def _tick(self) -> None:
        self.tick_scheduled = False
        busy = self.left < self.per_iteration
        self.left = self.per_iteration
        while self.queue and self.left > 0:
            proto, data = self.queue.popleft()
            proto.paced_pending -= 1
            transport = proto.transport
            if transport is None or transport.is_closing():
                continue  # the client left: its queued bytes go with it
            self.left -= 1
            proto.parse_now(data)
            if not proto.paced_pending and proto.paced_paused:
                proto.paced_paused = False
                flow = getattr(proto, "flow", None)
                if not transport.is_closing() and not (flow is not None and flow.read_paused):
                    transport.resume_reading()  # unless uvicorn's own flow control holds it
        if self.queue or busy:
            asyncio.get_running_loop().call_soon(self._tick)
            self.tick_scheduled = True
