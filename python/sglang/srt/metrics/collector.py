"""Prometheus metrics of the HTTP server, in upstream's `sglang:` namespace.

Live scheduler state (running/queued requests, KV token usage) arrives as stats pushes from the scheduler process;
token counters and latency histograms are observed in the TokenizerManager when outputs arrive. Every server owns
its own CollectorRegistry, so several servers (or tests) in one process never clash.
"""

from __future__ import annotations

from typing import Any, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sglang.srt.metrics.scheduler_series import SchedulerSeries

# Bucket edges in seconds; CPU serving is slower than upstream's GPU-oriented buckets, so they reach further.
TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS_S = (0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
E2E_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)


class TokenizerMetricsCollector:
    def __init__(self, model_name: str, ready_info: Optional[dict] = None):
        """`ready_info`: the scheduler's startup info; its memory plan becomes sglang:memory_plan_bytes."""
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry

        def bind(metric):
            return metric.labels(model_name=model_name)

        self.num_running_reqs = bind(Gauge("sglang:num_running_reqs", "Requests running in the batch.", labels, registry=r))
        self.num_queue_reqs = bind(Gauge("sglang:num_queue_reqs", "Requests waiting in the queue.", labels, registry=r))
        self.token_usage = bind(Gauge("sglang:token_usage", "Fraction of the KV pool in use (0..1).", labels, registry=r))
        self.prompt_tokens = bind(Counter("sglang:prompt_tokens", "Prompt tokens of finished requests.", labels, registry=r))
        self.generation_tokens = bind(Counter("sglang:generation_tokens", "Generated tokens.", labels, registry=r))
        self.cached_tokens = bind(Counter("sglang:cached_tokens", "Prompt tokens served from the prefix cache.", labels, registry=r))
        self.num_requests = bind(Counter("sglang:num_requests", "Finished requests.", labels, registry=r))
        self.num_aborted_requests = bind(Counter("sglang:num_aborted_requests", "Aborted requests.", labels, registry=r))
        self.time_to_first_token = bind(
            Histogram("sglang:time_to_first_token_seconds", "Time to first token.", labels, buckets=TTFT_BUCKETS_S, registry=r)
        )
        self.inter_token_latency = bind(
            Histogram("sglang:inter_token_latency_seconds", "Time between tokens.", labels, buckets=ITL_BUCKETS_S, registry=r)
        )
        self.e2e_request_latency = bind(
            Histogram("sglang:e2e_request_latency_seconds", "Request latency.", labels, buckets=E2E_BUCKETS_S, registry=r)
        )

        self.scheduler_series = SchedulerSeries(r, model_name, ready_info)  # scheduler_series.py

    def set_scheduler_stats(self, stats: dict) -> None:
        self.scheduler_series.update(stats)
        self.num_running_reqs.set(stats.get("num_running_reqs", 0))
        self.num_queue_reqs.set(stats.get("num_waiting_reqs", stats.get("num_queue_reqs", 0)))
        self.token_usage.set(stats.get("token_usage", 0.0))

    def observe_tokens(self, num_new_tokens: int, is_first: bool, since_last_s: float) -> None:
        """`since_last_s`: time since the request was sent (first output) or since its previous output."""
        if num_new_tokens <= 0:
            return
        self.generation_tokens.inc(num_new_tokens)
        if is_first:
            self.time_to_first_token.observe(since_last_s)
            num_new_tokens -= 1  # the first token's latency is the TTFT, not an inter-token gap
            since_last_s = 0.0
        for _ in range(num_new_tokens):
            self.inter_token_latency.observe(since_last_s / max(num_new_tokens, 1))

    def observe_output(self, state: Any, out: Any, now: float) -> None:
        """One ReqOutput delta of a request still awaited (state: req_state.ReqState; out: io_struct.ReqOutput)."""
        n = len(out.new_token_ids)
        self.observe_tokens(n, is_first=state.num_output_tokens == 0, since_last_s=now - state.last_time)
        if n:
            state.last_time = now
            state.num_output_tokens += n
        if out.finished:
            aborted = (out.finish_reason or {}).get("type") == "abort"
            self.observe_finished(out.prompt_tokens, out.cached_tokens, now - state.created_time, aborted)
            state.counted = True

    def observe_abandoned(self, state: Any, prompt_tokens: int, now: float) -> None:
        """A request its client left before it finished (a disconnect, a cancelled task): aborted here, so the
        scheduler's abort confirmation finds no state to report to -- counted now, once."""
        if not state.counted:
            self.observe_finished(prompt_tokens, 0, now - state.created_time, aborted=True)
            state.counted = True

    def observe_finished(self, prompt_tokens: int, cached_tokens: int, e2e_s: float, aborted: bool) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.cached_tokens.inc(cached_tokens)
        self.num_requests.inc()
        if aborted:
            self.num_aborted_requests.inc()
        self.e2e_request_latency.observe(e2e_s)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
