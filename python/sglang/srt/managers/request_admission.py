"""How many HTTP requests do their preparation on the event loop at once (parsing, validation, chat template and
tokenization hand-offs, up to the send to the scheduler).

Why: every request's first step on the loop (the ASGI stack, body parsing and validation, the request's plan) costs
~0.3 ms, ~1-2 ms while the pool threads hold the GIL. uvicorn reads all the connections that became readable in one
loop iteration and starts their tasks together, so a burst of 200 requests ran 200 first steps back to back in the
next iteration: /health, behind them, waited 300-450 ms. Admitted a few at a time, each iteration runs at most
`limit` of them (the others wait on a semaphore, for free), and /health, never gated, is answered between them.

A request is admitted once its body is read (a slow upload holds no place) and leaves the gate when its first
generation request goes to the scheduler (release_admission, from TokenizerManager.generate_one), when its response
starts, or when its handler returns -- whichever comes first. Throughput is unchanged: preparation runs on
offloop_executor's threads, no more of which exist than the gate admits.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Callable, Optional

# requests preparing per pool thread: one on the thread, one parsed and waiting for it
ADMITTED_PER_THREAD = 2

_release: contextvars.ContextVar[Optional[Callable[[], None]]] = contextvars.ContextVar(
    "sglang_admission_release", default=None)


def release_admission() -> None:
    """The current request's preparation is over (its generation request is sent): let the next one in."""
    release = _release.get()
    if release is not None:
        release()


class RequestAdmission:
    def __init__(self, limit: int):
        self.limit = limit
        self.gate = asyncio.Semaphore(limit)
        self.num_admitted_total = 0

    async def admit(self) -> Callable[[], None]:
        """Wait for a place; returns the idempotent release, also installed for release_admission() in this
        task's context (and the contexts of the tasks it creates)."""
        await self.gate.acquire()
        self.num_admitted_total += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.gate.release()

        _release.set(release)
        return release
