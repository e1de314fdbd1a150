"""Honest process lifecycle (issue 9, finding 3), with real servers and real SIGKILLs:

1. kill -9 of the server: its scheduler process exits too (no orphan), and the IPC directory it could not clean up
   is removed by the next server's start (the directory records its owner's pid and start time).
2. kill -9 of the scheduler while a client streams: the server exits with a non-zero status within 5 s, the client
   gets an error event, no child process is left, and the server's IPC directory is removed.
"""

import atexit
import json
import os
import shutil
import signal
import tempfile
import threading
import time

import httpx
import psutil
import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=50, suite="cpu")

from sglang.srt.managers.port_args import IPC_DIR_PREFIX, OWNER_FILE  # noqa: E402
from sglang.test.test_utils import DEFAULT_SMALL_SERVER_ARGS, popen_launch_server  # noqa: E402

FATAL_EXIT_LIMIT_S = 5.0
# This module's servers keep their IPC directories in a temp dir of their own (TMPDIR): any server's start removes the
# dead servers' directories under its temp dir, so a test group starting one side by side could remove the killed
# server's directory before the fixture looks for it (fresh-clone CI, 2026-11-30).
IPC_ROOT = tempfile.mkdtemp(prefix="lifecycle-")
atexit.register(shutil.rmtree, IPC_ROOT, ignore_errors=True)
SERVER_ENV = {"TMPDIR": IPC_ROOT}


def ipc_dirs_of(pid: int) -> list:
    """The IPC directories under IPC_ROOT whose owner record names `pid`."""
    found = []
    for name in os.listdir(IPC_ROOT):
        path = os.path.join(IPC_ROOT, name)
        if not name.startswith(IPC_DIR_PREFIX):
            continue
        try:
            with open(os.path.join(path, OWNER_FILE)) as f:
                if int(f.read().split()[0]) == pid:
                    found.append(path)
        except (OSError, ValueError, IndexError):
            pass
    return found


def scheduler_of(server) -> psutil.Process:
    for pid in server.child_pids():
        p = psutil.Process(pid)
        if "sglang.srt.launch.child scheduler" in " ".join(p.cmdline()):  # srt/launch/child.py, named "scheduler"
            return p
    raise AssertionError(f"no scheduler process among {server.child_pids()}")


@pytest.fixture(scope="module")
def stale_ipc_dir():
    """Launch a server, SIGKILL it, check its scheduler dies too; return the IPC directory it left behind."""
    srv = popen_launch_server(other_args=DEFAULT_SMALL_SERVER_ARGS, env=SERVER_ENV)
    try:
        children = [psutil.Process(pid) for pid in srv.child_pids()]
        dirs = ipc_dirs_of(srv.pid)
        assert len(dirs) == 1, dirs
        srv.process.send_signal(signal.SIGKILL)
        srv.process.wait(10)
        gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"outlived the killed server: {[p.cmdline() for p in alive]}"
        assert os.path.isdir(dirs[0]), "a SIGKILLed server cannot clean up after itself"
        return dirs[0]
    finally:
        srv.kill()


def test_server_sigkill_leaves_no_orphan_and_next_start_cleans_up(stale_ipc_dir):
    srv = popen_launch_server(other_args=DEFAULT_SMALL_SERVER_ARGS, env=SERVER_ENV)
    try:
        assert not os.path.exists(stale_ipc_dir), "the next start removes the dead server's IPC directory"
        assert len(ipc_dirs_of(srv.pid)) == 1
        scheduler_dies_mid_stream(srv)
    finally:
        srv.kill()


def scheduler_dies_mid_stream(srv):
    children = [psutil.Process(pid) for pid in srv.child_pids()]
    own_dirs = ipc_dirs_of(srv.pid)
    events, failure = [], []

    def stream():
        body = {"prompt": "Count to a million:", "max_tokens": 4000, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", f"{srv.base_url}/v1/completions", json=body, timeout=30) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[len("data: "):])
        except httpx.HTTPError as e:  # a cut connection is an error too, but the server should say why
            failure.append(e)

    t = threading.Thread(target=stream)
    t.start()
    deadline = time.time() + 60
    while not events and time.time() < deadline:
        time.sleep(0.05)
    assert events, "the stream never started"
    scheduler_of(srv).send_signal(signal.SIGKILL)
    killed_at = time.perf_counter()
    code = srv.process.wait(30)
    exit_s = time.perf_counter() - killed_at
    t.join(30)
    print(f"\nserver exited with {code} {exit_s:.2f} s after its scheduler was killed")
    assert code != 0, "a supervisor must see the failure"
    assert exit_s < FATAL_EXIT_LIMIT_S
    errors = [json.loads(e)["error"] for e in events if e != "[DONE]" and "error" in json.loads(e)]
    assert errors and "scheduler" in errors[0]["message"], (events[-3:], failure)
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left behind: {[p.cmdline() for p in alive]}"
    assert not any(os.path.exists(d) for d in own_dirs)
    assert "Traceback" not in srv.log()


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", "-s"]))
