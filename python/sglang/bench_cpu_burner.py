"""Busy neighbours for a benchmark: N processes, each a pure Python busy loop, the way any other CPU-bound program
on the machine (a build, a log shipper, a second server) competes with the server for cores.

    with CpuBurner(1) as burner:      # returns once every process is spinning
        ...measure...
    burner.cpu_s                      # CPU seconds the burners got, summed; burner.cores_busy = cpu_s / wall

Never leaves a process behind: leaving the `with` (normally, by an exception or Ctrl-C) terminates and reaps them,
and each burner also exits by itself within milliseconds once its parent is gone (the parent killed by SIGKILL, or
by a SIGTERM that skips Python's cleanup). Ctrl-C in a terminal reaches the burners too; they ignore it and let the
parent stop them, so no tracebacks are printed from them. (multiprocessing's spawn context also starts its idle
resource-tracker helper, once per parent process; it leaves when the parent does.)
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from typing import List, Optional

# Iterations of the busy loop between two checks that the parent is still there (a few milliseconds of CPU).
PARENT_CHECK_ITERATIONS = 100_000
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0


def burn(parent_pid: int, ready) -> None:
    """The burner: spin in pure Python until terminated or orphaned."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ready.set()
    while os.getppid() == parent_pid:
        for _ in range(PARENT_CHECK_ITERATIONS):
            pass


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (0.0 if it cannot be read)."""
    try:
        import psutil

        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    except Exception:  # noqa: BLE001 - an accounting figure, never a reason to fail the benchmark
        return 0.0


class CpuBurner:
    """N busy processes while inside the `with` block; N = 0 does nothing."""

    def __init__(self, num_processes: int):
        if num_processes < 0:
            raise ValueError(f"--cpu-burner must be >= 0 processes, got {num_processes}")
        self.num_processes = num_processes
        self.processes: List[multiprocessing.Process] = []
        self.started_pids: List[int] = []
        self.cpu_s = 0.0
        self.wall_s = 0.0
        self._start: Optional[float] = None
        self._cpu_at_start_s = 0.0

    @property
    def cores_busy(self) -> float:
        """Average number of cores the burners kept busy while they ran."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    def start(self) -> "CpuBurner":
        # spawn: a fresh interpreter that imports only this module; fork would copy the caller's threads' state.
        ctx = multiprocessing.get_context("spawn")
        try:
            for _ in range(self.num_processes):
                ready = ctx.Event()
                p = ctx.Process(target=burn, args=(os.getpid(), ready), daemon=True, name="sglang-cpu-burner")
                p.start()
                self.processes.append(p)
                self.started_pids.append(p.pid)
                if not ready.wait(START_TIMEOUT_S):
                    raise RuntimeError(f"CPU burner process {p.pid} did not start within {START_TIMEOUT_S:.0f} s")
        except BaseException:
            self.stop()
            raise
        self._cpu_at_start_s = self._burner_cpu_s()  # leave out the interpreters' start-up
        self._start = time.perf_counter()
        return self

    def _burner_cpu_s(self) -> float:
        return sum(process_cpu_s(p.pid) for p in self.processes if p.is_alive())

    def stop(self) -> None:
        """Terminate and reap every burner (idempotent); records their CPU time first."""
        if self._start is not None:
            self.wall_s = time.perf_counter() - self._start
            self.cpu_s = max(0.0, self._burner_cpu_s() - self._cpu_at_start_s)
            self._start = None
        for p in self.processes:
            if p.is_alive():
                p.terminate()
        for p in self.processes:
            p.join(STOP_TIMEOUT_S)
            if p.is_alive():
                p.kill()
                p.join(STOP_TIMEOUT_S)
        self.processes = []

    def __enter__(self) -> "CpuBurner":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
