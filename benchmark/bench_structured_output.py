"""Throughput with a JSON schema on every request vs unconstrained: same prompts, same concurrency, same lengths.

    python benchmark/bench_structured_output.py [--base-url http://127.0.0.1:30000] [--num-prompts 96]
        [--max-concurrency 32] [--output-len 128]

Without --base-url it starts `sglang serve` with the default model (and stops it after). Both runs go through
POST /generate with ignore_eos, and the schema (an array of at least 500 short strings) cannot complete within
--output-len tokens, so every request in both runs produces exactly --output-len tokens: the difference in output
tokens/s is the cost of the grammar (bitmask fill per request, one masking call per batch, matcher advance). A third
run with a schema that ends naturally shows tokens/s of typical structured output. The target is an overhead of at
most 15%. Prompts get a run-specific suffix so the prefix cache does not favour the second run.

`--micro-steps N` starts no server: it times the grammar work on the step's critical path at batch --max-concurrency
(the default model's tokenizer, the same schema, model-like short strings) three ways: filled by the sampler alone, by
the sampler and the fill thread once the logits exist, and by the fill thread during a stand-in forward
(`--micro-forward-ms` of small matrix products); per step it prints the grammar time the sampler waits for and the
whole step.
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


def micro(batch: int, steps: int, forward_ms: float) -> None:
    """ms per step of grammar work the sampler waits for (fill what is left + mask + advance), three ways."""
    from types import SimpleNamespace

    import torch

    from sglang.srt.constrained.backend import GrammarBackend
    from sglang.srt.constrained.logits_mask import apply_grammar_mask_
    from sglang.srt.model_loader.model_path import cache_root, default_model_path, ensure_converted_gguf
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    tok = get_tokenizer(ensure_converted_gguf(default_model_path(), cache_root()))
    vocab = len(tok)
    # model-like text: short words, a string closed every few tokens (random tokens would fill every string to
    # maxLength, the most expensive state for the mask)
    pieces = tok.convert_ids_to_tokens(list(range(vocab)))
    words = torch.tensor([i for i, p in enumerate(pieces) if p.isalpha() and p.islower() and 3 <= len(p) <= 7])
    quotes = torch.tensor([i for i, p in enumerate(pieces) if '"' in p])
    backend = GrammarBackend(tok, vocab, [tok.eos_token_id], batch, 64 << 20)
    compiled = backend.cache.get("json_schema", json.dumps(LONG_SCHEMA)).result()
    # the stand-in forward: small ops at the default model's width (576), like a batch-32 decode: torch's threads
    # and the GIL released inside each op, Python between ops
    x, w = torch.randn(batch, 576), torch.randn(576, 576) / 24
    reps = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.tanh(x @ w)
        if time.perf_counter() - t0 >= forward_ms / 1e3 / 4:
            reps = max(1, int(reps * forward_ms / 1e3 / (time.perf_counter() - t0)))
            break
        reps *= 2
    result = {}
    # one_thread: each row filled by the sampler (no worker thread); at_sample: the sampler and the worker thread
    # share the rows once the logits exist; during_forward: the worker fills during the forward, the sampler helps
    modes = ("one_thread", "at_sample", "during_forward")
    for mode in modes + modes:
        torch.manual_seed(0)
        reqs = [SimpleNamespace(grammar=backend.new_matcher("json_schema", compiled)) for _ in range(batch)]
        for r in reqs:
            r.grammar.filler = None if mode == "one_thread" else r.grammar.filler
        exposed = forward = 0.0
        for _ in range(steps):
            t0 = time.perf_counter()
            if mode == "during_forward":
                backend.filler.start(reqs)
            for _ in range(reps):
                torch.tanh(x @ w)
            logits = torch.randn(batch, vocab) * 0.1
            close = torch.rand(batch) < 0.35
            logits[close.nonzero().view(-1, 1), quotes] += 5.0
            logits[(~close).nonzero().view(-1, 1), words] += 5.0
            t1 = time.perf_counter()
            apply_grammar_mask_(logits, reqs, backend.bitmask)
            for r, t in zip(reqs, logits.max(dim=-1).indices.tolist()):
                r.grammar.accept(t)
            exposed += time.perf_counter() - t1
            forward += t1 - t0
        for r in reqs:
            r.grammar.release()
        result.setdefault(mode, []).append((exposed / steps * 1e3, forward / steps * 1e3))
    backend.shutdown()
    for mode, runs in result.items():
        print(f"batch {batch}, {mode:14s}: grammar time the sampler waits for (fill left + mask + advance) "
              f"{' / '.join(f'{e:.1f}' for e, _ in runs)} ms, whole step "
              f"{' / '.join(f'{e + f:.1f}' for e, f in runs)} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default=None)
    ap.add_argument("--num-prompts", type=int, default=96)
    ap.add_argument("--max-concurrency", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--micro-steps", type=int, default=0, help="time the grammar step only (no server)")
    ap.add_argument("--micro-forward-ms", type=float, default=90.0, help="~ a batch-32 decode forward, quiet")
    args = ap.parse_args()
    if args.micro_steps:
        micro(args.max_concurrency, args.micro_steps, args.micro_forward_ms)
        return
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
