"""The sampler's definition (sampling/sampler.py, module docstring) computed independently of it: per element in
Python floats and float64, with a full sort, for the tests to hold sample() against.

    finite logits (NaN -> -inf, +inf -> float32's largest) -> repetition penalty over prompt + output ids (a positive
    logit divided by the factor, a negative one multiplied) -> minus frequency x count + presence over the output
    -> stop tokens masked before min_new_tokens (a row left with nothing takes the unmasked logits, then uniform)
    -> greedy: the first maximum; else softmax(logits / T) -> top-k -> top-p -> min-p
A seeded request's token is then torch.multinomial(probs, 1, generator=Generator().manual_seed(seed)).
"""

import math
from collections import Counter
from dataclasses import replace

import torch

from sglang.srt.sampling.sampler import MAX_TEMPERATURE, PENALTY_FACTOR_MAX, PENALTY_FACTOR_MIN

FLOAT32_MAX = torch.finfo(torch.float32).max


def _as_float32(x: float) -> float:
    """The value the sampler's float32 holds, made finite its way: NaN -> -inf, +inf -> the largest float32."""
    if math.isnan(x):
        return -math.inf
    x = float(torch.tensor(x, dtype=torch.float64).to(torch.float32))  # beyond float32's range: +-inf
    return FLOAT32_MAX if x == math.inf else x


def _clamp(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


def reference_logits(row: torch.Tensor, req) -> list:
    """The logits after penalties and min_new_tokens masking (with its fallbacks), as Python floats."""
    sp, vocab = req.sampling_params, len(row)
    x = [_as_float32(v) for v in row.tolist()]
    if sp.repetition_penalty != 1.0:
        factor = _clamp(sp.repetition_penalty, PENALTY_FACTOR_MIN, PENALTY_FACTOR_MAX)
        for t in set(req.fill_ids) & set(range(vocab)):
            x[t] = _as_float32(x[t] / factor if x[t] > 0 else x[t] * factor)
    fp = _clamp(sp.frequency_penalty, -PENALTY_FACTOR_MAX, PENALTY_FACTOR_MAX)
    pp = _clamp(sp.presence_penalty, -PENALTY_FACTOR_MAX, PENALTY_FACTOR_MAX)
    for t, count in Counter(req.output_ids).items():
        if (fp or pp) and 0 <= t < vocab:
            x[t] = _as_float32(x[t] - _clamp(fp * count + pp, -PENALTY_FACTOR_MAX, PENALTY_FACTOR_MAX))
    if len(req.output_ids) < sp.min_new_tokens:
        masked = [-math.inf if t in req.stop_token_ids else v for t, v in enumerate(x)]
        x = masked if max(masked) > -math.inf else x
    return x if max(x) > -math.inf else [0.0] * vocab


def filtered_probs(logits: torch.Tensor, sp) -> torch.Tensor:
    """float64 softmax(logits / T), then top-k, top-p (mass before a rank <= p; rank 0 always kept), min-p against
    the largest probability; unnormalised (the draw does not need it)."""
    probs = torch.softmax(logits.double() / sp.temperature, dim=-1)
    values, order = probs.sort(descending=True, stable=True)
    ranks = torch.arange(len(values))
    k = len(values) if sp.top_k == -1 else sp.top_k
    keep = (ranks < k) & ((values.cumsum(0) - values <= sp.top_p) | (ranks == 0))
    keep &= values >= sp.min_p * values[0]
    out = torch.zeros_like(probs)
    out[order[keep]] = probs[order[keep]]
    return out


def reference_probs(row: torch.Tensor, req) -> torch.Tensor:
    """The probabilities sample() draws row's token from, float64 [V] (greedy: one-hot at the first maximum)."""
    x = reference_logits(row, req)
    sp = req.sampling_params
    if sp.is_greedy:
        out = torch.zeros(len(x), dtype=torch.float64)
        out[x.index(max(x))] = 1.0
        return out
    temperature = min(sp.temperature, MAX_TEMPERATURE)
    scaled = torch.tensor([_as_float32(v / temperature) for v in x], dtype=torch.float64)
    return filtered_probs(scaled, replace(sp, temperature=1.0))  # divided above, in float32 as the sampler does


def seeded_draw(probs: torch.Tensor, seed: int) -> int:
    return int(torch.multinomial(probs.float(), 1, generator=torch.Generator().manual_seed(seed)))
