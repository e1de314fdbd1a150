"""Prompt logprobs in the prefill: the log-softmax of the logits of chosen hidden rows of an extend batch.

Prompt token p is scored by hidden row p - 1 (the distribution after tokens [0, p)). The scheduler
(managers/prompt_logprob_state.py) names the rows of a chunk whose logprobs a request still needs, with each row's
target (the next prompt token), its top-k count and its token_ids_logprob list; the logits processor calls
`compute_prompt_logprobs` before it projects the sampler's rows.

Memory: the rows are projected `block_rows` at a time (the request slots R; the runner sets it). One block holds the
lm-head output (<= 4 B per vocabulary entry), its fp32 copy, its fp32 log-softmax and a 1 B compare mask (the
target's rank) -- at most PROMPT_LOGPROB_BYTES_PER_VOCAB_ENTRY = 13 B per entry per row (mem_plan/sizes.py) <= the
`logits` term's 16 B x V x R. The logits processor scores these rows before it projects the sampler's rows, and the
sampler's own work starts after the block is freed, so a chunk of any length needs no unplanned memory.

With tp ranks every rank runs the same blocks (each block's all-gather is a collective); only rank 0 has the spec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

from sglang.srt.distributed.communication_op import tp_all_gather


@dataclass
class PromptLogprobSpec:
    """Per chosen row (the order of ForwardBatch.prompt_logprob_rows): the token to score, top-k, extra token ids."""

    targets: List[int]
    top_k: List[int]
    token_ids: List[Optional[List[int]]]


# per chosen row: (logprob of the target, top-k [(token_id, logprob)] or None, [(token_id, logprob)] or None,
# the target's 1-based rank: 1 + how many tokens are more likely)
RowLogprobs = Tuple[float, Optional[List[Tuple[int, float]]], Optional[List[Tuple[int, float]]], int]


def _block_to_host(logprobs: torch.Tensor, spec: PromptLogprobSpec, lo: int, hi: int) -> List[RowLogprobs]:
    """One device->host copy per block: targets, top-k values and ids, token_ids_logprob, packed as float64."""
    dev = logprobs.device
    k_max = max(spec.top_k[lo:hi], default=0)
    id_lists = spec.token_ids[lo:hi]
    n_ids = max((len(ids) for ids in id_lists if ids), default=0)
    targets = torch.tensor(spec.targets[lo:hi], dtype=torch.int64, device=dev).view(-1, 1)
    target_lp = logprobs.gather(1, targets)
    cols = [target_lp, (logprobs > target_lp).sum(1, keepdim=True) + 1]
    if k_max > 0:
        cols += list(logprobs.topk(k_max, dim=-1))
    if n_ids > 0:
        padded = [list(ids or []) + [0] * (n_ids - len(ids or [])) for ids in id_lists]
        cols.append(logprobs.gather(1, torch.tensor(padded, dtype=torch.int64, device=dev)))
    packed = torch.cat([c.to(torch.float64) for c in cols], dim=1).tolist()
    rows: List[RowLogprobs] = []
    for j, row in enumerate(packed):
        k = spec.top_k[lo + j]
        top = [(int(t), v) for t, v in zip(row[2 + k_max:2 + k_max + k], row[2:2 + k])] if k else None
        ids = id_lists[j]
        base = 2 + 2 * k_max
        by_id = [(t, v) for t, v in zip(ids, row[base:base + len(ids)])] if ids else None
        rows.append((row[0], top, by_id, int(row[1])))
    return rows


def compute_prompt_logprobs(hidden_states: torch.Tensor, rows: torch.Tensor, lm_head, vocab_size: int,
                            spec: Optional[PromptLogprobSpec], block_rows: int) -> Optional[List[RowLogprobs]]:
    """hidden_states [N, hidden], rows [M] int64 indices into it -> M RowLogprobs (None on a TP follower)."""
    assert block_rows > 0, "prompt logprob rows need a block size (the request slots)"
    out: Optional[List[RowLogprobs]] = [] if spec is not None else None
    for lo in range(0, rows.numel(), block_rows):
        hi = min(lo + block_rows, rows.numel())
        logits = tp_all_gather(lm_head.logits(hidden_states[rows[lo:hi]]), dim=-1)
        if spec is None:  # a TP follower: the collective only
            continue
        logprobs = torch.log_softmax(logits[:, :vocab_size].float(), dim=-1)
        del logits
        out.extend(_block_to_host(logprobs, spec, lo, hi))
    return out
