"""Helpers for tests that launch a real server: free ports, launch + wait-for-ready, and a clean kill.

The names upstream's test files import are here with upstream's meaning (DEFAULT_URL_FOR_TEST, CustomTestCase,
STDOUT_FILENAME / STDERR_FILENAME, is_in_ci, popen_launch_server(model, base_url, timeout, api_key, other_args, env,
return_stdout_stderr, device), the DEFAULT_*_MODEL_* constants: test/upstream_test_names.py), so an upstream-style
test file runs here after changing only its model name.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from typing import IO, List, Optional, Sequence, Tuple

import psutil
import requests

from sglang.test import upstream_test_names
from sglang.utils import is_in_ci  # noqa: F401 (upstream imports it from here)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_URL = f"http://{DEFAULT_HOST}:30000"
DEFAULT_TIMEOUT_FOR_SERVER_LAUNCH = 300.0
DEFAULT_API_KEY_FOR_TEST = "sk-sglang-test"
# OpenMP threads that spin-wait at barriers collapse when other processes share the cores (measured on a loaded
# 2-core machine: 1.3 vs 11.5 tok/s at batch 1); test machines are shared, so test servers wait passively.
# On a quiet machine spinning is faster (about 400 vs 275 tok/s for 32 x 64 tokens), so the runtime keeps it.
DEFAULT_TEST_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
# Small pools keep startup (memory planning, pool allocation) fast; tests never need more.
DEFAULT_SMALL_SERVER_ARGS = ["--max-total-tokens", "65536", "--max-running-requests", "64"]
PORT_TAKEN_TEXT = "address already in use"  # errno EADDRINUSE's text, as the server's log reports a bind failure
PORT_TAKEN_RETRIES = 3
# upstream: files a test opens and hands to popen_launch_server(return_stdout_stderr=...) to read the server's output
STDOUT_FILENAME = os.path.join(tempfile.gettempdir(), "stdout.txt")
STDERR_FILENAME = os.path.join(tempfile.gettempdir(), "stderr.txt")


def find_free_port(host: str = DEFAULT_HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# upstream: the one URL a test file's server binds. A port free when this module is imported (not a fixed one), so
# test processes running side by side do not collide.
DEFAULT_URL_FOR_TEST = f"http://{DEFAULT_HOST}:{find_free_port()}"


def __getattr__(name: str) -> str:
    """Upstream's DEFAULT_*_MODEL_* constants, resolved when imported (test/upstream_test_names.py)."""
    return upstream_test_names.resolve(name)


