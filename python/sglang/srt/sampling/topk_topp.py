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
     temperature; or top-k with C < k < V) is filtered by the full sort, SAMPLER_SORT_FALLBACK_ROWS rows at a time:
     exact, and its scratch is a fixed term of the plan instead of a per-slot one. Which rows are unsettled is a
     device value; the host knows the rows that may be (filtered, k > C, C < V). On a device each of those is
     sorted and its sorted cut applied only where the row is unsettled (a settled row is written back unchanged):
     no host read. On the CPU, where reading the flags waits for nothing, only the unsettled rows are sorted.
  4. min-p: a threshold compare, in place.
Ties at the cut: a sort and torch.topk may order equal probabilities differently; both keep exactly n tokens, and
which of the tied ones is kept is arbitrary in either (the same token sets are allowed).
Device discipline: no read of a device value by the host and no op whose output shape depends on device values on
the device path; host lists reach the device through to_device() (test_sampler_device_discipline.py).
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from sglang.srt.mem_plan.sizes import SAMPLER_SORT_FALLBACK_ROWS, SAMPLER_TOPK_CANDIDATES


# Tests set this to run the device path on CPU tensors: both paths must return the same result.
FORCE_DEVICE_PATH = False


def on_host(device: torch.device) -> bool:
    """True for CPU tensors (unless the device path is forced): the device is the host, so reading values waits for
    nothing (CPU-only shortcuts may branch on them) and host data needs no copy."""
    return device.type == "cpu" and not FORCE_DEVICE_PATH


def to_device(data, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Host values (a list, or a CPU tensor) as a `dtype` tensor on `device`. To CUDA through pinned memory with
    non_blocking: a copy from pageable memory would make the host wait for the stream."""
    pin = device.type == "cuda"
    if isinstance(data, torch.Tensor):
        t = data.to(dtype)
        t = t.pin_memory() if pin else t
    else:
        t = torch.tensor(data, dtype=dtype, pin_memory=pin)
    return t if device.type == "cpu" else t.to(device, non_blocking=pin)


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


def _by_sort_(probs: torch.Tensor, rows: List[int], ks: torch.Tensor, ps: torch.Tensor,
              settled: Optional[torch.Tensor] = None) -> None:
    """The definition itself on probs[rows], SAMPLER_SORT_FALLBACK_ROWS rows at a time. settled: bool [B] on the
    device, True where the candidates already filtered the row (it is written back unchanged), or None: every row
    in `rows` is unsettled."""
    for start in range(0, len(rows), SAMPLER_SORT_FALLBACK_ROWS):
        chunk = to_device(rows[start:start + SAMPLER_SORT_FALLBACK_ROWS], torch.int64, probs.device)
        sub = probs.index_select(0, chunk)
        sorted_probs, order = sub.sort(dim=-1, descending=True)
        keep = keep_sorted_prefix(sorted_probs, ks.index_select(0, chunk), ps.index_select(0, chunk))
        if settled is not None:
            keep.logical_or_(settled.index_select(0, chunk).view(-1, 1))
        sorted_probs.masked_fill_(keep.logical_not_(), 0.0)
        del keep
        probs.index_copy_(0, chunk, sub.scatter_(1, order, sorted_probs))


def top_k_top_p_(probs: torch.Tensor, top_ks: Sequence[int], top_ps: Sequence[float]) -> torch.Tensor:
    """Zero, in place, what top-k and top-p drop from probs fp32 [B, V] (rows summing to 1). Returns probs."""
    batch, vocab = probs.shape
    k_list = [_neutral_k(k, vocab) for k in top_ks]
    active = [k < vocab or p < 1.0 for k, p in zip(k_list, top_ps)]
    if not any(active):
        return probs
    device = probs.device
    ks = to_device(k_list, torch.int64, device).view(-1, 1)
    ps = to_device(list(top_ps), probs.dtype, device).view(-1, 1)
    num_cand = min(vocab, SAMPLER_TOPK_CANDIDATES)
    cand_probs, cand_ids = probs.topk(num_cand, dim=-1, sorted=True)  # [B, C]
    keep = keep_sorted_prefix(cand_probs, ks, ps)
    del cand_probs
    # the cut falls inside the candidates; with k <= C or C = V it always does
    settled = (keep.sum(dim=-1) < num_cand) | (ks.view(-1) <= num_cand)
    # the kept candidates of settled rows; every token of the other rows (left to the sort, or not filtered)
    keep_mask = torch.zeros_like(probs, dtype=torch.bool)
    keep_mask.scatter_(1, cand_ids, keep)
    del cand_ids, keep
    by_candidates = settled & to_device(active, torch.bool, device)
    keep_mask.masked_fill_(by_candidates.logical_not_().view(-1, 1), True)
    probs.masked_fill_(keep_mask.logical_not_(), 0.0)
    del keep_mask
    maybe = [i for i in range(batch) if active[i] and k_list[i] > num_cand] if num_cand < vocab else []
    if maybe and on_host(device):
        flags = settled.tolist()
        _by_sort_(probs, [i for i in maybe if not flags[i]], ks, ps)
    elif maybe:
        _by_sort_(probs, maybe, ks, ps, settled)
    return probs


def min_p_(probs: torch.Tensor, min_ps: Sequence[float]) -> torch.Tensor:
    """Zero, in place, probabilities below min_p x the row's largest one. Returns probs."""
    m = to_device(list(min_ps), probs.dtype, probs.device).view(-1, 1)
    return probs.masked_fill_(probs < probs.max(dim=-1, keepdim=True).values * m, 0.0)


def filter_probs_(probs: torch.Tensor, top_ks: Sequence[int], top_ps: Sequence[float],
                  min_ps: Sequence[float]) -> torch.Tensor:
    """top-k, then top-p, then min-p (module docstring), in place on probs fp32 [B, V]. Returns probs."""
    top_k_top_p_(probs, top_ks, top_ps)
    if any(m > 0 for m in min_ps):
        min_p_(probs, min_ps)
    return probs
