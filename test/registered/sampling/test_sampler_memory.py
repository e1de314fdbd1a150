"""The sampler's real peak memory against its planned term, and seeded draws against an independent computation.

  * memory (torch profiler on CPU, alloc_peak.py): one batch that uses every sampler feature at once (greedy,
    seeded and unseeded rows, temperature, top-k/top-p/min-p, penalties, min_new_tokens, logit_bias, logprobs with
    top logprobs). Decode: the logits plus what sample() allocates stay within the planned per-slot term less its
    prefill item; prefill (the forward's logits held while a copy of the finished rows is sampled, as
    managers/batch_runner.py does): within the whole term (mem_plan/sizes.py). The decode figure is also at least
    the logits + logprobs + draw noise the term itemises, so the measurement sees the draw. Both the CPU path and
    the device path (topk_topp.FORCE_DEVICE_PATH on CPU tensors); the latter's figure includes one seeded row's
    host draw (V floats, host memory on a GPU).
  * seeds: a seeded request's tokens are torch.multinomial's draws, with torch.Generator().manual_seed(seed), over
    the probabilities of the definition computed here in float64 with a full sort (softmax of logits / T, top-k,
    top-p, min-p) -- the same tokens, step after step, on both paths (the sampler races the probabilities with the
    generator's Exp(1) noise, as torch.multinomial does for one sample).
"""

import pytest
import torch
from alloc_peak import peak_alloc_bytes
from sampling_reference import filtered_probs

from sglang.srt.managers.schedule_batch import Req
from sglang.srt.mem_plan.sizes import (
    SAMPLER_DRAW_NOISE_BYTES_PER_VOCAB_ENTRY, SAMPLER_LOGITS_BYTES_PER_VOCAB_ENTRY,
    SAMPLER_LOGPROBS_BYTES_PER_VOCAB_ENTRY, SAMPLER_PREFILL_ROWS_BYTES_PER_VOCAB_ENTRY, sampler_bytes_per_slot,
    sampler_fixed_bytes)
from sglang.srt.sampling import topk_topp
from sglang.srt.sampling.sampler import sample
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="cpu")

BATCH, VOCAB = 8, 32768


def every_feature_batch() -> list:
    reqs = []
    for i in range(BATCH):
        # top-k within the candidates: no row falls back to the full sort (its fixed term: test_topk_topp.py)
        sp = dict(temperature=0.8, top_k=[40, 1000][i % 2], top_p=0.9, min_p=0.02, repetition_penalty=1.1,
                  frequency_penalty=0.3, presence_penalty=0.2, min_new_tokens=5, logit_bias={"5": 2.0})
        if i == 0:
            sp = dict(temperature=0)
        elif i % 3 == 1:
            sp["seed"] = i
        r = Req("r", [1, 2, 3], SamplingParams.from_dict(sp), eos_token_ids={0})
        r.output_ids = [3, 4]
        r.return_logprob, r.top_logprobs_num = True, 5
        reqs.append(r)
    return reqs


@pytest.mark.parametrize("device_path", [False, True])
def test_peak_within_the_planned_sampler_term(monkeypatch, device_path):
    def no_fallback(*args):
        raise AssertionError("a row fell back to the full sort")

    monkeypatch.setattr(topk_topp, "_by_sort_", no_fallback)
    # the device path on CPU tensors (the CPU path's shortcuts off): what a GPU allocates, host rows aside
    monkeypatch.setattr(topk_topp, "FORCE_DEVICE_PATH", device_path)
    reqs = every_feature_batch()
    logits = torch.randn(BATCH, VOCAB, generator=torch.Generator().manual_seed(0)) * 4
    sample(logits.clone(), reqs)  # warm-up: first-call allocations are not the sampler's
    logits_bytes = logits.numel() * logits.element_size()
    decode = peak_alloc_bytes(lambda: sample(logits.clone(), reqs))  # the clone stands for the forward's logits
    fwd = logits.clone()
    prefill = logits_bytes + peak_alloc_bytes(lambda: sample(fwd[list(range(BATCH))], reqs))
    per_slot = sampler_bytes_per_slot(VOCAB)
    entries = BATCH * VOCAB
    print(f"{'device' if device_path else 'CPU'} path: sampler peak per vocabulary entry: decode "
          f"{decode / entries:.2f} B, prefill {prefill / entries:.2f} B; "
          f"planned {per_slot / VOCAB:.2f} B per slot and entry (the fixed {sampler_fixed_bytes(VOCAB):,} B "
          "serves rows that fall back to a full sort: none here)")
    prefill_item = BATCH * VOCAB * SAMPLER_PREFILL_ROWS_BYTES_PER_VOCAB_ENTRY
    assert decode <= BATCH * per_slot - prefill_item
    assert prefill <= BATCH * per_slot
    itemised = (SAMPLER_LOGITS_BYTES_PER_VOCAB_ENTRY + SAMPLER_LOGPROBS_BYTES_PER_VOCAB_ENTRY
                + SAMPLER_DRAW_NOISE_BYTES_PER_VOCAB_ENTRY)
    assert decode >= itemised * entries


@pytest.mark.parametrize("device_path", [False, True])
def test_seeded_tokens_are_the_seeded_multinomial_of_the_definition(monkeypatch, device_path):
    monkeypatch.setattr(topk_topp, "FORCE_DEVICE_PATH", device_path)
    g = torch.Generator().manual_seed(1)
    for seed, sp_dict in ((11, dict(temperature=0.7)), (12, dict(temperature=1.3, top_k=50, top_p=0.95)),
                          (13, dict(temperature=0.9, top_p=0.8, min_p=0.05))):
        sp = SamplingParams.from_dict({**sp_dict, "seed": seed})
        r = Req("r", [1, 2, 3], sp, eos_token_ids={0})
        other = Req("o", [1, 2, 3], SamplingParams.from_dict({"temperature": 1.0}), eos_token_ids={0})
        ref_gen = torch.Generator().manual_seed(seed)
        got, want = [], []
        for _ in range(20):
            logits = torch.randn(2, 5000, generator=g) * 3
            # an unseeded row in the same batch must not move the seeded row's stream
            got.append(sample(logits.clone(), [r, other]).next_token_ids[0])
            want.append(int(torch.multinomial(filtered_probs(logits[0], sp).float(), 1, generator=ref_gen)))
        assert got == want, (sp_dict, got, want)
