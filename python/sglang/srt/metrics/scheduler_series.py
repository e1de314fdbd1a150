"""The /metrics series derived from the scheduler's stats pushes and its memory plan (upstream's `sglang:` names).

The scheduler process pushes its live stats (Scheduler.get_stats: gauges and cumulative totals) every 0.5 s while
busy and once when it goes idle; `SchedulerSeries.update` turns one push into:
    gauges      num_used_tokens, max_total_num_tokens, num_grammar_queue_reqs, cache_hit_rate (cached / prompt
                tokens since start), gen_throughput (generated tokens per second between two pushes; 0 when
                nothing runs), num_retracted_reqs (retractions between two pushes), spec_accept_length (tokens a
                request committed per speculative verify step, over the verify steps between two pushes; kept when
                none ran, 0 before the first or without speculation)
    counters    num_retracted_requests_total, num_grammar_total (compiles + cache hits), num_grammar_cache_hit_total
                (the deltas of the scheduler's cumulative totals)
    histogram   grammar_compilation_time_seconds, exported from the scheduler's cumulative buckets
                (constrained/compile_times.py) by a custom collector
and the plan the scheduler built at startup becomes sglang:memory_plan_bytes{term=...} (one per plan term) and
sglang:memory_budget_bytes.
"""

from __future__ import annotations

import time
from typing import Optional

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import HistogramMetricFamily

from sglang.srt.constrained.compile_times import GRAMMAR_COMPILE_BUCKETS_S


class _GrammarCompileHistogram:
    """A prometheus collector over the last pushed cumulative buckets."""

    def __init__(self, model_name: str):
        self.model_name = model_name
        self.buckets = [0] * len(GRAMMAR_COMPILE_BUCKETS_S)
        self.sum_s, self.count = 0.0, 0

    def collect(self):
        h = HistogramMetricFamily("sglang:grammar_compilation_time_seconds",
                                  "Histogram of grammar compilation time in seconds.", labels=["model_name"])
        pairs = [(repr(float(le)), c) for le, c in zip(GRAMMAR_COMPILE_BUCKETS_S, self.buckets)]
        h.add_metric([self.model_name], pairs + [("+Inf", self.count)], self.sum_s)
        yield h

    def describe(self):
        return []


class SchedulerSeries:
    def __init__(self, registry: CollectorRegistry, model_name: str, ready_info: Optional[dict] = None):
        labels, r = ["model_name"], registry

        def gauge(name, doc):
            return Gauge(name, doc, labels, registry=r).labels(model_name=model_name)

        def counter(name, doc):
            return Counter(name, doc, labels, registry=r).labels(model_name=model_name)

        self.num_used_tokens = gauge("sglang:num_used_tokens", "KV pool tokens in use.")
        self.max_total_num_tokens = gauge("sglang:max_total_num_tokens", "Tokens the KV pool holds (the plan's).")
        self.num_grammar_queue_reqs = gauge("sglang:num_grammar_queue_reqs", "Requests waiting for a grammar compile.")
        self.cache_hit_rate = gauge("sglang:cache_hit_rate", "Prompt tokens served from the prefix cache / prompt "
                                                             "tokens, since the server started (0..1).")
        self.gen_throughput = gauge("sglang:gen_throughput", "Generated tokens per second over the last stats "
                                                             "interval (0 when idle).")
        self.num_retracted_reqs = gauge("sglang:num_retracted_reqs", "Requests retracted in the last stats interval.")
        self.spec_accept_length = gauge("sglang:spec_accept_length", "Speculative decoding: tokens a request "
                                        "committed per verify step (accepted proposals + the target's own token), "
                                        "over the verify steps of the last stats interval that had any.")
        self.num_retracted_total = counter("sglang:num_retracted_requests",
                                           "Requests retracted (their KV freed, re-prefilled later) since start.")
        self.num_grammar_total = counter("sglang:num_grammar", "Grammar requests (compiles + cache hits).")
        self.num_grammar_cache_hit = counter("sglang:num_grammar_cache_hit", "Grammar requests served from the "
                                                                              "compiled-grammar cache.")
        self.grammar_hist = _GrammarCompileHistogram(model_name)
        r.register(self.grammar_hist)
        plan_bytes = Gauge("sglang:memory_plan_bytes", "Bytes of one term of the memory plan the scheduler built "
                           "(docs/memory_planning.md).", labels + ["term"], registry=r)
        budget = gauge("sglang:memory_budget_bytes", "The memory plan's budget (bytes).")
        plan = (ready_info or {}).get("memory_plan") or {}
        for term in plan.get("terms", []):
            plan_bytes.labels(model_name=model_name, term=term["name"]).set(term["num_bytes"])
        if plan:
            budget.set(plan.get("budget_bytes", 0))
        self.max_total_num_tokens.set((ready_info or {}).get("max_total_num_tokens") or 0)
        self._last: dict = {}
        self._last_time: Optional[float] = None

    def _delta(self, stats: dict, key: str) -> int:
        now, before = stats.get(key, 0), self._last.get(key, 0)
        return max(now - before, 0)

    def update(self, stats: dict) -> None:
        now = time.monotonic()
        self.num_used_tokens.set(stats.get("num_used_tokens", 0))
        if stats.get("max_total_num_tokens"):
            self.max_total_num_tokens.set(stats["max_total_num_tokens"])
        self.num_grammar_queue_reqs.set(stats.get("num_grammar_waiting_reqs", 0))
        prompt = stats.get("total_prompt_tokens", 0)
        self.cache_hit_rate.set(stats.get("total_cached_tokens", 0) / prompt if prompt else 0.0)
        generated = self._delta(stats, "total_generated_tokens")
        if not stats.get("num_running_reqs"):
            self.gen_throughput.set(0.0)
        elif self._last_time is not None and now > self._last_time:
            self.gen_throughput.set(generated / (now - self._last_time))
        retracted = self._delta(stats, "num_retractions")
        self.num_retracted_reqs.set(retracted)
        self.num_retracted_total.inc(retracted)
        steps = self._delta(stats, "spec_req_steps")
        if steps:
            self.spec_accept_length.set(self._delta(stats, "spec_committed_tokens") / steps)
        compiles, hits = self._delta(stats, "grammar_compiles"), self._delta(stats, "grammar_cache_hits")
        self.num_grammar_total.inc(compiles + hits)
        self.num_grammar_cache_hit.inc(hits)
        if "grammar_compile_time_s_buckets" in stats:
            self.grammar_hist.buckets = list(stats["grammar_compile_time_s_buckets"])
            self.grammar_hist.sum_s = stats.get("grammar_compile_time_s_sum", 0.0)
            self.grammar_hist.count = stats.get("grammar_compile_time_s_count", 0)
        self._last, self._last_time = dict(stats), now
