"""GET /metrics (--enable-metrics) parsed with prometheus_client's own text parser: every series of docs/metrics.md's
list is there under upstream's `sglang:` name, the counters and histograms move under requests (a KV pool of 320
tokens forces a retraction, a json_schema request a grammar compile, a repeated prompt a prefix-cache hit,
a long stream gen_throughput), and sglang:memory_plan_bytes{term} equals /server_info's memory plan term by term."""

import threading
import time

import requests
from prometheus_client.parser import text_string_to_metric_families

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import openai_client, popen_launch_server

register_cpu_ci(est_time=60, suite="cpu")

# docs/metrics.md: name -> type
LISTED = {
    "sglang:num_running_reqs": "gauge", "sglang:num_queue_reqs": "gauge", "sglang:token_usage": "gauge",
    "sglang:num_used_tokens": "gauge", "sglang:max_total_num_tokens": "gauge", "sglang:gen_throughput": "gauge",
    "sglang:cache_hit_rate": "gauge", "sglang:num_grammar_queue_reqs": "gauge", "sglang:num_retracted_reqs": "gauge",
    "sglang:spec_accept_length": "gauge",
    "sglang:time_to_first_token_seconds": "histogram", "sglang:inter_token_latency_seconds": "histogram",
    "sglang:e2e_request_latency_seconds": "histogram", "sglang:grammar_compilation_time_seconds": "histogram",
    "sglang:prompt_tokens": "counter", "sglang:generation_tokens": "counter", "sglang:cached_tokens": "counter",
    "sglang:num_requests": "counter", "sglang:num_aborted_requests": "counter",
    "sglang:num_retracted_requests": "counter", "sglang:num_grammar": "counter",
    "sglang:num_grammar_cache_hit": "counter", "sglang:memory_plan_bytes": "gauge",
    "sglang:memory_budget_bytes": "gauge",
}
PROMPT = "Write a long story about a lighthouse keeper and the ships that pass by at night."


def scrape(url):
    """{family name: family}, and {(sample name, frozenset(labels)): value}."""
    text = requests.get(f"{url}/metrics", timeout=30).text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {(s.name, frozenset(s.labels.items()) - {("model_name", s.labels.get("model_name"))}): s.value
               for f in fams.values() for s in f.samples}
    return fams, samples


def value(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_names_movement_and_plan():
    srv = popen_launch_server(other_args=["--max-total-tokens", "320", "--chunked-prefill-size", "128",
                                          "--max-running-requests", "16", "--enable-metrics"])
    try:
        url, client = srv.base_url, openai_client(srv.base_url)
        model = requests.get(f"{url}/get_model_info", timeout=10).json()["served_model_name"]
        fams, before = scrape(url)
        for name, kind in LISTED.items():  # present (and typed) before any request
            assert name in fams and fams[name].type == kind, (name, fams.get(name) and fams[name].type)

        # a long stream: gen_throughput is measured between two stats pushes while it runs
        seen_throughput = []

        def long_stream():
            for _ in client.completions.create(model=model, prompt=PROMPT, max_tokens=150, stream=True,
                                               extra_body={"ignore_eos": True}):
                pass

        t = threading.Thread(target=long_stream)
        t.start()
        while t.is_alive():
            _, s = scrape(url)
            seen_throughput.append(value(s, "sglang:gen_throughput"))
            time.sleep(0.3)
        t.join()
        assert max(seen_throughput) > 0, seen_throughput
        client.completions.create(model=model, prompt=PROMPT, max_tokens=2)  # a prefix-cache hit (before the burst)

        # 10 concurrent requests overfill the 320-token pool: decode must retract some
        threads = [threading.Thread(target=client.completions.create,
                                    kwargs=dict(model=model, prompt=f"{i}: {PROMPT}", max_tokens=40,
                                                extra_body={"ignore_eos": True})) for i in range(10)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Give a name."}], max_tokens=16,
            response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": {
                "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}})
        # the idle stats push comes when the scheduler's loop next finds nothing to run: on a loaded machine (another
        # test group beside this one) that can be later than 1 s, so wait for it up to a deadline. num_running_reqs
        # already reads 0 in the push made before the JSON request, so also wait for a push that counts its grammar
        deadline = time.monotonic() + 30

        def settled(samples):
            compiled = (value(samples, "sglang:grammar_compilation_time_seconds_count")
                        - value(before, "sglang:grammar_compilation_time_seconds_count"))
            return value(samples, "sglang:num_running_reqs") == 0 and compiled >= 1

        _, after = scrape(url)
        while not settled(after) and time.monotonic() < deadline:
            time.sleep(0.2)
            _, after = scrape(url)

        def moved(name, **labels):
            return value(after, name, **labels) - value(before, name, **labels)

        assert moved("sglang:num_requests_total") == 13
        assert moved("sglang:generation_tokens_total") >= 150 + 10 * 40
        assert moved("sglang:prompt_tokens_total") > 10 * 15
        assert moved("sglang:cached_tokens_total") > 0 and value(after, "sglang:cache_hit_rate") > 0
        for h in ("time_to_first_token_seconds", "e2e_request_latency_seconds"):
            assert moved(f"sglang:{h}_count") == 13, h
        assert moved("sglang:inter_token_latency_seconds_count") >= 149 + 10 * 39
        assert moved("sglang:num_retracted_requests_total") > 0
        assert moved("sglang:num_grammar_total") >= 1
        assert moved("sglang:grammar_compilation_time_seconds_count") >= 1
        assert moved("sglang:grammar_compilation_time_seconds_sum") > 0
        assert value(after, "sglang:num_running_reqs") == 0 and value(after, "sglang:gen_throughput") == 0

        info = requests.get(f"{url}/server_info", timeout=30).json()
        plan = info["memory_plan"]
        exported = {dict(k[1])["term"]: v for k, v in after.items() if k[0] == "sglang:memory_plan_bytes"}
        assert exported == {t["name"]: float(t["num_bytes"]) for t in plan["terms"]}
        assert value(after, "sglang:memory_budget_bytes") == plan["budget_bytes"]
        assert value(after, "sglang:max_total_num_tokens") == info["max_total_num_tokens"]
    finally:
        srv.kill()
