"""The child side of a process group: `python -m sglang.srt.launch.child NAME FD` (started by ProcessGroup.spawn).

    parent -> child over FD:  (parent pid, sys.path), then (entry "module:function", args, log level)
    child -> parent over FD:  {"status": "ready", ...}          the entry called report.ready(info)
                              {"status": "error", "message"}   it raised before that; exit code 1
                              {"status": "fatal", "message"}   it raised after that; exit code 1
The entry runs as `entry(*args, report)`. It is imported by name in a fresh interpreter, so nothing of the caller's
__main__ is run again: a child starts the same way whether the caller is a script, `python -c`, stdin or a notebook.
SIGINT is ignored (Ctrl-C reaches the whole terminal group; the parent decides when its children stop), SIGTERM has
its default action (even where the parent ignores it) unless the entry installs a handler. The child never outlives
its parent: PR_SET_PDEATHSIG on Linux plus a thread polling the parent pid (the signal alone misses a parent that
died before it was set).
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import os
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection

logger = logging.getLogger(__name__)

PARENT_POLL_INTERVAL_S = 1.0
_PR_SET_PDEATHSIG = 1


def kill_itself_when_parent_died(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass

    def watchdog():
        while True:
            time.sleep(PARENT_POLL_INTERVAL_S)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watchdog, name="parent-watchdog", daemon=True).start()


class Report:
    """What the entry tells its parent: `ready(info)` once, when it can serve; failures are sent by the bootstrap."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.is_ready = False

    def ready(self, info: dict | None = None) -> None:
        self.conn.send({**(info or {}), "status": "ready"})
        self.is_ready = True

    def failed(self, message: str) -> None:
        try:
            self.conn.send({"status": "fatal" if self.is_ready else "error", "message": message})
        except OSError:  # the parent is gone: nobody to tell
            pass


def resolve_entry(entry: str):
    module, _, function = entry.partition(":")
    return getattr(importlib.import_module(module), function)


def main(name: str, fd: int) -> None:
    conn = Connection(fd)
    parent_pid, sys.path[:] = conn.recv()  # the caller's sys.path before anything of its is unpickled
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    kill_itself_when_parent_died(parent_pid)
    entry, args, log_level = conn.recv()
    logging.basicConfig(level=log_level.upper(), format=f"[%(asctime)s {name}] %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")
    report = Report(conn)
    try:
        resolve_entry(entry)(*args, report)
    except SystemExit:  # a requested stop (the entry's SIGTERM handler) or the entry's own exit code
        raise
    except BaseException as e:  # noqa: BLE001 - everything must reach the parent as a message
        logger.error("%s %s:\n%s", name, "crashed" if report.is_ready else "failed to start", traceback.format_exc())
        report.failed(f"{type(e).__name__}: {e}")
        sys.stdout.flush()
        sys.stderr.flush()
        # no interpreter teardown: it can hang in a collective whose peer is gone
        os._exit(1)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
