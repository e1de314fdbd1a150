"""Sampler: greedy, temperature/top-k/top-p/min-p support sets, penalties, seeds, logprobs; stop handling in Req.
Seeded draws, extreme values and fallbacks are held against the definition computed independently
(sampling_reference.py): a seeded request's token is torch.multinomial over the reference probabilities."""

import math

import pytest
import torch
from sampling_reference import reference_probs, seeded_draw

from sglang.srt.managers.incremental_detokenizer import find_stop, held_back_len
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.sampling.sampler import sample
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="cpu")


def req(**sp):
    return Req("r", [1, 2, 3], SamplingParams.from_dict(sp), eos_token_ids={0})


def test_greedy_is_argmax():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 1.0, 2.0]])
    out = sample(logits.clone(), [req(temperature=0), req(temperature=0)])
    assert out.next_token_ids == [1, 0]


def test_top_k_and_top_p_limit_support():
    torch.manual_seed(0)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    seen_k, seen_p = set(), set()
    for _ in range(300):
        seen_k.add(sample(logits.clone(), [req(top_k=2)]).next_token_ids[0])
        seen_p.add(sample(logits.clone(), [req(top_p=0.7)]).next_token_ids[0])
    assert seen_k == {0, 1}
    # smallest set with mass >= 0.7 is {0, 1}
    assert seen_p == {0, 1}


def test_min_p_drops_unlikely_tokens():
    torch.manual_seed(0)
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.09, 0.01]]))
    seen = {sample(logits.clone(), [req(min_p=0.2)]).next_token_ids[0] for _ in range(300)}
    assert seen == {0, 1}  # 0.09 < 0.2 * 0.6


def test_temperature_sharpens_distribution():
    torch.manual_seed(0)
    logits = torch.log(torch.tensor([[0.6, 0.4]]))
    n = 2000
    hot = sum(sample(logits.clone(), [req(temperature=1.0)]).next_token_ids[0] == 0 for _ in range(n)) / n
    cold = sum(sample(logits.clone(), [req(temperature=0.25)]).next_token_ids[0] == 0 for _ in range(n)) / n
    assert abs(hot - 0.6) < 0.05
    expected_cold = 0.6**4 / (0.6**4 + 0.4**4)  # = 0.835
    assert abs(cold - expected_cold) < 0.05


def test_seed_reproducible_per_request():
    """A seed's tokens, step after step, are torch.multinomial's draws with Generator().manual_seed(seed)."""
    logits = torch.randn(1, 1000, generator=torch.Generator().manual_seed(0))
    probs = torch.softmax(logits[0].double(), dim=-1).float()

    def draws(seed):
        r = req(seed=seed)
        return [sample(logits.clone(), [r]).next_token_ids[0] for _ in range(20)]

    def reference(seed):
        g = torch.Generator().manual_seed(seed)
        return [int(torch.multinomial(probs, 1, generator=g)) for _ in range(20)]

    assert draws(7) == draws(7) == reference(7)
    assert draws(8) == reference(8) != reference(7)


def test_penalties():
    logits = torch.tensor([[2.0, 1.9, -1.0, 0.0]])
    r = req(temperature=0, frequency_penalty=0.5)
    r.output_ids = [0]
    assert sample(logits.clone(), [r]).next_token_ids == [1]  # 2.0 - 0.5 < 1.9
    r = req(temperature=0, presence_penalty=0.2)
    r.output_ids = [0, 0, 0]
    assert sample(logits.clone(), [r]).next_token_ids == [1]
    r = req(temperature=0, repetition_penalty=1.2)  # prompt [1,2,3] is penalised: 1.9/1.2 < 2.0 anyway
    logits2 = torch.tensor([[1.5, 1.7, -1.0, 0.0]])
    assert sample(logits2.clone(), [r]).next_token_ids == [0]  # 1.7 / 1.2 = 1.417 < 1.5


def test_min_new_tokens_masks_eos():
    logits = torch.tensor([[5.0, 1.0, 0.0]])
    r = req(temperature=0, min_new_tokens=2)
    assert sample(logits.clone(), [r]).next_token_ids == [1]


def test_logprobs_and_top_logprobs():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    r = req(temperature=0)
    r.return_logprob, r.top_logprobs_num = True, 2
    out = sample(logits.clone(), [r])
    lse = math.log(sum(math.exp(x) for x in (1.0, 2.0, 3.0)))
    assert out.token_logprobs[0] == pytest.approx(3.0 - lse, abs=1e-5)
    assert [t for t, _ in out.top_logprobs[0]] == [2, 1]
    assert out.top_logprobs[0][1][1] == pytest.approx(2.0 - lse, abs=1e-5)


