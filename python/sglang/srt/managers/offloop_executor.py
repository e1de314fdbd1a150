"""OffLoopExecutor: request-controlled CPU work (tokenization, the model's chat template, image decoding and
preprocessing) runs on a small thread pool, never on the HTTP event loop.

Why threads suffice: the fast tokenizer's encoder and PIL/numpy/torch image work release the GIL, and pure-Python
work (jinja) is preempted every `sys.getswitchinterval()` (5 ms), so the loop keeps answering. Measured on a 2-core
machine: a 2.2M-token encode in a worker thread lags the loop by at most ~200 ms (the GIL is held while the Rust
encoding is freed), rendering 20,000 chat messages by ~6 ms. Untrusted templates, which can run forever, do not come
here: they run in killable processes (template_sandbox.py).

Concurrency is bounded by the pool size, and so is the loop's work per iteration: a job waits for a free thread on
the loop (an asyncio.Semaphore of the pool's size), not in the pool's queue. Queued in the pool, the jobs of a burst
(200 requests at once) finish back to back and their 200 continuations pile up in one loop iteration (~1-2 ms each
while the pool threads hold the GIL), which is how long /health waited; gated, each iteration resumes at most
num_threads finished jobs and wakes as many waiting ones.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import threading
from typing import Any, Callable, TypeVar

T = TypeVar("T")

# More threads than cores only add GIL hand-offs; 4 lets a long encode and short requests overlap on big machines.
MAX_OFFLOOP_THREADS = 4
# Linux schedules threads, and a thread's nice value is its own: the pool threads yield the CPU to the loop thread
# (and the scheduler process) when cores are short, instead of sharing it equally.
OFFLOOP_THREAD_NICE = 5


def _lower_thread_priority() -> None:
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + OFFLOOP_THREAD_NICE)
    except (AttributeError, OSError):  # not Linux, or not permitted: run at the process's priority
        pass


def default_num_threads() -> int:
    return max(1, min(MAX_OFFLOOP_THREADS, os.cpu_count() or 1))


class OffLoopExecutor:
    def __init__(self, num_threads: int = 0):
        self.num_threads = num_threads or default_num_threads()
        self.pool = concurrent.futures.ThreadPoolExecutor(
            self.num_threads, thread_name_prefix="sglang-offloop", initializer=_lower_thread_priority
        )
        self.free_threads = asyncio.Semaphore(self.num_threads)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """fn(*args, **kwargs) on a pool thread; its exception (e.g. RequestError) is raised here."""
        call = functools.partial(fn, *args, **kwargs)
        async with self.free_threads:
            return await asyncio.get_running_loop().run_in_executor(self.pool, call)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
