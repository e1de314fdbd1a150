"""RequestQueues: where each unfinished request is.

    compiling (GrammarGate) -> waiting -> [chunked] -> running -> finished (gone from `reqs`)
A request is in at most one of waiting / running / chunked; retraction sends running requests back to the front of
waiting. Only the running requests and the chunked one hold memory (memory_holders()).
"""

from __future__ import annotations

from typing import Dict, List, Optional

from sglang.srt.managers.schedule_batch import Req


class RequestQueues:
    def __init__(self):
        self.reqs: Dict[str, Req] = {}  # every unfinished request by rid, compiling ones included
        self.waiting: List[Req] = []
        self.running: List[Req] = []
        self.chunked: Optional[Req] = None  # the request whose prompt is being prefilled chunk by chunk
        self.in_step: List[Req] = []  # requests the step in progress has taken in (failed by a stray fault)

    def num_running(self) -> int:
        return len(self.running) + (1 if self.chunked is not None else 0)

    def busy(self) -> bool:
        return bool(self.waiting or self.running or self.chunked)

    def take_out(self, req: Req) -> None:
        """Remove an unfinished request from whichever queue holds it."""
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        if req is self.chunked:
            self.chunked = None

    def memory_holders(self) -> List[Req]:
        holders = self.running + ([self.chunked] if self.chunked else [])
        return [r for r in dict.fromkeys(holders) if r.req_pool_idx is not None]  # Req hashes by identity