@pytest.mark.parametrize("bad", [
    {"temperature": -0.1}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": 0}, {"min_p": 2.0},
    {"max_new_tokens": -1}, {"repetition_penalty": 0.0}, {"frequency_penalty": 3.0}, {"stop": [""]},
    {"n": 0}, {"no_such_param": 1}, {"temperature": "hot"},
])
def test_invalid_sampling_params_name_the_parameter(bad):
    with pytest.raises(ValueError) as e:
        SamplingParams.from_dict(bad)
    key = next(iter(bad))
    assert key in str(e.value)


def test_stop_helpers():
    assert find_stop("hello world", ["wor", "lo"], 0) == (3, "lo")
    assert find_stop("hello world", ["wor"], 8) == (6, "wor")
    assert held_back_len("the en", ["end"]) == 2
    assert held_back_len("the e", ["end", "e!"]) == 1
    assert held_back_len("abc", ["xyz"]) == 0


def test_max_new_tokens_and_stop_token_finish():
    r = req(max_new_tokens=2)
    r.append_token(5)
    assert not r.finished()
    r.append_token(6)
    assert r.finished_reason == {"type": "length", "length": 2}
    r = req(max_new_tokens=5, stop_token_ids=[9])
    r.append_token(9)
    assert r.finished_reason == {"type": "stop", "matched": 9}
    r = req(max_new_tokens=5, ignore_eos=True)
    r.append_token(0)
    assert not r.finished()


def raw_req(seed=None, **sp):
    """A request whose parameters skip validation: the sampler must be safe whatever reaches it."""
    p = SamplingParams(seed=seed, **sp)
    p.normalize()
    r = Req("r", [1, 2, 3], p, eos_token_ids={0})
    r.output_ids = [3, 3, 5]
    return r


def assert_reference_draws(logits, reqs, seeds):
    """sample() on seeded requests draws each row's reference token (computed before the logits are modified)."""
    want = [seeded_draw(reference_probs(row, r), seed) for row, r, seed in zip(logits, reqs, seeds)]
    assert sample(logits, reqs).next_token_ids == want


@pytest.mark.parametrize("sp", [
    {"repetition_penalty": 1e-300}, {"repetition_penalty": 1e300}, {"frequency_penalty": 1e300},
    {"presence_penalty": -1e300}, {"temperature": 1e39, "min_new_tokens": 10}, {"temperature": float("inf")},
    {"temperature": 1.0000001e-6, "top_p": 1e-9}, {"temperature": 0.5, "min_p": 1.0, "top_k": 2},
    {"temperature": 0, "repetition_penalty": 1e-300, "min_new_tokens": 10},
])
def test_extreme_values_never_reach_multinomial_as_nan(sp):
    for seed in range(8):
        logits = torch.randn(2, 8, generator=torch.Generator().manual_seed(seed)) * 30
        logits[0, 2] = logits[1, 6] = float("nan")  # never drawn
        logits[1, 4] = float("inf")
        reqs = [raw_req(seed=seed, **sp), raw_req(seed=seed + 100, **sp)]
        if sp.get("min_new_tokens"):  # the eos stays masked before min_new_tokens
            assert all(reference_probs(row, r)[0] == 0 for row, r in zip(logits, reqs))
        assert_reference_draws(logits, reqs, [seed, seed + 100])


def test_all_masked_row_falls_back():
    for seed in range(20):
        # every token is a stop token and min_new_tokens forbids stopping: the row is all -inf after masking, so
        # it samples from its unmasked logits
        p = SamplingParams(temperature=1.0, min_new_tokens=5, stop_token_ids=[0, 1, 2, 3], seed=seed)
        p.normalize()
        logits = torch.tensor([[0.0, 5.0, 1.0, 2.0]])
        torch.testing.assert_close(reference_probs(logits[0], Req("r", [1], p)), torch.softmax(logits[0].double(), 0))
        assert_reference_draws(logits, [Req("r", [1], p)], [seed])
        # nothing finite at all: uniform
        nan_row = torch.full((1, 4), float("nan"))
        assert reference_probs(nan_row[0], raw_req(temperature=1.0)).tolist() == [0.25] * 4
        assert_reference_draws(nan_row, [raw_req(temperature=1.0, seed=seed)], [seed])


def test_sampler_updates_inference_mode_logits():
    # the forward returns inference tensors; penalties update them in place (issue 9: this raised)
    for seed in range(20):
        with torch.inference_mode():
            logits = torch.randn(1, 8, generator=torch.Generator().manual_seed(seed))
        sp = dict(frequency_penalty=0.5, presence_penalty=0.5, repetition_penalty=1.2)
        assert_reference_draws(logits, [raw_req(seed=seed, **sp)], [seed])


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
