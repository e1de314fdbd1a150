"""bench_serving: its statistics against numpy, its workload generator, the running-batch gauge parser, and short
runs against the live server (completions; streaming chat with the running batch sampled and a CPU burner)."""

import asyncio
import http.server
import json
import threading

import numpy as np
import psutil
import pytest

from sglang.bench_running_batch import RunningBatchSampler, parse_running_reqs
from sglang.bench_serving import (
    RequestOutput,
    benchmark,
    calculate_metrics,
    format_report,
    main,
    parse_args,
    percentile,
    sample_random_requests,
)
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import DEFAULT_API_KEY_FOR_TEST

register_cpu_ci(est_time=20, suite="cpu")


@pytest.mark.parametrize("q", [0, 1, 50, 90, 99, 100])
def test_percentile_matches_numpy(q):
    xs = list(np.random.default_rng(0).exponential(size=37))
    assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert percentile([], q) == 0.0


def test_calculate_metrics():
    outs = [
        RequestOutput(success=True, prompt_len=10, output_len=5, ttft_s=0.1, latency_s=0.5, itl_s=[0.1] * 4),
        RequestOutput(success=True, prompt_len=20, output_len=3, ttft_s=0.3, latency_s=0.7, itl_s=[0.2, 0.2]),
        RequestOutput(success=False, error="HTTP 503"),
    ]
    m = calculate_metrics(outs, duration_s=2.0)
    assert (m.completed, m.failed, m.total_input_tokens, m.total_output_tokens) == (2, 1, 30, 8)
    assert m.output_throughput == pytest.approx(4.0) and m.request_throughput == pytest.approx(1.0)
    assert m.mean_ttft_ms == pytest.approx(200.0) and m.median_ttft_ms == pytest.approx(200.0)
    assert m.mean_tpot_ms == pytest.approx((100.0 + 200.0) / 2)
    assert m.mean_itl_ms == pytest.approx(np.mean([100] * 4 + [200] * 2))
    assert m.concurrency == pytest.approx(0.6)


def test_random_workload():
    reqs = sample_random_requests(8, 32, 16, 1.0, "ids", seed=3, token_min=100, token_max=200)
    assert all(len(r.prompt) == r.prompt_len == 32 and r.output_len == 16 for r in reqs)
    assert all(100 <= t < 200 for r in reqs for t in r.prompt)
    varied = sample_random_requests(50, 32, 16, 0.5, "text", seed=3, token_min=0, token_max=1)
    assert all(16 <= r.prompt_len <= 32 and 8 <= r.output_len <= 16 for r in varied)
    assert len(varied[0].prompt.split()) == varied[0].prompt_len
    assert sample_random_requests(4, 8, 4, 1.0, "ids", 7, 0, 50)[0].prompt == \
        sample_random_requests(4, 8, 4, 1.0, "ids", 7, 0, 50)[0].prompt


def test_bad_args_exit():
    with pytest.raises(SystemExit):
        parse_args(["--random-range-ratio", "0"])
    with pytest.raises(SystemExit):  # chat messages are text
        parse_args(["--backend", "vllm-chat", "--prompt-format", "ids"])
    assert parse_args(["--backend", "sglang-oai-chat"]).prompt_format == "text"
    assert parse_args([]).prompt_format == "ids"


def test_parse_running_reqs():
    sglang_text = (
        "# HELP sglang:num_running_reqs Requests running in the batch.\n# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{model_name="m"} 31.0\nsglang:num_running_reqs_other 5.0\n'
        'sglang:num_queue_reqs{model_name="m"} 2.0\n'
    )
    assert parse_running_reqs(sglang_text) == 31.0
    vllm_text = ('vllm:num_requests_running{engine="0",model_name="a b"} 7.0 1700000000\n'
                 'vllm:num_requests_running{engine="1",model_name="a b"} 9.0\n')
    assert parse_running_reqs(vllm_text) == 16.0  # summed over engines; a trailing timestamp ignored
    assert parse_running_reqs("sglang:num_queue_reqs 3.0\n") is None


