"""Decode-step latency of the model forward over the paged KV pool (no scheduler, no sampling).

    python benchmark/bench_model_forward.py [--dtype bfloat16] [--batch-sizes 1 32] [--context 128] [--steps 32]
"""

from __future__ import annotations

import argparse
import time

import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_loader import load_model, resolve_model_path
from sglang.srt.server_args import ServerArgs
from sglang.test.paged_forward import PagedForwardDriver


def bench_decode(model, model_config, batch_size: int, context: int, steps: int, warmup: int = 3) -> float:
    """Seconds per decode step at `batch_size`, each request holding `context` tokens."""
    driver = PagedForwardDriver(model, model_config, max_reqs=batch_size, max_tokens=batch_size * (context + steps + warmup + 1))
    rows = [driver.new_request() for _ in range(batch_size)]
    gen = torch.Generator().manual_seed(0)
    for row in rows:  # prefill one request at a time
        driver.extend([row], [torch.randint(100, 10000, (context,), generator=gen).tolist()])
    tokens = [[1]] * batch_size
    for _ in range(warmup):
        driver.extend(rows, tokens)
    start = time.perf_counter()
    for _ in range(steps):
        logits = driver.extend(rows, tokens)
        tokens = [[int(t)] for t in logits.argmax(-1)]
    return (time.perf_counter() - start) / steps


def bench_hf_decode(model_dir: str, dtype: torch.dtype, context: int, steps: int) -> float:
    """Seconds per batch-1 decode step of HF transformers (KV cache, same prompt length), for a same-run ratio."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    prompt = torch.randint(100, 10000, (1, context), generator=torch.Generator().manual_seed(0))
    kwargs = dict(do_sample=False, min_new_tokens=steps, max_new_tokens=steps, pad_token_id=0)
    with torch.inference_mode():
        hf.generate(prompt, **{**kwargs, "min_new_tokens": 2, "max_new_tokens": 2})  # warm up
        start = time.perf_counter()
        hf.generate(prompt, **{**kwargs, "min_new_tokens": 1, "max_new_tokens": 1})
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        hf.generate(prompt, **kwargs)
        return (time.perf_counter() - start - prefill) / (steps - 1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model-path", default=None)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--prefill-len", type=int, default=512)
    p.add_argument("--hf", action="store_true", help="Also time HF transformers' batch-1 decode in the same run.")
    args = p.parse_args()

    server_args = ServerArgs(model_path=args.model_path, dtype=args.dtype)
    model_dir = resolve_model_path(server_args)
    model_config = ModelConfig.from_server_args(server_args, model_dir)
    model = load_model(model_config)
    print(f"model {model_config.architecture} dtype {args.dtype} threads {torch.get_num_threads()}")
    for bs in args.batch_sizes:
        sec = bench_decode(model, model_config, bs, args.context, args.steps)
        print(f"decode bs={bs:3d} ctx={args.context}: {sec * 1e3:7.2f} ms/step  {bs / sec:8.1f} tok/s")
    driver = PagedForwardDriver(model, model_config, max_reqs=2, max_tokens=args.prefill_len + 40)
    prompt = list(range(100, 100 + args.prefill_len))
    driver.extend([driver.new_request()], [prompt[:32]])  # warm up
    row = driver.new_request()
    start = time.perf_counter()
    driver.extend([row], [prompt])
    sec = time.perf_counter() - start
    print(f"prefill len={args.prefill_len}: {sec * 1e3:7.1f} ms  {args.prefill_len / sec:8.1f} tok/s")
    if args.hf:
        hf_sec = bench_hf_decode(model_dir, model_config.dtype, args.context, args.steps)
        ours = bench_decode(model, model_config, 1, args.context, args.steps)
        print(f"HF transformers decode bs=1: {hf_sec * 1e3:7.2f} ms/step {1 / hf_sec:8.1f} tok/s; "
              f"ours re-measured {1 / ours:8.1f} tok/s; ratio {hf_sec / ours:.2f}x")


if __name__ == "__main__":
    main()
