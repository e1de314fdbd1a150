"""SchedulerSeries (metrics/scheduler_series.py) on hand-made stats pushes, checked against the arithmetic done here:
gen_throughput = generated-token delta / seconds between pushes (0 when nothing runs), cache_hit_rate = cached /
prompt tokens, retraction and grammar counters = deltas of the scheduler's totals, the grammar compile histogram
from the scheduler's cumulative buckets (CompileTimes), the plan's terms as memory_plan_bytes; all read back
through prometheus_client's text parser. Replicas' bucket lists add up (aggregate_stats)."""

from prometheus_client.parser import text_string_to_metric_families

from sglang.srt.constrained.compile_times import GRAMMAR_COMPILE_BUCKETS_S, CompileTimes
from sglang.srt.managers.data_parallel_controller import aggregate_stats
from sglang.srt.metrics import scheduler_series
from sglang.srt.metrics.collector import TokenizerMetricsCollector
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="cpu")

PLAN = {"budget_bytes": 1000, "terms": [{"name": "weights", "num_bytes": 600}, {"name": "kv_cache", "num_bytes": 300}]}


def samples(collector):
    text = collector.exposition().decode()
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_series_from_pushes(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(scheduler_series.time, "monotonic", lambda: clock[0])
    c = TokenizerMetricsCollector("m", {"memory_plan": PLAN, "max_total_num_tokens": 320})
    times = CompileTimes()
    for s in (0.004, 0.03, 0.03, 3.0):
        times.observe(s)
    base = {"num_running_reqs": 2, "num_waiting_reqs": 1, "num_used_tokens": 50, "token_usage": 50 / 320,
            "total_prompt_tokens": 100, "total_cached_tokens": 25, "total_generated_tokens": 10, "num_retractions": 1,
            "grammar_compiles": 2, "grammar_cache_hits": 1, **times.stats()}
    c.set_scheduler_stats(base)
    clock[0] += 0.5
    c.set_scheduler_stats({**base, "total_generated_tokens": 30, "num_retractions": 4, "grammar_cache_hits": 3})
    got = samples(c)
    assert got[("sglang:gen_throughput", ())] == 20 / 0.5
    assert got[("sglang:cache_hit_rate", ())] == 0.25
    assert got[("sglang:num_retracted_reqs", ())] == 3
    assert got[("sglang:num_retracted_requests_total", ())] == 4  # 1 from the first push (since start), 3 after
    assert got[("sglang:num_grammar_total", ())] == 2 + 1 + 2
    assert got[("sglang:num_grammar_cache_hit_total", ())] == 3
    assert got[("sglang:num_queue_reqs", ())] == 1 and got[("sglang:num_used_tokens", ())] == 50
    assert got[("sglang:max_total_num_tokens", ())] == 320
    assert got[("sglang:memory_plan_bytes", (("term", "weights"),))] == 600
    assert got[("sglang:memory_plan_bytes", (("term", "kv_cache"),))] == 300
    assert got[("sglang:memory_budget_bytes", ())] == 1000
    hist = {dict(k[1])["le"]: v for k, v in got.items() if k[0] == "sglang:grammar_compilation_time_seconds_bucket"}
    assert hist["0.01"] == 1 and hist["0.05"] == 3 and hist["2.0"] == 3 and hist["5.0"] == 4 and hist["+Inf"] == 4
    assert len(hist) == len(GRAMMAR_COMPILE_BUCKETS_S) + 1
    assert got[("sglang:grammar_compilation_time_seconds_count", ())] == 4
    assert abs(got[("sglang:grammar_compilation_time_seconds_sum", ())] - 3.064) < 1e-9
    clock[0] += 0.5
    c.set_scheduler_stats({**base, "num_running_reqs": 0, "total_generated_tokens": 31, "num_retractions": 4})
    got = samples(c)
    assert got[("sglang:gen_throughput", ())] == 0 and got[("sglang:num_retracted_reqs", ())] == 0


def test_replica_buckets_add_up():
    a, b = CompileTimes(), CompileTimes()
    a.observe(0.03)
    b.observe(0.03)
    b.observe(50.0)
    merged = aggregate_stats({0: {"token_usage": 0.0, **a.stats()}, 1: {"token_usage": 0.0, **b.stats()}})
    assert merged["grammar_compile_time_s_count"] == 3
    assert merged["grammar_compile_time_s_buckets"] == [x + y for x, y in zip(a.stats()["grammar_compile_time_s_buckets"],
                                                                               b.stats()["grammar_compile_time_s_buckets"])]


def test_spec_accept_length_over_each_interval(monkeypatch):
    """sglang:spec_accept_length = committed tokens / request verify steps between two pushes (not since start); a
    push without verify steps keeps the last value; a server without speculation reads 0."""
    clock = [0.0]
    monkeypatch.setattr(scheduler_series.time, "monotonic", lambda: clock[0])
    c = TokenizerMetricsCollector("m")
    c.set_scheduler_stats({"num_running_reqs": 1})
    assert samples(c)[("sglang:spec_accept_length", ())] == 0
    pushes = [(10, 40, 4.0), (30, 60, 1.0), (30, 60, 1.0), (34, 70, 2.5)]  # cumulative steps, tokens -> interval's
    for steps, tokens, want in pushes:
        clock[0] += 0.5
        c.set_scheduler_stats({"num_running_reqs": 1, "spec_req_steps": steps, "spec_committed_tokens": tokens})
        assert samples(c)[("sglang:spec_accept_length", ())] == want, (steps, tokens)
