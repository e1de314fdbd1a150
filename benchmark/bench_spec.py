"""Speculative decoding's speed on one OpenAI-compatible server (issue 44), and the side-by-side summary.

    python benchmark/bench_spec.py run --url http://127.0.0.1:31961 --name ngram --out results.jsonl
    python benchmark/bench_spec.py summary results.jsonl

`run` sends spec_prompts.py's sets as /v1/chat/completions (greedy: temperature 0, max_tokens 256 by default, the
same prompts in the same order for every server), after a warm-up on other prompts, in four measurements:
batch 1 on the repetitive set, batch 1 on the creative set (one request at a time, the 16 prompts), then c=32 on the
repetitive and on the creative set (each prompt twice, 32 requests at once). tok/s = completion tokens (the server's
`usage`) / wall seconds of the measurement, prefill included -- identical work for every server, so the ratios
compare decoding. Each measurement appends one JSON line to --out; a server with a "speculative" entry in
/server_info also gets the acceptance length over that measurement: tokens a request committed per verify step, from
the difference of its cumulative counters before and after.

`summary` prints one row per server and the ratios the issue asks for, each beside its bar:
    ngram / ours   repetitive batch 1 >= 1.5, creative batch 1 >= 0.97, c=32 (both sets) >= 0.95
    ngram / llama  repetitive batch 1 >= 1.5
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spec_prompts import SETS  # noqa: E402  (a sibling file of this script, not a package)

WARMUP_PROMPTS = [f"List {n} colours, one per line." for n in range(3, 35)]
MEASUREMENTS = [("repetitive", 1), ("creative", 1), ("repetitive", 32), ("creative", 32)]
BARS = [  # (numerator, denominator, set, concurrency, at least)
    ("ngram", "ours", "repetitive", 1, 1.5), ("ngram", "ours", "creative", 1, 0.97),
    ("ngram", "ours", "repetitive", 32, 0.95), ("ngram", "ours", "creative", 32, 0.95),
    ("ngram", "llama", "repetitive", 1, 1.5),
]


def chat(url: str, model: str, prompt: str, max_tokens: int) -> int:
    """One greedy chat request; its completion tokens."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0.0}
    r = requests.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    return r.json()["usage"]["completion_tokens"]


def spec_counters(url: str) -> Optional[dict]:
    """The scheduler's cumulative stats of a server with a "speculative" entry in /server_info (None for others:
    llama.cpp, ours without speculation)."""
    try:
        r = requests.get(f"{url}/server_info", timeout=30)
        info = r.json() if r.ok else {}
    except (requests.RequestException, ValueError):
        return None
    return info.get("stats") if info.get("speculative") else None


def accept_length(before: Optional[dict], after: Optional[dict]) -> Optional[float]:
    """Tokens a request committed per verify step between two reads (spec_committed_tokens / spec_req_steps)."""
    if not before or not after:
        return None
    steps = after["spec_req_steps"] - before["spec_req_steps"]
    committed = after["spec_committed_tokens"] - before["spec_committed_tokens"]
    return round(committed / steps, 3) if steps > 0 else None


def measure(url: str, model: str, prompts: List[str], concurrency: int, max_tokens: int) -> dict:
    before = spec_counters(url)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        tokens = list(pool.map(lambda p: chat(url, model, p, max_tokens), prompts))
    wall_s = time.perf_counter() - t0
    return {"requests": len(prompts), "completion_tokens": sum(tokens), "wall_s": round(wall_s, 3),
            "tok_s": round(sum(tokens) / wall_s, 2), "accept_length": accept_length(before, spec_counters(url))}


def run(a) -> None:
    model = requests.get(f"{a.url}/v1/models", timeout=30).json()["data"][0]["id"]
    with ThreadPoolExecutor(32) as pool:  # the c=32 shape once, then batch 1 twice, on prompts not measured
        list(pool.map(lambda p: chat(a.url, model, p, 32), WARMUP_PROMPTS))
    for p in WARMUP_PROMPTS[:2]:
        chat(a.url, model, p, 32)
    for set_name, c in MEASUREMENTS:
        prompts = SETS[set_name][: a.limit]
        prompts = prompts if c == 1 else (prompts * (c // len(prompts) + 1))[:c]
        for r in range(a.runs):
            row = {"server": a.name, "set": set_name, "concurrency": c, "run": r,
                   **measure(a.url, model, prompts, c, a.max_tokens)}
            print(json.dumps(row), flush=True)
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")


def summary(a) -> None:
    rows = [json.loads(line) for line in open(a.results) if line.strip()]
    best = {}  # (server, set, c) -> the run with the highest tok/s (the least disturbed by the machine)
    for r in rows:
        key = (r["server"], r["set"], r["concurrency"])
        if key not in best or r["tok_s"] > best[key]["tok_s"]:
            best[key] = r
    servers = list(dict.fromkeys(r["server"] for r in rows))
    print(f"{'server':8} " + " ".join(f"{s[:5]}_c{c}_tok/s".rjust(16) for s, c in MEASUREMENTS) + "  accept_length")
    for name in servers:
        cells = [best.get((name, s, c)) for s, c in MEASUREMENTS]
        acc = " ".join(f"{s[:5]}_c{c}={r['accept_length']}" for (s, c), r in zip(MEASUREMENTS, cells)
                       if r and r.get("accept_length") is not None)
        print(f"{name:8} " + " ".join(f"{r['tok_s'] if r else '-':>16}" for r in cells) + f"  {acc or '-'}")
    for num, den, s, c, bar in BARS:
        x, y = best.get((num, s, c)), best.get((den, s, c))
        if x and y and y["tok_s"] > 0:
            ratio = x["tok_s"] / y["tok_s"]
            verdict = "ok" if ratio >= bar else "BELOW"
            print(f"{num}/{den} {s} c={c}: {ratio:.3f} (bar >= {bar}) {verdict}")
        else:
            print(f"{num}/{den} {s} c={c}: not measured")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--url", required=True)
    r.add_argument("--name", required=True, help="the server's row name: ours, ngram, llama")
    r.add_argument("--out", required=True, help="JSON-lines file the measurements are appended to")
    r.add_argument("--max-tokens", type=int, default=256)
    r.add_argument("--runs", type=int, default=1)
    r.add_argument("--limit", type=int, default=16, help="prompts per set (fewer only to check the script)")
    s = sub.add_parser("summary")
    s.add_argument("results")
    a = p.parse_args()
    run(a) if a.cmd == "run" else summary(a)


if __name__ == "__main__":
    main()
