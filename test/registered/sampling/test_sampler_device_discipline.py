"""The sampler as a GPU runs it, checked on the CPU with sglang.test.device_discipline: the logits live on `meta` (the
stand-in device), the requests' bookkeeping on the host.

  * each part of sample() alone (penalties, min_new_tokens masking, logprobs and top logprobs, greedy/temperature,
    top-k/top-p/min-p including rows that may need the full-sort fallback, seeded rows, logit_bias): no
    data-dependent op, no host array mixed into a device op, and exactly one device->host transfer per call (the
    packed next ids and logprobs);
  * one batch mixing every part: the same one transfer;
  * the device path run on real CPU tensors (topk_topp.FORCE_DEVICE_PATH) returns exactly what the CPU path returns,
    tokens, logprobs and top logprobs, for rows that are dead after masking, NaN, flat (full-sort fallback), seeded;
    the branch-free dead-row pass and the host-counted penalties against their definitions.
"""

from typing import Any, List, Optional

import pytest
import torch

from sglang.srt.sampling import topk_topp
from sglang.srt.sampling.sampler import _apply_penalties, _unmask_dead_rows_, sample
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.device_discipline import DeviceDiscipline

register_cpu_ci(est_time=10, suite="cpu")

VOCAB = 4096  # > SAMPLER_TOPK_CANDIDATES: top-p rows without a top-k may need the full-sort fallback
PROMPT = [1, 2, 3, 2, 4000, 9999, -1]  # out-of-vocabulary ids are ignored by the penalties


class _Req:
    """The fields the sampler's Req protocol lists."""

    def __init__(self, output_ids=(7, 7, 8), lp: bool = False, top: int = 0, stops=(), **sp):
        self.sampling_params = SamplingParams.from_dict({"max_new_tokens": 64, **sp})
        self.output_ids: List[int] = list(output_ids)
        self.stop_token_ids = {0, 5} | set(stops)  # more than validation allows: a row left without a token
        self.return_logprob, self.top_logprobs_num = lp, top
        seed = self.sampling_params.seed
        self.generator: Optional[torch.Generator] = None if seed is None else torch.Generator().manual_seed(seed)
        self.grammar: Optional[Any] = None

    @property
    def fill_ids(self) -> List[int]:
        return PROMPT + self.output_ids


def on_device(reqs: list, vocab: int = VOCAB):
    """sample() on meta logits under DeviceDiscipline; the one allowed host read is the packed result."""
    logits = torch.empty(len(reqs), vocab, device="meta")
    with DeviceDiscipline() as dd:
        out = sample(logits, reqs)
    assert len(out.next_token_ids) == len(reqs)
    assert len(dd.syncs) == 1, dd.report()
    return out


def test_penalties():
    on_device([_Req(temperature=0, repetition_penalty=1.3), _Req(temperature=0, frequency_penalty=0.5),
               _Req(temperature=0, presence_penalty=-0.4), _Req(temperature=0),
               _Req(temperature=0, repetition_penalty=0.7, frequency_penalty=1.0, presence_penalty=1.0,
                    output_ids=[])])


def test_min_new_tokens_masking():
    on_device([_Req(temperature=0, min_new_tokens=10), _Req(temperature=0.7, min_new_tokens=10),
               _Req(temperature=0, min_new_tokens=1)])


def test_logprobs_and_top_logprobs():
    out = on_device([_Req(temperature=0, lp=True, top=3), _Req(temperature=0.8, lp=True),
                     _Req(temperature=0.8, lp=False, top=5), _Req(temperature=0, lp=True, top=1)])
    assert out.token_logprobs[2] is None and out.top_logprobs[1] is None and out.top_logprobs[2] is None
    assert len(out.top_logprobs[0]) == 3 and len(out.top_logprobs[3]) == 1


def test_greedy_and_temperature():
    on_device([_Req(temperature=0)] * 3)
    on_device([_Req(temperature=0), _Req(temperature=0.5), _Req(temperature=2.0)])


def test_top_k_top_p_min_p_with_fallback_rows():
    on_device([_Req(temperature=1.0, top_p=0.9), _Req(temperature=1.0, top_k=2000, top_p=0.95),
               _Req(temperature=1.0, top_k=40, top_p=0.9), _Req(temperature=1.0, min_p=0.1),
               _Req(temperature=1.0, top_k=5), _Req(temperature=0)] + [_Req(temperature=1.2, top_p=0.8)] * 5)


def test_seeded_rows():
    on_device([_Req(temperature=0.9, seed=1), _Req(temperature=0.9, top_p=0.9, seed=2), _Req(temperature=0.9),
               _Req(temperature=0)])


