"""TemplateSandbox: renders client-supplied chat templates in killable worker processes.

A template is a program: `{% for i in range(99999) %}{% for j in range(99999) %}...` runs for hours in 140 bytes,
and jinja holds the GIL, so it can run neither on the event loop nor on a thread. Each render goes to an idle
worker process (template_sandbox_worker.py), which stops a render at the time budget itself and stays warm; one
that does not answer within KILL_GRACE_S after the budget is killed and replaced. So a runaway template costs one
core (at low priority) for about the budget and never touches the loop or other requests. At most `num_workers`
renders run at once; more wait their turn.

Process starts and pipe I/O happen on this sandbox's own threads, never on the event loop: starting a process from
this large one takes tens of milliseconds, and (CPython 3.11) cancelling an asyncio subprocess start can hang the
loop's shutdown. A spare worker is started ahead of time (`prewarm`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import struct
import subprocess
import sys
from typing import List, Set

from sglang.srt.managers.request_error import RequestError

WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "template_sandbox_worker.py")
DEFAULT_NUM_WORKERS = 2
# Address-space cap of a worker: the interpreter and jinja take ~40 MiB of it; the rest bounds what a template can
# build (`'x' * 10**10` fails with MemoryError instead of taking the machine's RAM).
WORKER_MEMORY_LIMIT_BYTES = 1 << 30
# how long past the time budget a worker may take to report its own timeout before it is killed
KILL_GRACE_S = 1.0
_FRAME_HEADER = struct.Struct(">I")
TEMPLATE_PARAM = "chat_template_kwargs.chat_template"


class _Worker:
    """One worker process; its methods block (they run on the sandbox's threads)."""

    def __init__(self, memory_limit_bytes: int):
        self.proc = subprocess.Popen(
            [sys.executable, "-I", WORKER_SCRIPT, str(memory_limit_bytes), str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def call(self, payload: bytes) -> dict:
        """Send one request frame and read the answer; EOFError if the process died (or was killed) meanwhile."""
        try:
            self.proc.stdin.write(_FRAME_HEADER.pack(len(payload)) + payload)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError) as e:
            raise EOFError("the worker is gone") from e
        header = self.proc.stdout.read(_FRAME_HEADER.size)
        if len(header) < _FRAME_HEADER.size:
            raise EOFError("the worker is gone")
        (size,) = _FRAME_HEADER.unpack(header)
        body = self.proc.stdout.read(size)
        if len(body) < size:
            raise EOFError("the worker is gone")
        return json.loads(body)

    def kill(self) -> None:
        if self.alive:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass

    def reap(self) -> None:
        self.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except (BrokenPipeError, OSError):
                pass


class TemplateSandbox:
    def __init__(self, timeout_s: float, max_output_chars: int, num_workers: int = DEFAULT_NUM_WORKERS,
                 memory_limit_bytes: int = WORKER_MEMORY_LIMIT_BYTES):
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self.memory_limit_bytes = memory_limit_bytes
        self.slots = asyncio.Semaphore(num_workers)
        # one thread per concurrent render, plus one for starts and reaping; they mostly wait on pipes
        self.threads = concurrent.futures.ThreadPoolExecutor(num_workers + 1, thread_name_prefix="sglang-template")
        self.idle: List[_Worker] = []
        self.workers: Set[_Worker] = set()  # idle and busy, so close() reaches all of them
        self.closed = False
        self.num_killed = 0  # workers killed because they did not answer in time (for tests and logs)

    def _spawn(self) -> _Worker:
        worker = _Worker(self.memory_limit_bytes)
        self.workers.add(worker)
        if self.closed:
            worker.kill()
        return worker

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.threads, fn, *args)

    async def prewarm(self) -> None:
        """Start one idle worker now, so the next render does not wait for a process start."""
        if self.idle or self.closed:
            return
        worker = await self._run(self._spawn)
        if not self.closed:
            self.idle.append(worker)

    def timeout_error(self) -> RequestError:
        return RequestError(
            400,
            f"The chat template in {TEMPLATE_PARAM} did not finish within its time budget of "
            f"{self.timeout_s:g} s (--client-chat-template-timeout-s); simplify the template.",
            param=TEMPLATE_PARAM,
        )

    def _retire(self, worker: _Worker) -> None:
        self.workers.discard(worker)
        worker.kill()
        if self.closed:
            return  # close() and aclose() reap
        self.threads.submit(worker.reap)
        if not self.idle:  # keep a spare ready
            self.threads.submit(lambda: self.closed or self.idle.append(self._spawn()))

    async def render(self, template: str, context: dict) -> str:
        """The rendered text; RequestError(400) naming the budget or the template's error otherwise."""
        request = {"template": template, "context": context, "max_output_chars": self.max_output_chars,
                   "timeout_s": self.timeout_s}
        payload = json.dumps(request, ensure_ascii=False).encode("utf-8", "surrogatepass")
        async with self.slots:
            worker = self.idle.pop() if self.idle else await self._run(self._spawn)
            reusable = False
            try:
                response = await asyncio.wait_for(self._run(worker.call, payload), self.timeout_s + KILL_GRACE_S)
                reusable = response.get("kind") != "memory"  # that worker exits after answering
            except asyncio.TimeoutError:
                self.num_killed += 1
                raise self.timeout_error() from None
            except EOFError:
                raise RequestError(
                    400, f"The chat template in {TEMPLATE_PARAM} crashed its sandbox process; simplify the template.",
                    param=TEMPLATE_PARAM,
                ) from None
            finally:  # a worker interrupted mid-render (timeout, cancelled request) is in an unknown state
                if reusable and worker.alive and not self.closed:
                    self.idle.append(worker)
                else:
                    self._retire(worker)
        return self._result(response)

    def _result(self, response: dict) -> str:
        if response.get("ok"):
            return response["text"]
        kind, message = response.get("kind"), response.get("message", "")
        if kind == "timeout":
            raise self.timeout_error()
        if kind == "output_budget":
            mb = self.max_output_chars / (1 << 20)
            message = (f"The chat template in {TEMPLATE_PARAM} produced more than its output budget of "
                       f"{self.max_output_chars:,} characters ({mb:.3g} MiB, --client-chat-template-max-output-mb).")
        elif kind == "memory":
            message = (f"The chat template in {TEMPLATE_PARAM} passed its memory budget of "
                       f"{self.memory_limit_bytes >> 20} MiB.")
        elif kind == "syntax":
            message = f"The chat template in {TEMPLATE_PARAM} is not valid jinja: {message}"
        else:
            message = f"The chat template in {TEMPLATE_PARAM} failed: {message}"
        raise RequestError(400, message, param=TEMPLATE_PARAM)

    async def aclose(self) -> None:
        """close(), then wait until every worker it killed has exited (starts already queued kill their own)."""
        workers = list(self.workers)
        self.close()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.threads.shutdown, True)
        for worker in workers + list(self.workers):
            await loop.run_in_executor(None, worker.reap)

    def close(self) -> None:
        """Kill every worker; starts still queued kill their own worker at once."""
        self.closed = True
        for worker in list(self.workers):
            worker.kill()
        self.idle.clear()
        self.threads.shutdown(wait=False)
