"""Multi-node TP on loopback, stopping, and a rank that raises.

1. Two "nodes" on this machine (--nnodes 2 over 127.0.0.1, one rank each, a small random-weight Qwen3): node 0
   answers /generate with the tokens of a one-rank server's greedy decode (sglang.Engine, tp=1); node 1 serves no
   HTTP. SIGTERM to node 0: it exits 0, releases node 1 (which exits 0), and no process of either is left.
2. A follower rank that raises (SGLANG_TP_WORKER_FAULT) while a request runs: the server exits 1 within 10 s,
   the log names the rank and its error, the client gets an error, and no process is left.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time

import httpx
import psutil
import pytest

from sglang import Engine
from sglang.srt.distributed.tp_worker import FAULT_ENV
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import make_random_qwen3, shutdown
from sglang.test.test_utils import DEFAULT_TEST_ENV, find_free_port, popen_launch_server

register_cpu_ci(est_time=20, suite="cpu")

PROMPTS = [[5, 17, 300, 42, 9], [100, 200, 300], list(range(20, 60))]
SAMPLING = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}
COMMON = ["--skip-tokenizer-init", "--dtype", "float32", "--max-total-memory-gb", "0.5"]
EXIT_LIMIT_S = 10.0


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return make_random_qwen3(str(tmp_path_factory.mktemp("qwen3") / "m"))


def tree(pid: int) -> list:
    p = psutil.Process(pid)
    return [p] + p.children(recursive=True)


def test_two_nodes_on_loopback(model_path):
    engine = Engine(model_path=model_path, dtype="float32", skip_tokenizer_init=True, max_total_memory_gb=0.5,
                    log_level="warning")
    try:
        ref = [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=SAMPLING)]
    finally:
        shutdown(engine)
    addr = f"127.0.0.1:{find_free_port()}"
    multi = ["--model-path", model_path, *COMMON, "--tp-size", "2", "--nnodes", "2", "--dist-init-addr", addr]
    log1 = tempfile.NamedTemporaryFile(prefix="sglang-node1-", suffix=".log", delete=False)
    node1 = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", *multi, "--node-rank", "1"],
                             stdout=log1, stderr=subprocess.STDOUT, env={**DEFAULT_TEST_ENV, **os.environ})
    node0 = None
    try:
        node0 = popen_launch_server(other_args=[*multi, "--node-rank", "0"])
        r = httpx.post(f"{node0.base_url}/generate", json={"input_ids": PROMPTS, "sampling_params": SAMPLING},
                       timeout=120)
        assert r.status_code == 200, r.text
        assert [o["output_ids"] for o in r.json()] == ref
        info = httpx.get(f"{node0.base_url}/server_info", timeout=30).json()
        assert [x["tp_rank"] for x in info["memory_plan_per_rank"]] == [0, 1]
        rank1_pid = info["memory_plan_per_rank"][1]["pid"]
        assert rank1_pid in [p.pid for p in tree(node1.pid)]  # rank 1 runs under node 1
        procs = tree(node0.pid) + tree(node1.pid)
        node0.process.send_signal(signal.SIGTERM)
        assert node0.process.wait(30) == 0
        assert node1.wait(30) == 0, open(log1.name).read()[-3000:]
        gone, alive = psutil.wait_procs(procs, timeout=10)
        assert not alive, [p.cmdline() for p in alive]
        log = open(log1.name).read()
        assert "no HTTP API on this node" in log and "Uvicorn running" not in log
    finally:
        if node0 is not None:
            node0.kill()
        if node1.poll() is None:
            node1.kill()


def test_rank_that_raises_stops_the_server(model_path):
    srv = popen_launch_server(other_args=["--model-path", model_path, *COMMON, "--tp-size", "2"],
                              env={FAULT_ENV: "1:8"})  # the warmup runs 4 forwards; the request 10
    try:
        procs = tree(srv.pid)
        start = time.monotonic()
        r = httpx.post(f"{srv.base_url}/generate", json={"input_ids": PROMPTS[0], "sampling_params": SAMPLING},
                       timeout=60)
        assert r.status_code >= 500 or r.json().get("meta_info", {}).get("finish_reason", {}).get("type") == "abort"
        code = srv.process.wait(30)
        assert code == 1 and time.monotonic() - start <= EXIT_LIMIT_S, code
        log = srv.log()
        assert "TP rank 1 (pid" in log and "died: RuntimeError: injected fault" in log, log[-3000:]
        gone, alive = psutil.wait_procs(procs, timeout=10)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        srv.kill()
