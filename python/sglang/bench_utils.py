"""Shared pieces of the offline benchmarks: deterministic random prompts and the HF transformers baseline."""

from __future__ import annotations

import argparse
import random
import time
from typing import TYPE_CHECKING, List, Optional, Tuple

import torch

if TYPE_CHECKING:
    from sglang.srt.server_args import ServerArgs


def random_prompt_ids(num_prompts: int, input_len: int, vocab_size: int, seed: int = 0,
                      range_ratio: float = 1.0) -> List[List[int]]:
    """Token-id prompts; lengths uniform in [input_len * range_ratio, input_len]."""
    rng = random.Random(seed)
    lo = max(1, int(input_len * range_ratio))
    # stay away from special tokens at the start of the vocabulary
    return [[rng.randrange(100, vocab_size) for _ in range(rng.randint(lo, input_len))] for _ in range(num_prompts)]


def hf_static_batch_throughput(model_dir: str, prompts: List[List[int]], output_len: int,
                               dtype: torch.dtype = torch.bfloat16, batch_size: Optional[int] = None) -> dict:
    """HF transformers generate() over left-padded static batches, exactly output_len new tokens each."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=dtype).eval()
    bs = batch_size or len(prompts)
    total_out = 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        for s in range(0, len(prompts), bs):
            chunk = prompts[s : s + bs]
            width = max(len(p) for p in chunk)
            ids = torch.tensor([[0] * (width - len(p)) + p for p in chunk])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
            out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=output_len,
                                 min_new_tokens=output_len, pad_token_id=0)
            total_out += (out.shape[1] - width) * len(chunk)
    dt = time.perf_counter() - t0
    return {"backend": "hf_transformers", "duration_s": dt, "output_tokens": total_out,
            "output_throughput": total_out / dt}


def hf_batch1_decode(model_dir: str, prompt: List[int], output_len: int, dtype: torch.dtype = torch.bfloat16) -> dict:
    """HF transformers batch-1 decode speed: (output_len - 1) decode steps after the prefill, timed separately."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=dtype).eval()
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        model.generate(ids, do_sample=False, max_new_tokens=4, min_new_tokens=4, pad_token_id=0)  # warm-up
        t0 = time.perf_counter()
        model.generate(ids, do_sample=False, max_new_tokens=1, min_new_tokens=1, pad_token_id=0)
        prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        model.generate(ids, do_sample=False, max_new_tokens=output_len, min_new_tokens=output_len, pad_token_id=0)
        total = time.perf_counter() - t0
    decode = max(total - prefill, 1e-9)
    return {"backend": "hf_transformers", "prefill_s": prefill, "decode_tok_s": (output_len - 1) / decode}


def parse_bench_args(parser: argparse.ArgumentParser, argv=None) -> Tuple[argparse.Namespace, "ServerArgs"]:
    """Benchmark flags plus every `sglang serve` flag; engine logs default to warnings so the report stays readable."""
    from sglang.srt.server_args import ServerArgs

    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    server_args = ServerArgs.from_cli_args(args)
    if server_args.log_level == "info":
        server_args.log_level = "warning"
    return args, server_args
