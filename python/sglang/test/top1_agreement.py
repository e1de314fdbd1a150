"""Teacher-forced top-1 agreement of a model with a reference model's greedy runs (test_moe_gguf_quant.py's measure,
for any model a PagedForwardDriver runs).

    runs = greedy_runs(reference_model, config, prompts, new_tokens)   # one batched prefill, then decode steps
    rate = teacher_forced_agreement(model, config, prompts, runs)      # share of run tokens that are model's argmax

The model reads each prompt with the reference's whole run in one prefill, so one divergence does not cascade.
"""

from __future__ import annotations

from typing import List, Sequence

import torch

from sglang.test.paged_forward import PagedForwardDriver


def _driver(model, config, num_prompts: int, max_tokens: int) -> PagedForwardDriver:
    return PagedForwardDriver(model, config, max_reqs=num_prompts + 1, max_tokens=max_tokens)


def greedy_runs(model, config, prompts: Sequence[List[int]], new_tokens: int, max_tokens: int = 4096):
    """Greedy continuations (new_tokens each) of every prompt: a batched prefill, then batched decode steps."""
    driver = _driver(model, config, len(prompts), max_tokens)
    rows = [driver.new_request() for _ in prompts]
    with torch.inference_mode():
        runs = [[int(t)] for t in driver.extend(rows, list(prompts)).argmax(-1)]
        for _ in range(new_tokens - 1):
            for run, t in zip(runs, driver.extend(rows, [[run[-1]] for run in runs]).argmax(-1)):
                run.append(int(t))
    return runs


def teacher_forced_agreement(model, config, prompts: Sequence[List[int]], runs, max_tokens: int = 4096) -> float:
    """Share of the reference runs' tokens that are this model's argmax given the same preceding tokens."""
    driver = _driver(model, config, len(prompts), max_tokens)
    rows = [driver.new_request() for _ in prompts]
    inputs = [list(prompt) + run[:-1] for prompt, run in zip(prompts, runs)]
    starts = torch.tensor([0] + [len(x) for x in inputs]).cumsum(0)[:-1]
    positions = torch.cat([start + len(p) - 1 + torch.arange(len(run))
                           for start, p, run in zip(starts, prompts, runs)])
    with torch.inference_mode():
        top1 = driver.extend(rows, inputs, logits_indices=positions).argmax(-1).tolist()
    return sum(a == b for a, b in zip(top1, [t for run in runs for t in run])) / len(top1)
