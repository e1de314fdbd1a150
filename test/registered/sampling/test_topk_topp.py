"""Top-k / top-p / min-p without a vocabulary sort (sampling/topk_topp.py) against the exact definition, a full sort
of each row written here independently:
  * the same kept token sets (and untouched kept probabilities) for peaked and flat rows, every mix of k / p / min-p,
    rows settled by the candidates and rows that fall back to the full sort, vocabularies smaller than the candidate
    count, and ties at the cut (same count kept, every strictly larger token kept, the rest from the tied ones) --
    on the CPU path and on the device path (FORCE_DEVICE_PATH: the rows that may fall back are all sorted, the
    sorted cut kept where the row is unsettled), and the two paths return identical tensors;
  * frequencies: tokens drawn through sampler.sample(), seeded per request or from the global generator, on both
    paths, follow the reference's renormalised distribution (total-variation distance within a sampling tolerance);
  * memory: the filter's peak allocation (torch profiler, CPU: alloc_peak.py) stays within what mem_plan/sizes.py
    charges for it, where a full sort of every row needs an order of magnitude more.
"""

import pytest
import torch
from alloc_peak import peak_alloc_bytes

from sglang.srt.mem_plan.sizes import (
    SAMPLER_BYTES_PER_CANDIDATE, SAMPLER_FILTER_BYTES_PER_VOCAB_ENTRY, SAMPLER_TOPK_CANDIDATES, sampler_fixed_bytes)
from sglang.srt.sampling import topk_topp
from sglang.srt.sampling.sampler import sample
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.sampling.topk_topp import filter_probs_
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="cpu")


# float32 prefix sums round differently from the float64 ones here: a token whose preceding mass is this close to
# top_p may go either way
MASS_TOL = 1e-5


def reference_sets(row: torch.Tensor, k: int, p: float, min_p: float) -> tuple:
    """The definition on one row, as (surely kept, either way): sort descending; keep rank r iff r < k and the mass of
    ranks < r is <= p (rank 0 always); then drop what is below min_p x the largest probability."""
    values, order = torch.sort(row.double(), descending=True)
    k = len(row) if k == -1 else min(k, len(row))
    before = torch.cumsum(values, 0) - values
    ranks = torch.arange(len(row))
    in_k = ranks < k
    big = values >= values[0] * min_p
    sure = in_k & big & ((before < p - MASS_TOL) | (ranks == 0))
    either = in_k & big & ~sure & (before <= p + MASS_TOL)
    return set(order[sure].tolist()), set(order[either].tolist())


def reference_keep(row: torch.Tensor, k: int, p: float, min_p: float) -> set:
    sure, _ = reference_sets(row, k, p, min_p)
    return sure