def test_logit_bias():
    on_device([_Req(temperature=0, logit_bias={"5": 3.0, "17": -2.0}), _Req(temperature=0.7, logit_bias={"1": 1.0})])


def mixed_batch() -> list:
    return [
        _Req(temperature=0, lp=True, top=4),
        _Req(temperature=0.8, top_p=0.9, repetition_penalty=1.2, lp=True),
        _Req(temperature=0.7, top_k=50, seed=11, frequency_penalty=0.4, presence_penalty=0.3),
        _Req(temperature=1.1, top_p=0.95, min_p=0.05, min_new_tokens=8, lp=True, top=2),
        _Req(temperature=1.0, top_k=3000, top_p=0.97, seed=12, logit_bias={"9": 4.0}),
        _Req(temperature=0.9, min_new_tokens=8, stops=range(VOCAB)),  # dead after masking
        _Req(temperature=0, repetition_penalty=1.5, min_new_tokens=8),
    ]


def test_one_host_read_per_mixed_batch():
    logits = torch.empty(len(mixed_batch()), VOCAB, device="meta")
    with DeviceDiscipline() as dd:
        sample(logits, mixed_batch())
    assert len(dd.syncs) == 1, dd.report()


def _mixed_logits() -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    scale = torch.tensor([4.0, 0.2, 3.0, 1.0, 0.05, 2.0, 6.0]).view(-1, 1)  # 0.2, 0.05: flat rows (fallback)
    logits = torch.randn(7, VOCAB, generator=g) * scale
    logits[3, 100] = float("nan")
    logits[6, 200] = float("inf")
    return logits


@pytest.mark.parametrize("trial", range(3))
def test_device_path_equals_cpu_path(monkeypatch, trial):
    sorted_rows = []
    by_sort = topk_topp._by_sort_
    monkeypatch.setattr(topk_topp, "_by_sort_", lambda probs, rows, *a: (sorted_rows.extend(rows),
                                                                          by_sort(probs, rows, *a)))
    logits = _mixed_logits() + trial
    torch.manual_seed(trial)
    cpu = sample(logits.clone(), mixed_batch())
    assert {1, 4} <= set(sorted_rows)  # the flat rows' cut lies past the candidates: the fallback ran
    monkeypatch.setattr(topk_topp, "FORCE_DEVICE_PATH", True)
    torch.manual_seed(trial)
    dev = sample(logits.clone(), mixed_batch())
    assert dev.next_token_ids == cpu.next_token_ids
    assert dev.token_logprobs == cpu.token_logprobs
    assert dev.top_logprobs == cpu.top_logprobs


@pytest.mark.parametrize("device_path", [False, True])
def test_dead_rows(monkeypatch, device_path):
    monkeypatch.setattr(topk_topp, "FORCE_DEVICE_PATH", device_path)
    ninf = float("-inf")
    masked = torch.tensor([[1.0, ninf, 2.0], [ninf, ninf, ninf], [ninf, ninf, ninf]])
    fallback = torch.tensor([[5.0, 5.0, 5.0], [3.0, ninf, 1.0], [ninf, ninf, ninf]])
    x = masked.clone()
    _unmask_dead_rows_(x, fallback)  # live: kept; dead: the fallback; dead in both: uniform
    assert torch.equal(x, torch.tensor([[1.0, ninf, 2.0], [3.0, ninf, 1.0], [0.0, 0.0, 0.0]]))
    x = masked.clone()
    _unmask_dead_rows_(x)
    assert torch.equal(x, torch.tensor([[1.0, ninf, 2.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    x = masked[:1].clone()
    _unmask_dead_rows_(x, fallback[:1])
    assert torch.equal(x, masked[:1])


def test_penalties_match_the_formulas():
    """Repetition over prompt+output (each id once), then -= frequency x count + presence, per row."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, VOCAB, generator=g) * 3
    reqs = [_Req(temperature=0, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.2,
                 output_ids=[7, 7, 8, VOCAB + 5, 9, 7]),
            _Req(temperature=0, frequency_penalty=-0.3, output_ids=[1, 1]), _Req(temperature=0),
            _Req(temperature=0, repetition_penalty=0.8, output_ids=[])]
    want = logits.clone()
    for i, r in enumerate(reqs):
        sp, out = r.sampling_params, [t for t in r.output_ids if 0 <= t < VOCAB]
        for t in {t for t in r.fill_ids if 0 <= t < VOCAB}:
            x = want[i, t]
            want[i, t] = x / sp.repetition_penalty if x > 0 else x * sp.repetition_penalty
        for t in set(out):
            want[i, t] -= sp.frequency_penalty * out.count(t) + sp.presence_penalty
    got = logits.clone()
    _apply_penalties(got, reqs)
    assert torch.equal(got, want)


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
