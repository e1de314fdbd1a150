"""Overload and lifecycle on a server started with the `sglang serve` console script:
--max-queued-requests answers 503 instead of queueing forever, and SIGINT stops the server and the scheduler
process with nothing left behind."""

import shutil
import signal
import sys
import threading
import time

import httpx
import psutil
import pytest
import requests

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import popen_launch_server

register_cpu_ci(est_time=25, suite="cpu")

SGLANG = [shutil.which("sglang")] if shutil.which("sglang") else [sys.executable, "-m", "sglang.cli.main"]


@pytest.fixture(scope="module")
def small_server():
    srv = popen_launch_server(
        command=SGLANG + ["serve"],
        other_args=["--max-total-tokens", "8192", "--max-running-requests", "1", "--max-queued-requests", "1"],
    )
    print(f"\n`sglang serve` ready in {srv.startup_s:.1f} s")
    yield srv
    srv.kill()


def waiting(base_url) -> int:
    return requests.get(f"{base_url}/server_info", timeout=30).json()["internal_states"][0]["num_waiting_reqs"]


def test_full_queue_returns_503(small_server):
    url = small_server.base_url
    long_body = {"prompt": "Tell a story.", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    queued = {}
    with httpx.Client(timeout=120) as http:
        with http.stream("POST", f"{url}/v1/completions", json=long_body) as running:
            lines = running.iter_lines()  # keep a reference: a collected iterator closes the connection
            next(l for l in lines if l.startswith("data: "))  # this request holds the only running slot

            def second():
                queued["r"] = requests.post(f"{url}/v1/completions", timeout=120,
                                            json={"prompt": "Hi", "max_tokens": 2})

            t = threading.Thread(target=second)
            t.start()
            deadline = time.time() + 30
            while waiting(url) < 1 and time.time() < deadline:
                time.sleep(0.1)
            r = requests.post(f"{url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=30)
            assert r.status_code == 503, r.text
            assert r.json()["error"]["message"] == "The request queue is full."
        # closing the stream aborts the running request; the queued one then runs
        t.join(60)
    assert queued["r"].status_code == 200 and queued["r"].json()["choices"][0]["finish_reason"] == "length"


def test_sigint_stops_everything(small_server):
    children = [psutil.Process(pid) for pid in small_server.child_pids()]
    assert children, "the scheduler runs in its own process"
    lines = []

    def stream():
        body = {"prompt": "x", "max_tokens": 3000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{small_server.base_url}/v1/completions", json=body, timeout=60) as r:
            lines.extend(l for l in r.iter_lines() if l)

    t = threading.Thread(target=stream)
    t.start()
    deadline = time.time() + 30
    while not lines and time.time() < deadline:
        time.sleep(0.1)
    small_server.process.send_signal(signal.SIGINT)
    assert small_server.process.wait(timeout=30) == 0
    t.join(10)
    # the in-flight stream is ended properly, not cut off
    assert lines[-1] == "data: [DONE]" and '"finish_reason":"abort"' in lines[-2]
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left behind: {[p.pid for p in alive]}"
    assert "ready at" in small_server.log() and "Traceback" not in small_server.log()


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", "-s"]))
