"""Throughput with a JSON schema on every request vs unconstrained: same prompts, same concurrency, same lengths.

    python benchmark/bench_structured_output.py [--base-url http://127.0.0.1:30000] [--num-prompts 96]
        [--max-concurrency 32] [--output-len 128]

Without --base-url it starts `sglang serve` with the default model (and stops it after). Both runs go through
POST /generate with ignore_eos, and the schema (an array of at least 500 short strings) cannot complete within
--output-len tokens, so every request in both runs produces exactly --output-len tokens: the difference in output
tokens/s is the cost of the grammar (bitmask fill per request, one masking call per batch, matcher advance). A third
run with a schema that ends naturally shows tokens/s of typical structured output. The target is an overhead of at
most 15%. Prompts get a run-specific suffix so the prefix cache does not favour the second run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import List, Optional

import aiohttp

LONG_SCHEMA = {"type": "array", "items": {"type": "string", "maxLength": 24}, "minItems": 500}
NATURAL_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4}}, "required": ["name", "age", "tags"]}
TOPICS = ["a city", "a cat", "a book", "a car", "a planet", "a song", "a tree", "a river"]


def make_prompts(n: int) -> List[str]:
    return [f"Request {i}: write a list of words about {TOPICS[i % len(TOPICS)]} as JSON." for i in range(n)]


async def run(base_url: str, prompts: List[str], schema: Optional[dict], output_len: int, concurrency: int,
              tag: str) -> dict:
    sem = asyncio.Semaphore(concurrency)
    tokens: List[int] = []

    async def one(session: aiohttp.ClientSession, prompt: str) -> None:
        sp = {"max_new_tokens": output_len, "temperature": 0.0}
        if schema is not None:
            sp["json_schema"] = json.dumps(schema)
        if schema is not NATURAL_SCHEMA:
            sp["ignore_eos"] = True
        async with sem:
            async with session.post(f"{base_url}/generate", json={"text": f"{prompt} [{tag}]", "sampling_params": sp}) as r:
                body = await r.json()
                if r.status != 200:
                    raise RuntimeError(f"{r.status}: {body}")
                tokens.append(body["meta_info"]["completion_tokens"])

    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        start = time.perf_counter()
        await asyncio.gather(*(one(session, p) for p in prompts))
        elapsed = time.perf_counter() - start
    return {"requests": len(tokens), "output_tokens": sum(tokens), "seconds": elapsed,
            "output_tok_per_s": sum(tokens) / elapsed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default=None)
    ap.add_argument("--num-prompts", type=int, default=96)
    ap.add_argument("--max-concurrency", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=128)
    args = ap.parse_args()
    server = None
    base_url = args.base_url
    if base_url is None:
        from sglang.test.test_utils import popen_launch_server

        server = popen_launch_server(other_args=["--max-running-requests", str(args.max_concurrency)])
        base_url = server.base_url
    try:
        prompts = make_prompts(args.num_prompts)
        c, n = args.max_concurrency, args.output_len
        asyncio.run(run(base_url, prompts[:c], None, 8, c, "warmup"))
        asyncio.run(run(base_url, prompts[:c], LONG_SCHEMA, 8, c, "warmup-schema"))
        free = asyncio.run(run(base_url, prompts, None, n, c, "free"))
        constrained = asyncio.run(run(base_url, prompts, LONG_SCHEMA, n, c, "schema"))
        natural = asyncio.run(run(base_url, prompts, NATURAL_SCHEMA, n, c, "natural"))
    finally:
        if server is not None:
            server.kill()
    overhead = 1 - constrained["output_tok_per_s"] / free["output_tok_per_s"]
    print(json.dumps({"unconstrained": free, "json_schema": constrained, "json_schema_natural_end": natural}, indent=2))
    print(f"c={args.max_concurrency}, {args.num_prompts} prompts x {n} tokens: unconstrained "
          f"{free['output_tok_per_s']:.1f} tok/s, JSON schema {constrained['output_tok_per_s']:.1f} tok/s "
          f"-> grammar overhead {overhead:.1%} (target <= 15%)")


if __name__ == "__main__":
    main()
