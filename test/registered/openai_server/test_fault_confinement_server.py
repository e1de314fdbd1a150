"""Fault confinement through a real server (the scheduler in its own process, SGLANG_FAULT_INJECT in its env).

Penalised requests on /v1/chat/completions and /generate answer 200 (they used to kill the server). An injected
fault in each of prefill, decode, sample and detokenize fails only the request whose rid it targets, with a 500
naming the step, while concurrent requests finish with the output of a fault-free run; afterwards the server
serves, memory integrity is ok and no token stays used. A short run of scripts/fault_soak.py (streaming load with a
fault every few steps) ends with no unexpected error, no leak and exit code 0.
"""

import importlib.util
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import DEFAULT_SMALL_SERVER_ARGS, popen_launch_server

register_cpu_ci(est_time=60, suite="cpu")

STEPS = ("prefill", "decode", "sample", "detokenize")
SPEC = ";".join(f"{s}:error:rid=victim-{s}" for s in STEPS)


@pytest.fixture(scope="module")
def server():
    # fp32: greedy tokens do not depend on how requests are batched, so concurrent outputs can be compared exactly
    s = popen_launch_server(other_args=DEFAULT_SMALL_SERVER_ARGS + ["--dtype", "float32"],
                            env={"SGLANG_FAULT_INJECT": SPEC})
    yield s
    s.kill()


def generate(server, text, rid=None, **sp):
    body = {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True, **sp}}
    if rid is not None:
        body["rid"] = rid
    return requests.post(f"{server.base_url}/generate", json=body, timeout=120)


def assert_idle_and_intact(server):
    requests.post(f"{server.base_url}/flush_cache", timeout=30)
    info = requests.get(f"{server.base_url}/server_info", timeout=30).json()
    assert info["memory_integrity"] == "ok"
    assert info["internal_states"][0]["num_used_tokens"] == 0
    assert server.process.poll() is None


@pytest.mark.parametrize("sp", [{"frequency_penalty": 0.5}, {"presence_penalty": 0.5},
                                {"repetition_penalty": 1.3}])
def test_penalties_over_http(server, sp):
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **sp}
    r = requests.post(f"{server.base_url}/v1/chat/completions", json=chat, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1
    r = generate(server, "one two one two one two", **sp)
    assert r.status_code == 200, r.text
    assert len(r.json()["output_ids"]) == 8
    assert_idle_and_intact(server)


@pytest.mark.parametrize("step", STEPS)
def test_injected_fault_fails_only_its_request(server, step):
    prompts = ["The three primary colors are", "def fibonacci(n):", "Once upon a time,", "Water boils at"]
    expected = [generate(server, p).json()["output_ids"] for p in prompts]
    with ThreadPoolExecutor(len(prompts) + 1) as pool:
        victim = pool.submit(generate, server, "The quick brown fox", f"victim-{step}")
        others = [pool.submit(generate, server, p) for p in prompts]
        rv = victim.result()
        outs = [f.result() for f in others]
    assert rv.status_code == 500, rv.text
    assert f"The {step} step failed" in rv.text and "injected fault" in rv.text
    for o, e in zip(outs, expected):
        assert o.status_code == 200 and o.json()["output_ids"] == e
    # the server keeps serving: chat and generate after the fault
    r = requests.post(f"{server.base_url}/v1/chat/completions",
                      json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}, timeout=120)
    assert r.status_code == 200
    assert_idle_and_intact(server)


def test_soak_script_short_run():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "scripts", "fault_soak.py")
    spec = importlib.util.spec_from_file_location("fault_soak", path)
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    result = soak.run_soak(duration_s=10, concurrency=8, fault_every_steps=5, max_tokens=8)
    assert result["requests_failed_by_injection"] >= 1, result  # faults did fire
    assert soak.passed(result), result
