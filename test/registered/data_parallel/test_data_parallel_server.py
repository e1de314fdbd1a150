"""`sglang serve --dp-size 2` end to end, with the real `openai` client: both replicas serve (round robin, and
shortest_queue under concurrent load), greedy tokens equal HF transformers' fp32 reference (what dp=1 is held to),
each replica has its own memory plan (equal to `sglang plan --dp-size 2` with the same flags and the replica's
measured terms), aborts free the owning replica, a SIGKILLed replica makes the server exit non-zero naming it, and
SIGTERM leaves no process behind. Replicas run one OpenMP thread each (2 cores)."""

import json
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import requests

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=170, suite="cpu")

from sglang.test.engine_fixtures import PROMPTS, default_model_dir  # noqa: E402
from sglang.test.hf_greedy_reference import release, teacher_forced_choices  # noqa: E402
from sglang.test.test_utils import openai_client, popen_launch_server  # noqa: E402

CAP_GB = 1.5
DP_ARGS = ["--dp-size", "2", "--dtype", "float32", "--max-total-memory-gb", str(CAP_GB),
           "--max-running-requests", "16", "--chunked-prefill-size", "256", "--context-length", "2048",
           "--enable-metrics"]
ENV = {"OMP_NUM_THREADS": "1"}
FATAL_EXIT_LIMIT_S = 10.0
MAX_NEW_TOKENS = 12


def info(srv) -> dict:
    return requests.get(f"{srv.base_url}/server_info", timeout=60).json()


def replica_pids(srv) -> list:
    """The scheduler processes, in dp_rank order (the server logs their pids when it starts them)."""
    line = next(x for x in srv.log().splitlines() if "data-parallel replicas (pids" in x)
    return [int(p) for p in line.split("(pids ")[1].split(")")[0].split(", ")]


def generated_per_replica(srv) -> list:
    return [s["total_generated_tokens"] for s in info(srv)["internal_states"]]


def assert_idle_and_intact(srv):
    assert requests.post(f"{srv.base_url}/flush_cache", timeout=30).status_code == 200
    i = info(srv)
    assert i["memory_integrity"] == "ok", i["memory_integrity"]
    for r in i["replicas"]:
        assert r["memory_integrity"] == "ok" and r["internal_states"][0]["num_used_tokens"] == 0, r
        assert r["dispatcher"]["num_unfinished_requests"] == 0, r


@pytest.fixture(scope="module")
def server():
    srv = popen_launch_server(other_args=DP_ARGS, env=ENV)
    print(f"\ndp=2 server ready in {srv.startup_s:.1f} s")
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server.base_url)


def test_each_replica_has_its_own_plan_matching_sglang_plan(server):
    from sglang.cli.plan import run

    i = info(server)
    assert i["dp_size"] == 2 and len(i["replicas"]) == 2 and len(i["internal_states"]) == 2
    for r in i["replicas"]:
        plan = r["memory_plan"]
        assert plan["budget_bytes"] == int(CAP_GB * 2**30), "the cap is per replica"
        measured = {t["name"]: t["num_bytes"] for t in plan["terms"] if t["source"] == "measured"}
        flags = ["--device", "cpu", *DP_ARGS, *[f"--measured={k}={v}" for k, v in measured.items()], "--json"]
        status, dry, text = run([f for f in flags if f != "--enable-metrics"])
        assert status == 0, text
        assert dry["plan"]["max_total_num_tokens"] == plan["max_total_num_tokens"] == r["max_total_num_tokens"]
    assert i["max_total_num_tokens"] == sum(r["max_total_num_tokens"] for r in i["replicas"])


def test_round_robin_serves_from_both_replicas_with_the_openai_client(server, client):
    before = generated_per_replica(server)
    model = client.models.list().data[0].id
    completion_tokens = 0
    for k in range(4):
        reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": f"Count to {k}"}],
                                               max_tokens=6, temperature=0)
        completion_tokens += reply.usage.completion_tokens
    chunks = list(client.completions.create(model=model, prompt="Once upon a time", max_tokens=6, stream=True))
    assert "".join(c.choices[0].text for c in chunks)
    after = generated_per_replica(server)
    grew = [a - b for a, b in zip(after, before)]
    assert all(g > 0 for g in grew), grew
    assert sum(grew) >= completion_tokens + 1
    dispatched = [r["dispatcher"]["num_dispatched_requests"] for r in info(server)["replicas"]]
    assert abs(dispatched[0] - dispatched[1]) <= 1, dispatched  # strict alternation
    metrics = requests.get(f"{server.base_url}/metrics", timeout=30).text
    assert 'sglang:num_requests_total{model_name=' in metrics
    assert_idle_and_intact(server)


