"""`sglang serve --tp-size 3` (the default model: 9 heads, 3 KV heads), end to end:

* the real `openai` client: chat and streaming chat;
* /server_info shows the per-rank plan (three ranks, three processes, one KV pool size), and `sglang plan
  --tp-size 3` with the same flags predicts that per-rank pool (--max-total-memory-gb is per rank);
* peak RSS growth of every rank stays within its plan total under --max-total-memory-gb;
* a killed rank stops the server: exit status 1 within 10 s, the rank named in the log, the streaming client gets
  an error (not a hang), and no process is left.
"""

import contextlib
import io
import json
import signal
import threading
import time

import httpx
import openai
import psutil
import pytest

from sglang.cli.plan import main as plan_main
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import popen_launch_server

register_cpu_ci(est_time=40, suite="cpu")

CAP_GB = 1.0
FLAGS = ["--tp-size", "3", "--max-total-memory-gb", str(CAP_GB), "--max-running-requests", "16"]
KILL_EXIT_LIMIT_S = 10.0
# the served pool differs from the dry run's by the measured-vs-formula weights and activations (see
# mem_plan/test_plan_matches_server.py: 6% at a 1 GiB budget)
KV_TOKENS_TOLERANCE = 0.06


@pytest.fixture(scope="module")
def server():
    srv = popen_launch_server(other_args=FLAGS)
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def info(server):
    return httpx.get(f"{server.base_url}/server_info", timeout=30).json()


def test_openai_chat_and_stream(server):
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none")
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Name three colors."}],
                                           max_tokens=16, temperature=0)
    assert reply.choices[0].message.content and reply.usage.completion_tokens > 0
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Name three colors."}], max_tokens=16, temperature=0,
        stream=True) if c.choices]
    assert "".join(pieces) == reply.choices[0].message.content  # greedy: the stream says the same


def test_server_info_per_rank_plan_matches_dry_run(server, info):
    ranks = info["memory_plan_per_rank"]
    assert info["tp_size"] == 3 and [r["tp_rank"] for r in ranks] == [0, 1, 2]
    assert set(r["pid"] for r in ranks) <= set(server.child_pids()) and len({r["pid"] for r in ranks}) == 3
    assert {r["max_total_num_tokens"] for r in ranks} == {info["max_total_num_tokens"]}
    plan = info["memory_plan"]
    assert plan["budget_bytes"] == int(CAP_GB * 2**30)  # the cap is per rank
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert plan_main(["--device", "cpu", *FLAGS, "--json"]) == 0
    dry = json.loads(buf.getvalue())["plan"]
    assert dry["budget_bytes"] == plan["budget_bytes"] and dry["kv_cell_bytes"] == plan["kv_cell_bytes"]
    served, planned = info["max_total_num_tokens"], dry["max_total_num_tokens"]
    assert abs(served - planned) <= KV_TOKENS_TOLERANCE * served, (served, planned)


def vm_hwm_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_peak_rss_per_rank_within_plan(server, info):
    prompts = [f"Write a long story about the number {i}." for i in range(16)]
    threads = [threading.Thread(target=lambda p=p: httpx.post(
        f"{server.base_url}/generate", json={"text": p, "sampling_params": {"max_new_tokens": 48, "temperature": 0}},
        timeout=300)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in info["memory_plan_per_rank"]:
        growth = vm_hwm_bytes(r["pid"]) - r["pre_load_rss_bytes"]
        assert 0 < growth <= r["plan_total_bytes"], (r["tp_rank"], growth, r["plan_total_bytes"])


def test_killed_rank_stops_the_server(server, info):
    """Last in this module: it ends the server."""
    pids = [r["pid"] for r in info["memory_plan_per_rank"]]
    procs = [psutil.Process(pid) for pid in server.child_pids()]
    got = {}

    def stream():
        try:
            with httpx.stream("POST", f"{server.base_url}/generate", timeout=60, json={
                    "text": "Once upon a time", "stream": True,
                    "sampling_params": {"max_new_tokens": 2000, "temperature": 0, "ignore_eos": True}}) as r:
                got["body"] = "".join(r.iter_text())
        except httpx.HTTPError as e:
            got["error"] = repr(e)

    client = threading.Thread(target=stream)
    client.start()
    time.sleep(2.0)
    psutil.Process(pids[2]).send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    code = server.process.wait(30)
    took = time.monotonic() - killed_at
    client.join(30)
    assert not client.is_alive(), "the client hangs"
    assert code == 1 and took <= KILL_EXIT_LIMIT_S, (code, took)
    assert "error" in got or '"error"' in got.get("body", "") or "abort" in got.get("body", ""), got
    log = server.log()
    assert f"TP rank 2 (pid {pids[2]}) died: killed by SIGKILL" in log, log[-3000:]
    gone, alive = psutil.wait_procs(procs, timeout=10)
    assert not alive, [p.cmdline() for p in alive]
