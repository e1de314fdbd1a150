"""sglang-router (PyPI, upstream's Rust router) in front of two `sglang serve` instances: the router discovers both
(it asks /health, /server_info, /model_info), routes OpenAI and native requests with the bodies it re-serializes
(upstream's defaults for fields such as return_hidden_states, separate_reasoning, log_metrics), and 64 requests all
complete with both servers serving some (counted from each server's own /metrics). How to run it: docs/router.md."""

import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=100, suite="cpu")

pytest.importorskip("sglang_router", reason="sglang-router is a test extra: pip install -e 'python[test]'")

from sglang.test.test_utils import find_free_port, kill_process_tree, openai_client, popen_launch_server  # noqa: E402

SERVER_ARGS = ["--max-total-tokens", "8192", "--max-running-requests", "16", "--chunked-prefill-size", "256",
               "--context-length", "2048", "--num-threads", "1", "--enable-metrics"]
NUM_REQUESTS = 64
ROUTER_READY_TIMEOUT_S = 60.0


def served_requests(url: str) -> int:
    text = requests.get(f"{url}/metrics", timeout=30).text
    return int(float(re.search(r"^sglang:num_requests_total\{[^}]*\} (\S+)$", text, re.M).group(1)))


@pytest.fixture(scope="module")
def workers():
    with ThreadPoolExecutor(2) as pool:  # started side by side
        launches = [pool.submit(popen_launch_server, other_args=SERVER_ARGS, env={"OMP_NUM_THREADS": "1"})
                    for _ in range(2)]
    servers = [f.result() for f in launches if f.exception() is None]
    try:
        assert len(servers) == 2, [str(f.exception()) for f in launches]
        yield servers
    finally:
        for s in servers:
            s.kill()


@pytest.fixture(scope="module")
def router(workers):
    port = find_free_port()
    log = tempfile.NamedTemporaryFile(prefix="sglang-router-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *[w.base_url for w in workers],
           "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(find_free_port()),
           "--policy", "round_robin", "--log-level", "warn"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + ROUTER_READY_TIMEOUT_S
    try:
        while True:  # ready once both workers are registered (discovery ran against our endpoints)
            assert proc.poll() is None, open(log.name).read()[-3000:]
            try:
                listed = requests.get(f"{url}/workers", timeout=5).json()
                if len(listed.get("workers", [])) == 2:
                    break
            except (requests.RequestException, ValueError):
                pass
            assert time.time() < deadline, open(log.name).read()[-3000:]
            time.sleep(0.3)
        yield url
    finally:
        kill_process_tree(proc.pid)


def test_router_discovers_both_servers(router, workers):
    listed = requests.get(f"{router}/workers", timeout=10).json()["workers"]
    assert sorted(w["url"] for w in listed) == sorted(w.base_url for w in workers)
    models = requests.get(f"{router}/v1/models", timeout=10).json()["data"]
    info = requests.get(f"{workers[0].base_url}/model_info", timeout=10).json()
    assert [m["id"] for m in models] == [info["served_model_name"]]  # the server's name, not its cache path
    assert info["served_model_name"] != info["model_path"]


def test_64_requests_complete_and_both_servers_serve(router, workers):
    before = [served_requests(w.base_url) for w in workers]
    client = openai_client(router, timeout=300)
    model = client.models.list().data[0].id

    def one(i):
        if i % 2:
            reply = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": f"Say {i}."}], max_tokens=4, temperature=0)
            return reply.choices[0].finish_reason, reply.usage.completion_tokens
        reply = client.completions.create(model=model, prompt=f"{i} plus one is", max_tokens=4, temperature=0)
        return reply.choices[0].finish_reason, reply.usage.completion_tokens

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(NUM_REQUESTS)))
    assert len(results) == NUM_REQUESTS
    assert all(reason in ("stop", "length") and 1 <= n <= 4 for reason, n in results), results
    served = [served_requests(w.base_url) - b for w, b in zip(workers, before)]
    print(f"\nrequests served per server: {served}")
    assert sum(served) == NUM_REQUESTS and all(n > 0 for n in served), served


def test_native_generate_and_streaming_through_the_router(router):
    body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    r = requests.post(f"{router}/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["completion_tokens"] == 4
    client = openai_client(router)
    model = client.models.list().data[0].id
    chunks = list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=4, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert requests.post(f"{router}/flush_cache", timeout=60).status_code == 200


def test_responses_api_through_the_router(router, workers):
    """The router's Responses route re-serializes the body with "stream": null, "priority" and (store left out)
    OpenAI's default "store": true: all accepted, store answered false (nothing is stored), streamed and not, with
    the same greedy text as the server answers directly."""
    client = openai_client(router)
    model = client.models.list().data[0].id
    kw = dict(model=model, input="Name a colour.", max_output_tokens=6, temperature=0)
    reply = client.responses.create(**kw)
    assert reply.status in ("completed", "incomplete") and reply.output_text and reply.store is False, reply
    assert 1 <= reply.usage.output_tokens <= 6
    direct = openai_client(workers[0].base_url).responses.create(**kw)
    assert reply.output_text == direct.output_text
    events = list(client.responses.create(**kw, stream=True))
    assert events[-1].type in ("response.completed", "response.incomplete"), events[-1]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == reply.output_text


def test_a_field_we_cannot_honour_is_still_refused_through_the_router(router):
    body = {"text": "Hi", "sampling_params": {"max_new_tokens": 2}, "return_hidden_states": True}
    r = requests.post(f"{router}/generate", json=body, timeout=60)
    assert r.status_code == 400 and "return_hidden_states" in r.text, r.text


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-s"]))