def test_sampler_without_metrics_notes_and_gives_no_samples():
    class NoMetrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(404)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NoMetrics)
    threading.Thread(target=srv.serve_forever, daemon=True).start()

    async def sample():
        import aiohttp

        async with aiohttp.ClientSession() as session:
            sampler = RunningBatchSampler(session, f"http://127.0.0.1:{srv.server_port}", {}, interval_s=0.02)
            sampler.start()
            await asyncio.sleep(0.2)
            await sampler.stop()
            return sampler.summary()

    try:
        summary = asyncio.run(sample())
    finally:
        srv.shutdown()
    assert summary["running_batch_samples"] == 0 and summary["running_batch_mean"] is None
    assert "HTTP 404" in summary["running_batch_note"] and "--enable-metrics" in summary["running_batch_note"]


def test_run_against_server(base_url, tmp_path, capsys):
    out = tmp_path / "bench.jsonl"
    rc = main([
        "--base-url", base_url, "--api-key", DEFAULT_API_KEY_FOR_TEST, "--num-prompts", "4",
        "--random-input-len", "16", "--random-output-len", "8", "--max-concurrency", "4", "--output-file", str(out),
    ])
    assert rc == 0
    assert "Output token throughput" in capsys.readouterr().out
    result = json.loads(out.read_text().splitlines()[-1])
    assert result["completed"] == 4 and result["total_output_tokens"] == 32 and result["total_input_tokens"] == 64
    assert result["output_throughput"] > 0 and result["p99_ttft_ms"] >= result["median_ttft_ms"] > 0


def busy_children() -> set:
    """Our child processes less multiprocessing's idle resource tracker (started once by the spawn context)."""
    out = set()
    for c in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(c.cmdline()):
                out.add(c.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def chat_prompt(tokenizer, text: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)


def test_chat_stream_with_burner_against_server(base_url, tokenizer):
    """Streaming chat through /v1/chat/completions with one CPU burner: the server's token counts against the HF
    tokenizer's chat template, TTFT + ITL gaps within each request's latency, the running batch sampled from
    /metrics within [1, concurrency], and the burner gone afterwards."""
    n, words, out_len, seed = 4, 20, 48, 20
    args = parse_args([
        "--backend", "sglang-oai-chat", "--base-url", base_url, "--api-key", DEFAULT_API_KEY_FOR_TEST,
        "--num-prompts", str(n), "--random-input-len", str(words), "--random-output-len", str(out_len),
        "--max-concurrency", str(n), "--seed", str(seed), "--cpu-burner", "1", "--metrics-interval-s", "0.05",
    ])
    children_before = busy_children()
    m, outputs, context = asyncio.run(benchmark(args))
    assert busy_children() <= children_before  # the burner was stopped and reaped

    prompts = [r.prompt for r in sample_random_requests(n, words, out_len, 1.0, "text", seed, 0, 1)]
    expected_prompt_tokens = [
        len(tokenizer.encode(chat_prompt(tokenizer, p), add_special_tokens=False)) for p in prompts
    ]
    assert (m.completed, m.failed) == (n, 0)
    assert [o.prompt_len for o in outputs] == expected_prompt_tokens
    assert m.total_output_tokens == n * out_len and all(o.output_len == out_len for o in outputs)
    for o in outputs:
        assert o.generated_text and 0 < o.ttft_s < o.latency_s
        assert 1 <= len(o.itl_s) <= out_len - 1 and min(o.itl_s) >= 0
        assert o.ttft_s + sum(o.itl_s) <= o.latency_s + 1e-6  # the last text chunk arrives before the stream ends
    assert 0 < m.median_itl_ms <= m.p99_itl_ms < 1000 * max(o.latency_s for o in outputs)
    assert 0 < m.median_ttft_ms <= m.p99_ttft_ms and 0 < m.median_tpot_ms <= m.p99_tpot_ms
    assert m.output_throughput == pytest.approx(n * out_len / m.duration_s)

    assert context["running_batch_samples"] >= 1, context
    assert 1 <= context["running_batch_max"] <= n and context["running_batch_min"] >= 0
    assert context["running_batch_min"] <= context["running_batch_p50"] <= context["running_batch_max"]
    assert context["cpu_burner"] == 1 and 0 < context["cpu_burner_cores_busy"] <= psutil.cpu_count() + 0.1
    report = format_report(args, m, context)
    assert "/v1/chat/completions" in report and "samples of GET /metrics" in report


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