def test_greedy_tokens_equal_the_fp32_reference(server):
    import torch
    from transformers import AutoTokenizer

    model_dir = default_model_dir()
    ids = [AutoTokenizer.from_pretrained(model_dir).encode(p) for p in PROMPTS]

    def one(prompt_ids):
        body = {"input_ids": prompt_ids, "sampling_params": {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS,
                                                             "ignore_eos": True}}
        return requests.post(f"{server.base_url}/generate", json=body, timeout=300).json()["output_ids"]

    with ThreadPoolExecutor(len(ids)) as pool:  # concurrent: both replicas batch several requests
        got = list(pool.map(one, ids))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a shared 2-core machine: OpenMP barriers across busy cores cost 10x
    try:
        # HF's greedy pick after every prefix of prompt + our tokens (one forward per request, not 12 generate
        # steps): equal to ours exactly when ours are HF's greedy continuation
        want = teacher_forced_choices(model_dir, ids, got)
    finally:
        release(model_dir)
        torch.set_num_threads(threads)
    assert all(len(g) == MAX_NEW_TOKENS for g in got)
    assert got == want
    assert_idle_and_intact(server)


def test_abort_frees_the_owning_replica(server, client):
    model = client.models.list().data[0].id
    for _ in range(2):  # one stream on each replica (round robin), both closed early
        stream = client.completions.create(model=model, prompt="Count to a thousand:", max_tokens=2000, stream=True,
                                           extra_body={"ignore_eos": True})
        next(iter(stream))
        stream.close()
    deadline = time.time() + 30
    while time.time() < deadline and any(r["dispatcher"]["num_unfinished_requests"] for r in info(server)["replicas"]):
        time.sleep(0.2)
    body = {"text": "Count to a thousand:", "rid": "dp-abort-me",
            "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}}
    result = {}
    t = threading.Thread(target=lambda: result.update(r=requests.post(f"{server.base_url}/generate", json=body,
                                                                      timeout=120)))
    t.start()
    time.sleep(1.0)
    assert requests.post(f"{server.base_url}/abort_request", json={"rid": "dp-abort-me"}, timeout=30).status_code == 200
    t.join(60)
    assert result["r"].json()["meta_info"]["finish_reason"]["type"] == "abort"
    assert_idle_and_intact(server)


def test_sigterm_stops_every_process(server):
    children = [psutil.Process(p) for p in server.child_pids()]
    assert set(replica_pids(server)) <= {c.pid for c in children}
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(30) == 0
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, [p.cmdline() for p in alive]


def test_shortest_queue_spreads_load_and_a_killed_replica_stops_the_server():
    srv = popen_launch_server(other_args=[*DP_ARGS, "--load-balance-method", "shortest_queue"], env=ENV)
    try:
        children = [psutil.Process(p) for p in srv.child_pids()]
        body = {"text": "Tell me a story.", "sampling_params": {"max_new_tokens": 24, "ignore_eos": True}}
        with ThreadPoolExecutor(6) as pool:  # concurrent: each goes to the replica with fewer unfinished requests
            replies = list(pool.map(lambda _: requests.post(f"{srv.base_url}/generate", json=body, timeout=300),
                                    range(6)))
        assert all(r.status_code == 200 for r in replies)
        assert all(g > 0 for g in generated_per_replica(srv))
        assert_idle_and_intact(srv)

        events = []
        stream_body = {"prompt": "Count to a million:", "max_tokens": 1500, "ignore_eos": True, "stream": True}

        def stream():
            try:
                with requests.post(f"{srv.base_url}/v1/completions", json=stream_body, stream=True, timeout=60) as r:
                    events.extend(line for line in r.iter_lines(decode_unicode=True) if line)
            except requests.RequestException as e:
                events.append(f"cut: {e}")

        threads = [threading.Thread(target=stream) for _ in range(2)]  # one on each replica
        for t in threads:
            t.start()
        deadline = time.time() + 60
        while len(events) < 4 and time.time() < deadline:
            time.sleep(0.05)
        victim = replica_pids(srv)[1]
        psutil.Process(victim).send_signal(signal.SIGKILL)
        killed_at = time.perf_counter()
        code = srv.process.wait(30)
        exit_s = time.perf_counter() - killed_at
        for t in threads:
            t.join(30)
        print(f"\nserver exited with {code} {exit_s:.2f} s after replica 1 was killed")
        assert code != 0 and exit_s < FATAL_EXIT_LIMIT_S
        assert f"data-parallel replica 1 (scheduler pid {victim}) was killed by SIGKILL" in srv.log()
        errors = [json.loads(e[6:])["error"] for e in events if e.startswith("data: {") and '"error"' in e]
        assert errors and "replica 1" in errors[0]["message"], events[-4:]
        gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        srv.kill()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-s"]))
