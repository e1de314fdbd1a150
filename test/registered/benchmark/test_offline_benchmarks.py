"""The offline benchmarks run end to end and report what they measured (speed itself is checked by running them)."""

import json

import pytest

from sglang import bench_offline_throughput, bench_one_batch
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=25, suite="cpu")

SMALL = ["--max-total-memory-gb", "1", "--chunked-prefill-size", "256"]


def test_bench_offline_throughput(tmp_path, capsys):
    out = tmp_path / "offline.jsonl"
    bench_offline_throughput.main(["--num-prompts", "6", "--input-len", "24", "--output-len", "5",
                                   "--output-file", str(out)] + SMALL)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["backend"] == "sglang"
    assert rows[0]["output_tokens"] == 6 * 5 and rows[0]["input_tokens"] == 6 * 24
    assert rows[0]["output_throughput"] > 0
    assert "output tok/s" in capsys.readouterr().out


def test_bench_one_batch(tmp_path):
    out = tmp_path / "one.jsonl"
    bench_one_batch.main(["--batch-size", "1", "3", "--input-len", "16", "--output-len", "6",
                          "--output-file", str(out)] + SMALL)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["batch_size"] for r in rows] == [1, 3]
    # the first step is the prefill (and samples token 1); tokens 2..6 take one decode step each
    assert all(r["decode_steps"] == 5 for r in rows)
    assert all(r["decode_tok_s"] > 0 and r["prefill_s"] > 0 for r in rows)


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
