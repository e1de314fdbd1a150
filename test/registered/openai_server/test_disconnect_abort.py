"""A client that goes away mid-request gets its request aborted: the KV pool returns to idle and the allocator
invariants (free + used + cached == total) hold, as reported by /server_info."""

import time

import httpx
import pytest
import requests

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=22, suite="cpu")

LONG = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 4000, "ignore_eos": True}


def scheduler_state(base_url, headers):
    info = requests.get(f"{base_url}/server_info", headers=headers, timeout=30).json()
    return info["internal_states"][0], info["memory_integrity"]


def wait_idle(base_url, headers, timeout_s=15.0):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        stats, integrity = scheduler_state(base_url, headers)
        if stats["num_running_reqs"] == 0 and stats["num_waiting_reqs"] == 0:
            return stats, integrity
        time.sleep(0.2)
    raise AssertionError(f"server still busy after {timeout_s} s: {stats}")


def test_stream_disconnect_frees_kv(base_url, headers):
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{base_url}/v1/chat/completions", json={**LONG, "stream": True}, headers=headers) as r:
            assert r.status_code == 200
            got = 0
            for line in r.iter_lines():
                if line.startswith("data: "):
                    got += 1
                if got >= 3:
                    break
        # leaving the block closes the connection mid-stream
    busy, _ = scheduler_state(base_url, headers)
    stats, integrity = wait_idle(base_url, headers)
    assert integrity == "ok"
    assert stats["num_used_tokens"] == 0 and stats["token_usage"] == 0
    assert stats["total_generated_tokens"] < 4000  # it did not run to completion


def test_non_stream_disconnect_frees_kv(base_url, headers):
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{base_url}/v1/chat/completions", json=LONG, headers=headers, timeout=1.5)
    stats, integrity = wait_idle(base_url, headers)
    assert integrity == "ok" and stats["num_used_tokens"] == 0


def test_abort_request_endpoint(base_url, headers):
    import threading

    result = {}

    def run():
        result["r"] = requests.post(f"{base_url}/generate", headers=headers, timeout=60, json={
            "text": "Tell me everything.", "rid": "abort-me",
            "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True},
        })

    t = threading.Thread(target=run)
    t.start()
    time.sleep(1.0)
    assert requests.post(f"{base_url}/abort_request", json={"rid": "abort-me"}, headers=headers).status_code == 200
    t.join(30)
    meta = result["r"].json()["meta_info"]
    assert meta["finish_reason"]["type"] == "abort" and meta["completion_tokens"] < 4000
    stats, integrity = wait_idle(base_url, headers)
    assert integrity == "ok" and stats["num_used_tokens"] == 0


def request_counters(base_url, headers):
    """(sglang:num_requests_total, sglang:num_aborted_requests_total), parsed with prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(f"{base_url}/metrics", headers=headers, timeout=30).text
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    return values["sglang:num_requests_total"], values["sglang:num_aborted_requests_total"]


def test_disconnects_are_counted_as_aborted_requests(base_url, headers):
    """Clients that close their stream after the first chunk (chat, completions, /generate) count once each in
    upstream's sglang:num_aborted_requests_total and sglang:num_requests_total; a request that completes counts
    in the total only."""
    total0, aborted0 = request_counters(base_url, headers)
    routes = [("/v1/chat/completions", {**LONG, "stream": True}),
              ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True, "stream": True}),
              ("/generate", {"text": "Once upon a time", "stream": True,
                             "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}})]
    with httpx.Client(timeout=60) as http:
        for path, body in routes * 2:
            with http.stream("POST", f"{base_url}{path}", json=body, headers=headers) as r:
                assert r.status_code == 200
                next(line for line in r.iter_lines() if line.startswith("data: "))
    wait_idle(base_url, headers)
    done = requests.post(f"{base_url}/generate", headers=headers, timeout=60,
                         json={"text": "Hi", "sampling_params": {"max_new_tokens": 2}})
    assert done.status_code == 200
    total, aborted = request_counters(base_url, headers)
    assert (total - total0, aborted - aborted0) == (2 * len(routes) + 1, 2 * len(routes))


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
