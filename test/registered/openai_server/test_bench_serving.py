"""bench_serving: its statistics against numpy, its workload generator, and a short run against the live server."""

import json

import numpy as np
import pytest

from sglang.bench_serving import (
    RequestOutput,
    calculate_metrics,
    main,
    parse_args,
    percentile,
    sample_random_requests,
)
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import DEFAULT_API_KEY_FOR_TEST

register_cpu_ci(est_time=15, suite="cpu")


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


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
