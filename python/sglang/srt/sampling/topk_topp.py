"""Top-k / top-p / min-p filtering of sampling probabilities without sorting the vocabulary.

The definition (what a full descending sort of each row gives; sampler.py's order: top-k, then top-p, then min-p):
    rank r of a row = position in the row sorted by probability, descending
    keep rank r  iff  r < k  and  (r == 0 or mass of ranks < r <= top_p)
    then drop every kept token with probability < min_p * (the row's largest probability)
Both top-k and top-p keep a prefix of the sorted row, so a row keeps its n = min(k, n_p) most likely tokens.

How, without the sort (memory per row, sizes.py):
  1. candidates: the C = SAMPLER_TOPK_CANDIDATES most likely tokens of every row (torch.topk: C sorted values and
     their indices, C << V). The prefix rule runs on them exactly as on a sorted row (same cumulative sums).
  2. a row is settled by its candidates when its cut falls inside them: it keeps fewer than C, or k <= C, or C = V.
     Its kept candidates go into a bool mask [B, V] that zeroes every other probability in place.
  3. a row whose cut lies beyond its C most likely tokens (top-p over a flat distribution with k > C, e.g. a high
     temperature) is filtered by the full sort, SAMPLER_SORT_FALLBACK_ROWS rows at a time: rare, exact, and its
     scratch is a fixed term of the plan instead of a per-slot one.
  4. min-p: a threshold compare, in place.
Ties at the cut: a sort and torch.topk may order equal probabilities differently; both keep exactly n tokens, and
which of the tied ones is kept is arbitrary in either (the same token sets are allowed).
"""

from __future__ import annotations

from typing import List, Sequence

import torch

from sglang.srt.mem_plan.sizes import SAMPLER_SORT_FALLBACK_ROWS, SAMPLER_TOPK_CANDIDATES


def _neutral_k(k: int, vocab: int) -> int:
    return vocab if k == -1 or k >= vocab else k


def keep_sorted_prefix(sorted_probs: torch.Tensor, ks: torch.Tensor, ps: torch.Tensor) -> torch.Tensor:
    """bool [B, C]: which ranks of rows sorted descending the top-k/top-p rule keeps. ks int64 [B, 1], ps [B, 1]."""
    ranks = torch.arange(sorted_probs.shape[1], device=sorted_probs.device).view(1, -1)
    cum_before = sorted_probs.cumsum(dim=-1)
    cum_before -= sorted_probs  # mass of the ranks before each one
    keep = (cum_before <= ps) & (ranks < ks)
    keep[:, 0] = True
    return keep


def _by_sort_(probs: torch.Tensor, rows: List[int], ks: torch.Tensor, ps: torch.Tensor) -> None:
    """The definition itself, for the rows whose cut lies past the candidates, a few rows at a time."""
    for start in range(0, len(rows), SAMPLER_SORT_FALLBACK_ROWS):
        chunk = torch.tensor(rows[start:start + SAMPLER_SORT_FALLBACK_ROWS], device=probs.device)
        sub = probs[chunk]
        sorted_probs, order = sub.sort(dim=-1, descending=True)
        sorted_probs.masked_fill_(~keep_sorted_prefix(sorted_probs, ks[chunk], ps[chunk]), 0.0)
        probs[chunk] = sub.scatter_(1, order, sorted_probs)


def top_k_top_p_(probs: torch.Tensor, top_ks: Sequence[int], top_ps: Sequence[float]) -> torch.Tensor:
    """Zero, in place, what top-k and top-p drop from probs fp32 [B, V] (rows summing to 1). Returns probs."""
    batch, vocab = probs.shape
    k_list = [_neutral_k(k, vocab) for k in top_ks]
    active = [i for i in range(batch) if k_list[i] < vocab or top_ps[i] < 1.0]
    if not active:
        return probs
    device = probs.device
    ks = torch.tensor(k_list, dtype=torch.int64, device=device).view(-1, 1)
    ps = torch.tensor(list(top_ps), dtype=probs.dtype, device=device).view(-1, 1)
    num_cand = min(vocab, SAMPLER_TOPK_CANDIDATES)
    cand_probs, cand_ids = probs.topk(num_cand, dim=-1, sorted=True)  # [B, C]
    keep = keep_sorted_prefix(cand_probs, ks, ps)
    del cand_probs
    num_kept = keep.sum(dim=-1)
    settled = (num_kept < num_cand) | (ks.view(-1) <= num_cand) | (num_cand == vocab)
    is_active = torch.zeros(batch, dtype=torch.bool, device=device)
    is_active[active] = True
    by_candidates = settled & is_active
    # the kept candidates of settled rows; every token of the other rows (left to the sort, or not filtered)
    keep_mask = torch.zeros_like(probs, dtype=torch.bool)
    keep_mask.scatter_(1, cand_ids, keep)
    del cand_ids, keep
    keep_mask[~by_candidates] = True
    probs.masked_fill_(keep_mask.logical_not_(), 0.0)
    del keep_mask
    unsettled = (~settled & is_active).nonzero().view(-1).tolist()
    if unsettled:
        _by_sort_(probs, unsettled, ks, ps)
    return probs


def min_p_(probs: torch.Tensor, min_ps: Sequence[float]) -> torch.Tensor:
    """Zero, in place, probabilities below min_p x the row's largest one. Returns probs."""
    m = torch.tensor(list(min_ps), dtype=probs.dtype, device=probs.device).view(-1, 1)
    return probs.masked_fill_(probs < probs.max(dim=-1, keepdim=True).values * m, 0.0)


def filter_probs_(probs: torch.Tensor, top_ks: Sequence[int], top_ps: Sequence[float],
                  min_ps: Sequence[float]) -> torch.Tensor:
    """top-k, then top-p, then min-p (module docstring), in place on probs fp32 [B, V]. Returns probs."""
    top_k_top_p_(probs, top_ks, top_ps)
    if any(m > 0 for m in min_ps):
        min_p_(probs, min_ps)
    return probs
