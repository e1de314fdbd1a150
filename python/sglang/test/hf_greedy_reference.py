"""HF transformers' fp32 greedy tokens, the reference the model tests compare against, read two ways:

teacher_forced_choices: HF's argmax after every prefix of prompt + our output, one full forward per request (no
    cache: each forward runs HF's prefill path). It equals our output exactly when our tokens are HF's greedy
    continuation: at the first token where they part, HF's choice differs from ours.
batched_greedy_texts: one left-padded batched generate (EOS ignored), decoded; for server tests that compare text.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import torch

_MODELS: Dict[str, object] = {}


def hf_causal_lm(path: str):
    """The fp32 AutoModelForCausalLM of a checkpoint directory, loaded once per process."""
    if path not in _MODELS:
        from transformers import AutoModelForCausalLM

        _MODELS[path] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return _MODELS[path]


def release(path: str) -> None:
    """Drop a checkpoint's cached model (a large one should not stay resident for the rest of a test process)."""
    _MODELS.pop(path, None)


def teacher_forced_choices(path: str, prompts: Sequence[List[int]], outputs: Sequence[List[int]]) -> List[List[int]]:
    model = hf_causal_lm(path)
    got = []
    with torch.no_grad():
        for prompt, out in zip(prompts, outputs):
            logits = model(torch.tensor([list(prompt) + list(out)])).logits[0]
            got.append(logits[len(prompt) - 1: -1].argmax(-1).tolist())
    return got


def batched_greedy_texts(model, tok, prompts: Sequence[List[int]], n: int, pad_id: int = 0) -> List[str]:
    """HF's n greedy tokens after each prompt (token ids), one left-padded batched generate, decoded by tok."""
    width = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                             pad_token_id=pad_id)
    return [tok.decode(row) for row in out[:, width:].tolist()]
