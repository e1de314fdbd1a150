"""The independent reference for prompt logprobs: HF transformers' fp32 logits of the whole prompt, log-softmaxed."""

from __future__ import annotations

from typing import List

import torch

# eight prompts of 9 to ~40 tokens: with a 16-token chunk most span a chunk boundary, two span three chunks
LOGPROB_PROMPTS = [
    "The three primary colors are red, yellow and blue, and mixing them gives",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)",
    "Once upon a time, in a small village,",
    "Water boils at a temperature of one hundred degrees Celsius at sea level, but on a high mountain it boils at",
    "The quick brown fox",
    "List three fruits:\n1. apple\n2. banana\n3.",
    "In mathematics, a prime number is a natural number greater than one that has no divisors other than one and",
    "import numpy as np\nx = np.arange(10)\nprint(x.sum())",
]


def load_hf_fp32(model_dir: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def hf_prompt_logprobs(model_dir_or_model, prompts_ids: List[List[int]]) -> List[torch.Tensor]:
    """Per prompt: float32 [len, V] log_softmax of HF's logits; row p - 1 scores prompt token p."""
    model = load_hf_fp32(model_dir_or_model) if isinstance(model_dir_or_model, str) else model_dir_or_model
    out = []
    with torch.no_grad():
        for ids in prompts_ids:
            logits = model(torch.tensor([ids])).logits[0].float()
            out.append(torch.log_softmax(logits, dim=-1))
    return out


def reference_token_logprobs(ref: torch.Tensor, ids: List[int], start: int) -> List:
    """[None or logprob of token p] for p in [start, len(ids)) (None at position 0)."""
    return [None if p == 0 else ref[p - 1, ids[p]].item() for p in range(start, len(ids))]


LOGPROB_TOL = 1e-4  # fp32 runtime vs HF fp32: the same math, different kernels


def assert_logprobs_close(got: List, want: List, tol: float = LOGPROB_TOL) -> None:
    """Same length, None (no logprob: a sequence's first token) exactly where the reference has None, else within tol."""
    assert len(got) == len(want), (len(got), len(want))
    for g, w in zip(got, want):
        assert (g is None) == (w is None), (got, want)
        if w is not None:
            assert abs(g - w) <= tol, (g, w)