class CustomTestCase(unittest.TestCase):
    """upstream's test base class: a failing test is run again up to SGLANG_TEST_MAX_RETRY more times (default 0),
    and a class whose setUpClass raises still runs its tearDownClass, so a half-started server is not left behind."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("setUpClass")
        if own is None:
            return
        setup = own.__func__

        def guarded(klass):
            try:
                setup(klass)
            except BaseException:
                try:
                    klass.tearDownClass()
                except Exception:
                    pass  # the setUpClass error is the one to report
                raise

        cls.setUpClass = classmethod(guarded)

    def _callTestMethod(self, method):
        retries = int(os.environ.get("SGLANG_TEST_MAX_RETRY", "0"))
        for attempt in range(retries + 1):
            try:
                return method()
            except Exception:
                if attempt == retries:
                    raise


class ServerProcess:
    """A launched server: its Popen, base URL and log file. `kill()` takes its children down with it."""

    def __init__(self, process: subprocess.Popen, base_url: str, log_path: str, startup_s: float):
        self.process = process
        self.base_url = base_url
        self.log_path = log_path
        self.startup_s = startup_s
        self.pid = process.pid

    def __getattr__(self, name):
        if name == "process":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        # upstream's popen_launch_server returns the Popen itself: poll(), wait(), returncode, send_signal() ...
        return getattr(self.process, name)

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def child_pids(self) -> List[int]:
        try:
            return [c.pid for c in psutil.Process(self.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def kill(self) -> None:
        kill_process_tree(self.pid)


def kill_process_tree(pid: int, timeout_s: float = 10.0) -> None:
    """SIGTERM the process and its descendants, wait, then SIGKILL what is left."""
    try:
        parent = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    procs = parent.children(recursive=True) + [parent]
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=timeout_s)


def _tee(src: IO[str], sink: IO[str], log: IO[str], lock: threading.Lock) -> None:
    for line in iter(src.readline, ""):
        with lock:
            for out in (sink, log):
                try:
                    out.write(line)
                    out.flush()
                except ValueError:  # the test closed its file: keep draining the pipe
                    pass
    src.close()


def openai_client(base_url: str, api_key: str = "none", timeout: float = 120):
    """The real `openai` client for a test server at base_url (no retries: a failure shows at once)."""
    import openai

    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=timeout)


def popen_launch_server(
    model: Optional[str] = None,
    base_url: Optional[str] = None,
    timeout: float = DEFAULT_TIMEOUT_FOR_SERVER_LAUNCH,
    api_key: Optional[str] = None,
    other_args: Sequence[str] = (),
    env: Optional[dict] = None,
    return_stdout_stderr: Optional[Tuple[IO[str], IO[str]]] = None,
    device: str = "auto",
    command: Optional[List[str]] = None,
) -> ServerProcess:
    """Launch `python -m sglang.launch_server` (or `command`) and wait until GET /health answers 200.

    Upstream's parameters and order: base_url defaults to a free port on 127.0.0.1; return_stdout_stderr, two open
    text files, receive the server's stdout and stderr as it writes them (the server's log file gets both as well);
    device other than "auto" adds `--device` ("rocm" is this project's "hip"). The result behaves as upstream's Popen
    (pid, poll, wait, returncode) and adds kill() of the whole tree and log(). Raises RuntimeError with the server
    log if it exits or times out.
    """
    if base_url is None:
        # the port is free when chosen, not held: another process (a test group running side by side) may bind it
        # before the server does; the server then exits saying so, and it is launched again on a new port
        for _ in range(PORT_TAKEN_RETRIES):
            try:
                return popen_launch_server(model, f"http://{DEFAULT_HOST}:{find_free_port()}", timeout, api_key,
                                           other_args, env, return_stdout_stderr, device, command)
            except RuntimeError as e:
                if PORT_TAKEN_TEXT not in str(e).lower():
                    raise
        raise RuntimeError(f"No free port held long enough for the server to bind it in {PORT_TAKEN_RETRIES} tries")
    host, port = base_url.split("://", 1)[1].rsplit(":", 1)
    args = list(command or [sys.executable, "-m", "sglang.launch_server"])
    args += ["--host", host, "--port", port]
    if model is not None:
        args += ["--model-path", model]
    if api_key is not None:
        args += ["--api-key", api_key]
    if device != "auto":
        args += ["--device", {"rocm": "hip"}.get(device, device)]
    args += [str(a) for a in other_args]
    log = tempfile.NamedTemporaryFile(prefix="sglang-server-", suffix=".log", delete=False)
    start = time.perf_counter()
    child_env = {**DEFAULT_TEST_ENV, **os.environ, **(env or {})}
    if return_stdout_stderr is None:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=child_env)
    else:
        process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env, text=True,
                                   errors="replace", bufsize=1)
        log_text = open(log.name, "a", buffering=1)
        lock = threading.Lock()
        for src, sink in zip((process.stdout, process.stderr), return_stdout_stderr):
            threading.Thread(target=_tee, args=(src, sink, log_text, lock), daemon=True).start()
    server = ServerProcess(process, base_url, log.name, 0.0)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = start + timeout
    while time.perf_counter() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"Server exited with code {process.returncode}:\n{server.log()[-4000:]}")
        try:
            if requests.get(f"{base_url}/health", headers=headers, timeout=2).status_code == 200:
                server.startup_s = time.perf_counter() - start
                return server
        except requests.RequestException:
            pass
        time.sleep(0.2)
    server.kill()
    raise RuntimeError(f"Server did not become healthy within {timeout:.0f} s:\n{server.log()[-4000:]}")
