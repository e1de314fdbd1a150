"""Serving benchmark for any OpenAI-compatible server (this one, vLLM, llama.cpp, ...).

Sends `--num-prompts` random prompts, streamed, to POST /v1/completions or (the `-chat` backends, e.g.
`--backend sglang-oai-chat` or `vllm-chat`) as one user message to POST /v1/chat/completions, either all at once
capped by `--max-concurrency`, or as a Poisson process at `--request-rate`, and reports request/token throughput and
TTFT / TPOT / inter-token-latency / end-to-end percentiles as text and (with --output-file) a JSON line.

    python -m sglang.bench_serving --base-url http://127.0.0.1:30000 --num-prompts 32 \
        --random-input-len 256 --random-output-len 64 --max-concurrency 32
    python -m sglang.bench_serving --backend sglang-oai-chat --num-prompts 64 --max-concurrency 32 \
        --random-input-len 100 --random-output-len 64 --cpu-burner 1 --seed 5

Prompts are token ids by default (exact input lengths, no tokenizer needed; OpenAI-compatible servers accept a
list of ints as `prompt`); `--prompt-format text` (the only format for chat) sends that many random words instead.
Output lengths are exact because `ignore_eos` is sent (except for the openai backends); token counts are the
server's, from the streamed `usage`. Use a fresh `--seed` per run: a repeated prompt hits the prefix cache.

While measuring, the server's running batch size is sampled from GET /metrics (bench_running_batch.py), and
`--cpu-burner N` keeps N busy processes running beside the server (bench_cpu_burner.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import List, Optional

from sglang.bench_cpu_burner import CpuBurner
from sglang.bench_running_batch import DEFAULT_INTERVAL_S, RunningBatchSampler
from sglang.bench_serving_client import (
    BACKENDS,
    RequestInput,
    RequestOutput,
    build_payload,
    endpoint_path,
    get_model,
    is_chat,
    send_request,
)

AIOHTTP_TIMEOUT_S = 6 * 60 * 60
# Words for --prompt-format text: common English words are about one token each in most tokenizers.
WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an they "
    "you were her she there one all we their can has been if more when will would who so no time people year way "
    "day man thing woman life child world school state family student group country problem hand part place case"
).split()
WARMUP_SEED_OFFSET = 7919  # the warm-up prompt is drawn apart from the measured ones, so none of them is cached


@dataclass
class BenchmarkMetrics:
    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    input_throughput: float
    output_throughput: float
    total_throughput: float
    concurrency: float
    mean_ttft_ms: float
    median_ttft_ms: float
    p90_ttft_ms: float
    p99_ttft_ms: float
    mean_tpot_ms: float
    median_tpot_ms: float
    p99_tpot_ms: float
    mean_itl_ms: float
    median_itl_ms: float
    p90_itl_ms: float
    p99_itl_ms: float
    mean_e2e_latency_ms: float
    median_e2e_latency_ms: float
    p99_e2e_latency_ms: float


def percentile(values: List[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]; 0.0 for no values."""
    if not values:
        return 0.0
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _mean(values: List[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def calculate_metrics(outputs: List[RequestOutput], duration_s: float) -> BenchmarkMetrics:
    ok = [o for o in outputs if o.success]
    ttft = [o.ttft_s * 1000 for o in ok]
    tpot = [(o.latency_s - o.ttft_s) / (o.output_len - 1) * 1000 for o in ok if o.output_len > 1]
    itl = [x * 1000 for o in ok for x in o.itl_s]
    e2e = [o.latency_s * 1000 for o in ok]
    total_in = sum(o.prompt_len for o in ok)
    total_out = sum(o.output_len for o in ok)
    d = max(duration_s, 1e-9)
    return BenchmarkMetrics(
        completed=len(ok),
        failed=len(outputs) - len(ok),
        duration_s=duration_s,
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        request_throughput=len(ok) / d,
        input_throughput=total_in / d,
        output_throughput=total_out / d,
        total_throughput=(total_in + total_out) / d,
        concurrency=sum(o.latency_s for o in ok) / d,
        mean_ttft_ms=_mean(ttft),
        median_ttft_ms=percentile(ttft, 50),
        p90_ttft_ms=percentile(ttft, 90),
        p99_ttft_ms=percentile(ttft, 99),
        mean_tpot_ms=_mean(tpot),
        median_tpot_ms=percentile(tpot, 50),
        p99_tpot_ms=percentile(tpot, 99),
        mean_itl_ms=_mean(itl),
        median_itl_ms=percentile(itl, 50),
        p90_itl_ms=percentile(itl, 90),
        p99_itl_ms=percentile(itl, 99),
        mean_e2e_latency_ms=_mean(e2e),
        median_e2e_latency_ms=percentile(e2e, 50),
        p99_e2e_latency_ms=percentile(e2e, 99),
    )


# ---------------------------------------------------------------------- workload
def sample_random_requests(
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: float,
    prompt_format: str,
    seed: int,
    token_min: int,
    token_max: int,
) -> List[RequestInput]:
    """Lengths uniform in [range_ratio * len, len] (range_ratio 1.0: exactly len)."""
    rng = random.Random(seed)
    reqs = []
    for _ in range(num_prompts):
        n_in = rng.randint(max(1, int(input_len * range_ratio)), max(1, input_len))
        n_out = rng.randint(max(1, int(output_len * range_ratio)), max(1, output_len))
        if prompt_format == "ids":
            prompt: object = [rng.randrange(token_min, token_max) for _ in range(n_in)]
        else:
            prompt = " ".join(rng.choice(WORDS) for _ in range(n_in))
        reqs.append(RequestInput(prompt, n_in, n_out))
    return reqs


async def request_gaps(num: int, request_rate: float, seed: int):
    """Yield before each request: immediately for rate inf, else after an exponential (Poisson) gap."""
    rng = random.Random(seed + 1)
    for i in range(num):
        yield i
        if request_rate != float("inf") and i < num - 1:
            await asyncio.sleep(rng.expovariate(request_rate))


async def benchmark(args) -> tuple[BenchmarkMetrics, List[RequestOutput], dict]:
    """Warm up, then (with the CPU burners running and the running batch sampled) send every request. Returns the
    metrics, the per-request outputs and the run's context: running batch summary, burner and client CPU."""
    import aiohttp

    base_url = args.base_url or f"http://{args.host}:{args.port}"
    url = base_url + endpoint_path(args.backend)
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    workload = (args.random_input_len, args.random_output_len, args.random_range_ratio, args.prompt_format)
    ids_range = (args.random_token_min, args.random_token_max)
    reqs = sample_random_requests(args.num_prompts, *workload, args.seed, *ids_range)
    warm = sample_random_requests(1, *workload, args.seed + WARMUP_SEED_OFFSET, *ids_range)[0]
    warm.output_len = min(8, warm.output_len)
    ignore_eos = not args.disable_ignore_eos
    timeout = aiohttp.ClientTimeout(total=AIOHTTP_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        model = args.model or await get_model(session, base_url, headers)

        async def one(req: RequestInput) -> RequestOutput:
            return await send_request(
                session, url, headers, build_payload(args.backend, model, req, ignore_eos), req.prompt_len
            )

        for _ in range(args.warmup_requests):
            w = await one(warm)
            if not w.success:
                raise SystemExit(f"Warmup request failed: {w.error}")
        sem = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None

        async def limited(req: RequestInput) -> RequestOutput:
            if sem is None:
                return await one(req)
            async with sem:
                return await one(req)

        sampler = RunningBatchSampler(session, base_url, headers, args.metrics_interval_s)
        with CpuBurner(args.cpu_burner) as burner:  # stopped (and reaped) however this block is left
            cpu0 = time.process_time()
            start = time.perf_counter()
            sampler.start()
            try:
                tasks = []
                async for i in request_gaps(len(reqs), args.request_rate, args.seed):
                    tasks.append(asyncio.ensure_future(limited(reqs[i])))
                outputs = await asyncio.gather(*tasks)
            finally:
                await sampler.stop()
            duration = time.perf_counter() - start
            client_cpu_s = time.process_time() - cpu0
    context = {
        **sampler.summary(),
        "cpu_burner": args.cpu_burner,
        "cpu_burner_cores_busy": burner.cores_busy,
        "client_cpu_s": client_cpu_s,
    }
    return calculate_metrics(outputs, duration), outputs, context


def format_report(args, m: BenchmarkMetrics, context: dict) -> str:
    rows = [
        ("Backend", f"{args.backend} ({endpoint_path(args.backend)})"),
        ("Request rate (req/s)", args.request_rate),
        ("Max concurrency", args.max_concurrency),
        ("Successful requests", m.completed),
        ("Failed requests", m.failed),
        ("Benchmark duration (s)", f"{m.duration_s:.2f}"),
        ("Total input tokens", m.total_input_tokens),
        ("Total generated tokens", m.total_output_tokens),
        ("Request throughput (req/s)", f"{m.request_throughput:.2f}"),
        ("Input token throughput (tok/s)", f"{m.input_throughput:.2f}"),
        ("Output token throughput (tok/s)", f"{m.output_throughput:.2f}"),
        ("Total token throughput (tok/s)", f"{m.total_throughput:.2f}"),
        ("Concurrency", f"{m.concurrency:.2f}"),
        ("TTFT mean / median / p90 / p99 (ms)",
         f"{m.mean_ttft_ms:.1f} / {m.median_ttft_ms:.1f} / {m.p90_ttft_ms:.1f} / {m.p99_ttft_ms:.1f}"),
        ("TPOT mean / median / p99 (ms)", f"{m.mean_tpot_ms:.1f} / {m.median_tpot_ms:.1f} / {m.p99_tpot_ms:.1f}"),
        ("ITL mean / median / p90 / p99 (ms)",
         f"{m.mean_itl_ms:.1f} / {m.median_itl_ms:.1f} / {m.p90_itl_ms:.1f} / {m.p99_itl_ms:.1f}"),
        ("E2E latency mean / median / p99 (ms)",
         f"{m.mean_e2e_latency_ms:.1f} / {m.median_e2e_latency_ms:.1f} / {m.p99_e2e_latency_ms:.1f}"),
        ("Running batch mean / p50 / min / max", running_batch_text(context)),
        ("CPU burner processes (cores busy)", f"{context['cpu_burner']} ({context['cpu_burner_cores_busy']:.2f})"),
        ("Benchmark client CPU (s)", f"{context['client_cpu_s']:.2f}"),
    ]
    width = max(len(k) for k, _ in rows) + 2
    lines = ["=" * 20 + " Serving benchmark " + "=" * 20]
    lines += [f"{k + ':':<{width}}{v}" for k, v in rows]
    lines.append("=" * 59)
    return "\n".join(lines)


def running_batch_text(context: dict) -> str:
    if not context["running_batch_samples"]:
        return f"n/a: {context['running_batch_note']}"
    return (f"{context['running_batch_mean']:.1f} / {context['running_batch_p50']:.1f} / "
            f"{context['running_batch_min']:.0f} / {context['running_batch_max']:.0f} "
            f"({context['running_batch_samples']} samples of GET /metrics)")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m sglang.bench_serving", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=BACKENDS, default="sglang",
                   help="Server kind: the '-chat' ones POST one user message to /v1/chat/completions, the others a "
                        "prompt to /v1/completions; the 'openai' ones omit ignore_eos.")
    p.add_argument("--base-url", default=None, help="Server URL, e.g. http://127.0.0.1:30000 (overrides host/port).")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--model", default=None, help="Model name to send. Default: the first of GET /v1/models.")
    p.add_argument("--api-key", default=None, help="Bearer token. Default: $OPENAI_API_KEY if set.")
    p.add_argument("--dataset-name", choices=["random"], default="random")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--random-input-len", type=int, default=256)
    p.add_argument("--random-output-len", type=int, default=64)
    p.add_argument("--random-range-ratio", type=float, default=1.0,
                   help="Lengths are uniform in [ratio * len, len]; 1.0 makes them exact.")
    p.add_argument("--random-token-min", type=int, default=1000, help="Smallest random token id (ids format).")
    p.add_argument("--random-token-max", type=int, default=20000, help="Largest random token id + 1 (ids format).")
    p.add_argument("--prompt-format", choices=["ids", "text"], default=None,
                   help="ids: random token ids (completions only); text: --random-input-len random words. "
                        "Default: ids for completions, text for chat.")
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="Requests per second (Poisson arrivals); inf sends all at once.")
    p.add_argument("--max-concurrency", type=int, default=None, help="At most this many requests in flight.")
    p.add_argument("--disable-ignore-eos", action="store_true", help="Let requests stop at EOS.")
    p.add_argument("--warmup-requests", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--output-file", default=None, help="Append the results as one JSON line to this file.")
    p.add_argument("--cpu-burner", type=int, default=0, metavar="N",
                   help="Run N busy processes (a pure Python loop each) from after the warm-up until the last "
                        "request ends: a busy neighbour competing with the server for cores.")
    p.add_argument("--metrics-interval-s", type=float, default=DEFAULT_INTERVAL_S,
                   help="Sample the server's running batch size from GET /metrics this often while measuring "
                        "(sglang:num_running_reqs, needs --enable-metrics; vllm:num_requests_running); 0: off.")
    args = p.parse_args(argv)
    if args.prompt_format is None:
        args.prompt_format = "text" if is_chat(args.backend) else "ids"
    if is_chat(args.backend) and args.prompt_format != "text":
        p.error(f"--backend {args.backend} sends chat messages: use --prompt-format text (random words).")
    if args.cpu_burner < 0 or args.metrics_interval_s < 0:
        p.error("--cpu-burner and --metrics-interval-s must be >= 0.")
    if not 0.0 < args.random_range_ratio <= 1.0:
        p.error("--random-range-ratio must be in (0, 1].")
    if args.num_prompts < 1 or args.random_input_len < 1 or args.random_output_len < 1:
        p.error("--num-prompts, --random-input-len and --random-output-len must be positive.")
    return args


def run_benchmark(args: argparse.Namespace) -> dict:
    metrics, outputs, context = asyncio.run(benchmark(args))
    print(format_report(args, metrics, context))
    errors = sorted({o.error for o in outputs if not o.success})
    for e in errors[:5]:
        print(f"error: {e}", file=sys.stderr)
    result = {
        "backend": args.backend,
        "base_url": args.base_url or f"http://{args.host}:{args.port}",
        "num_prompts": args.num_prompts,
        "random_input_len": args.random_input_len,
        "random_output_len": args.random_output_len,
        "request_rate": args.request_rate if args.request_rate != float("inf") else "inf",
        "max_concurrency": args.max_concurrency,
        "seed": args.seed,
        **asdict(metrics),
        **context,
    }
    if args.output_file:
        with open(args.output_file, "a") as f:
            f.write(json.dumps(result) + "\n")
    return result


def main(argv: Optional[List[str]] = None) -> int:
    result = run_benchmark(parse_args(argv))
    return 0 if result["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
