"""ProcessGroup: the child processes of one server or engine, started, watched and stopped as one.

    group = ProcessGroup("TP ranks")
    group.spawn("TP rank 1", "sglang.srt.distributed.tp_worker:run_tp_worker", (sa, 1), log_name="tp1", ...)
    infos = group.wait_ready(timeout_s)  # each child's ready message, in spawn order; RuntimeError naming a failure
    group.death()                        # None while every child runs, else who died first and why
    group.stop()                         # SIGTERM wave by wave, SIGKILL past the grace period; all at once after death

Children run `python -m sglang.srt.launch.child` (child.py): a fresh interpreter that imports its entry by name and
reports through a socket pair. "First cause of death": when one child dies the others often fail after it (a TP rank
loses its peer in the next collective), so the child named is, in this order, one killed by a signal, one that
reported its own error, one that exited without a report, one that reported only a lost connection; spawn order
breaks ties. No orphans: a child dies with its parent (child.py), and the groups still running at interpreter exit
are stopped then.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from multiprocessing.connection import Connection, wait as wait_for_messages
from typing import Callable, Dict, List, Optional, Sequence

logger = logging.getLogger(__name__)

STOP_GRACE_S = 5.0
READY_POLL_INTERVAL_S = 0.2
# what a child's error says when a peer died under it (gloo / nccl): a consequence, not the cause
COLLECTIVE_LOSS_MARKERS = ("Connection closed by peer", "Connection reset by peer", "NCCL", "gloo")


@dataclasses.dataclass
class Child:
    label: str  # how messages name it: "TP rank 2", "data-parallel replica 1"
    popen: subprocess.Popen
    conn: Connection
    stop_wave: int  # stop() terminates wave 0 first, then wave 1, ...
    report: dict = dataclasses.field(default_factory=dict)  # the last message it sent

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def exit_code(self) -> Optional[int]:
        return self.popen.poll()

    def drain(self) -> None:
        try:
            while self.conn.poll():
                self.report = self.conn.recv()
        except (EOFError, OSError):
            pass

    @property
    def failed(self) -> bool:
        return self.report.get("status") in ("error", "fatal") or self.exit_code is not None

    def cause(self) -> str:
        """Its own message when it reported one, else the signal that killed it or its exit code."""
        code = self.exit_code
        if self.report.get("status") in ("error", "fatal"):
            return self.report["message"]
        if code is not None and code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"

    def blame(self) -> int:
        """0 is the likeliest first cause (see the module docstring)."""
        if self.exit_code is not None and self.exit_code < 0:
            return 0
        if self.report.get("status") not in ("error", "fatal"):
            return 2
        return 3 if any(m in self.report["message"] for m in COLLECTIVE_LOSS_MARKERS) else 1


def describe_death(child: Child, others: List[Child]) -> str:
    tail = f" (then {', '.join(c.label for c in others)} stopped too)" if others else ""
    return f"{child.label} (pid {child.pid}) died: {child.cause()}{tail}"


_live_groups: "weakref.WeakSet[ProcessGroup]" = weakref.WeakSet()


class ProcessGroup:
    def __init__(self, what: str, describe: Callable[[Child, List[Child]], str] = describe_death):
        self.what = what  # "TP ranks", "data-parallel replicas": how startup messages name the group
        self.describe = describe
        self.children: List[Child] = []
        self.exits_expected = threading.Event()
        self._stop_lock = threading.Lock()
        _live_groups.add(self)

    # ------------------------------------------------------------------ start
    def spawn(self, label: str, entry: str, args: Sequence, *, log_name: str, log_level: str,
              env: Optional[Dict[str, str]] = None, stop_wave: int = 0) -> Child:
        """Start `entry(*args, report)` ("module:function") in a child process; `env` is added to this process's
        environment. The child's log lines start with `log_name`."""
        ours, theirs = mp.Pipe(duplex=True)
        popen = subprocess.Popen(
            [sys.executable, "-m", "sglang.srt.launch.child", log_name, str(theirs.fileno())],
            stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), env={**os.environ, **(env or {})},
        )
        theirs.close()  # the child holds the only other end: EOF here means it is gone
        child = Child(label, popen, ours, stop_wave)
        self.children.append(child)
        try:
            ours.send((os.getpid(), list(sys.path)))
            ours.send((entry, tuple(args), log_level))
        except OSError:  # it died at once; death() and wait_ready() say so
            pass
        return child

    @property
    def pids(self) -> List[int]:
        return [c.pid for c in self.children]

    def exit_codes(self) -> List[Optional[int]]:
        return [c.exit_code for c in self.children]

    def wait_ready(self, timeout_s: float) -> List[dict]:
        """Every child's ready message, in spawn order. RuntimeError naming the first cause when one fails first."""
        deadline = time.monotonic() + timeout_s
        while True:
            for c in self.children:
                c.drain()
            failed = [c for c in self.children if c.failed]
            if failed:
                first = min(failed, key=Child.blame)
                raise RuntimeError(f"{first.label} (pid {first.pid}) failed to start: {first.cause()}; "
                                   f"see its log above.")
            waiting = [c.conn for c in self.children if c.report.get("status") != "ready"]
            if not waiting:
                return [c.report for c in self.children]
            if time.monotonic() > deadline:
                raise RuntimeError(f"The {self.what} did not start within {timeout_s:.0f} s.")
            wait_for_messages(waiting, READY_POLL_INTERVAL_S)  # a message, or EOF when a child dies

    # ------------------------------------------------------------------ watch
    def expect_exits(self) -> None:
        """From now on a child that exits is not a failure (the caller released it, or is stopping the group)."""
        self.exits_expected.set()

    def death(self) -> Optional[str]:
        """None while every child runs (or exits are expected), else the first cause of death (module docstring)."""
        if self.exits_expected.is_set():
            return None
        dead = [c for c in self.children if c.exit_code is not None]
        if not dead:
            return None
        for c in dead:
            c.drain()
        first = min(dead, key=Child.blame)
        return self.describe(first, [c for c in dead if c is not first])

    # ------------------------------------------------------------------ stop
    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """After a death, SIGKILL every child at once (the others may be stuck waiting for the dead one). Otherwise
        wave by wave: SIGTERM the wave, wait up to grace_s, SIGKILL what is left. Idempotent."""
        with self._stop_lock:
            dead = self.death()
            self.expect_exits()
            if dead is not None:
                logger.error("Stopping the %s: %s", self.what, dead)
                waves = [self.children]
            else:
                waves = [[c for c in self.children if c.stop_wave == w]
                         for w in sorted({c.stop_wave for c in self.children})]
            for members in waves:
                for c in members:
                    if c.exit_code is not None:
                        continue
                    if dead is not None:
                        c.popen.kill()
                    else:
                        c.popen.terminate()
                deadline = time.monotonic() + grace_s
                for c in members:
                    _reap(c.popen, deadline)
            for c in self.children:
                c.conn.close()


def _reap(popen: subprocess.Popen, deadline: float) -> None:
    try:
        popen.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()


@atexit.register
def _stop_live_groups() -> None:
    """At interpreter exit nothing a group started may outlive this process (an Engine never shut down, say)."""
    for group in list(_live_groups):
        group.stop()