def _rows(batch: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scale = torch.tensor([0.3, 1.0, 3.0, 8.0])[torch.arange(batch) % 4].view(-1, 1)  # flat ... peaked
    return torch.softmax(torch.randn(batch, vocab, generator=g) * scale, dim=-1)


PARAMS = [(-1, 0.9, 0.0), (50, 1.0, 0.0), (50, 0.8, 0.0), (-1, 1.0, 0.05), (7, 0.5, 0.2), (1, 1.0, 0.0),
          (-1, 0.999, 0.0), (5000, 0.95, 0.0), (-1, 1.0, 0.0), (2000, 1.0, 0.0), (-1, 0.3, 0.01), (3, 0.0, 0.0)]


def _check_sets(probs: torch.Tensor, params) -> None:
    ks, ps, ms = zip(*params)
    got = filter_probs_(probs.clone(), ks, ps, ms)
    for i, (k, p, m) in enumerate(params):
        sure, either = reference_sets(probs[i], k, p, m)
        kept = set(got[i].nonzero().view(-1).tolist())
        assert sure <= kept <= sure | either, (i, (k, p, m), len(kept), len(sure), len(either))
        assert torch.equal(got[i][list(kept)], probs[i][list(kept)])  # kept probabilities untouched


@pytest.fixture(params=["cpu_path", "device_path"])
def path(request, monkeypatch):
    monkeypatch.setattr(topk_topp, "FORCE_DEVICE_PATH", request.param == "device_path")
    return request.param


def test_same_token_sets_as_the_full_sort(path):
    for vocab, seed in ((49152, 0), (300, 1), (1024, 2), (1500, 3)):
        _check_sets(_rows(len(PARAMS), vocab, seed), PARAMS)


def test_device_path_equals_cpu_path(monkeypatch):
    for vocab, seed in ((49152, 0), (1500, 3), (32768, 5)):
        probs = _rows(len(PARAMS), vocab, seed)
        ks, ps, ms = zip(*PARAMS)
        cpu = filter_probs_(probs.clone(), ks, ps, ms)
        monkeypatch.setattr(topk_topp, "FORCE_DEVICE_PATH", True)
        assert torch.equal(filter_probs_(probs.clone(), ks, ps, ms), cpu)
        monkeypatch.setattr(topk_topp, "FORCE_DEVICE_PATH", False)


def test_rows_past_the_candidates_fall_back_to_the_sort(monkeypatch, path):
    sorted_rows = []
    by_sort = topk_topp._by_sort_
    monkeypatch.setattr(topk_topp, "_by_sort_", lambda probs, rows, *a: (sorted_rows.extend(rows),
                                                                          by_sort(probs, rows, *a)))
    probs = _rows(8, 32768, 5)  # rows 0, 1, 4: the 0.9 mass spreads over more than the candidates
    params = [(-1, 0.9, 0.0), (-1, 0.9, 0.0), (-1, 0.9, 0.0), (-1, 0.9, 0.0),
              (-1, 0.9, 0.0), (100, 0.9, 0.0), (-1, 1.0, 0.0), (-1, 0.999, 0.1)]
    _check_sets(probs, params)
    assert {0, 1, 4} <= set(sorted_rows)  # the flat rows with no top-k bound
    assert not {5, 6} & set(sorted_rows)  # top-k <= candidates, an unfiltered row: never sorted
    if path == "cpu_path":
        assert 3 not in sorted_rows  # a peaked row, settled by its candidates
    else:
        assert sorted(sorted_rows) == [0, 1, 2, 3, 4, 7]  # every row that may be unsettled, kept where it is


def test_ties_at_the_cut(path):
    vocab = 4096
    probs = torch.full((2, vocab), 0.5 / (vocab - 2))
    probs[:, :2] = 0.25  # two large, then a plateau of equal probabilities
    got = filter_probs_(probs.clone(), [10, -1], [1.0, 0.6], [0.0, 0.0])
    kept0, kept1 = got[0].nonzero().view(-1).tolist(), got[1].nonzero().view(-1).tolist()
    assert len(kept0) == 10 and {0, 1} <= set(kept0)
    # top-p 0.6: 0.5 from the two, then plateau tokens while the mass before them is <= 0.6
    plateau = 0.5 / (vocab - 2)
    assert abs(len(kept1) - (2 + int(0.1 // plateau) + 1)) <= 1  # +-1: the float32 mass at the cut
    assert {0, 1} <= set(kept1)


class _Req:
    def __init__(self, seed, **kw):
        self.sampling_params = SamplingParams(**kw)
        self.output_ids, self.stop_token_ids, self.fill_ids = [1], set(), [1]
        self.return_logprob, self.top_logprobs_num, self.grammar = False, 0, None
        self.generator = None if seed is None else torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("seeded", [True, False])
def test_frequencies_match_the_reference_distribution(path, seeded):
    # seeded: each request's own generator (Exp(1) noise from it); unseeded: the global one (-log(U) noise)
    torch.manual_seed(0)
    vocab, draws = 64, 3000
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(7)) * 2
    for kw in (dict(top_p=0.8), dict(top_k=12), dict(top_k=20, top_p=0.7, min_p=0.05), dict(min_p=0.2)):
        reqs = [_Req(1000 + i if seeded else None, temperature=0.9, **kw) for i in range(draws)]
        tokens = sample(logits.repeat(draws, 1), reqs).next_token_ids
        probs = torch.softmax(logits / 0.9, dim=-1)
        sp = reqs[0].sampling_params
        keep = sorted(reference_keep(probs, sp.top_k, sp.top_p, sp.min_p))
        want = torch.zeros(vocab, dtype=torch.float64)
        want[keep] = probs[keep].double() / probs[keep].double().sum()
        freq = torch.bincount(torch.tensor(tokens), minlength=vocab).double() / draws
        assert set(tokens) <= set(keep), kw
        tv = 0.5 * (freq - want).abs().sum().item()
        assert tv < 0.06, (kw, tv)  # E[TV] ~ 0.02-0.04 for <= 30 tokens at 3000 draws


def test_filter_memory_within_the_planned_bytes(path):
    batch, vocab = 16, 65536
    per_slot = vocab * SAMPLER_FILTER_BYTES_PER_VOCAB_ENTRY + SAMPLER_TOPK_CANDIDATES * SAMPLER_BYTES_PER_CANDIDATE
    probs = _rows(batch, vocab, 11)
    # rows settled by their candidates (top-k <= candidates): no sort at all
    settled = peak_alloc_bytes(lambda: filter_probs_(probs.clone(), [40] * batch, [0.9] * batch, [0.02] * batch))
    # flat rows with top-p only: the full-sort fallback, a few rows at a time (the fixed term)
    mixed = peak_alloc_bytes(lambda: filter_probs_(probs.clone(), [-1, 40] * (batch // 2), [0.9] * batch,
                                                   [0.02] * batch))
    full_sort = peak_alloc_bytes(lambda: probs.sort(dim=-1, descending=True))  # values + int64 order alone
    clone = batch * vocab * 4  # the probs.clone() inside the measured calls
    print(f"per entry: settled {(settled - clone) / (batch * vocab):.2f} B, with the fallback "
          f"{(mixed - clone) / (batch * vocab):.2f} B, planned {per_slot / vocab:.2f} B + the fixed "
          f"{sampler_fixed_bytes(vocab) / vocab:.0f} B x V; a bare full sort {full_sort / (batch * vocab):.2f} B")
    assert 0 < settled - clone <= batch * per_slot
    assert settled - clone < mixed - clone <= batch * per_slot + sampler_fixed_bytes(vocab)
    assert full_sort >= 12 * batch * vocab > 8 * (settled - clone)
