"""Batched sampling from float32 logits [B, V].

Order of operations per row (each step skipped when every row leaves it at its neutral value):
  penalties (repetition over prompt+output, frequency/presence over output) -> min_new_tokens stop masking
  -> logit_bias -> grammar bitmask (structured output, constrained/logits_mask.py: one masking call for the batch;
  the grammar wins over min_new_tokens) -> logprobs (of the penalised logits, before temperature) -> greedy rows: argmax
  -> temperature -> softmax (both in place) -> top-k -> top-p -> min-p -> multinomial (a per-request
  torch.Generator, on the CPU, when a seed is given).

Runs under torch.inference_mode, so it may update the logits a forward returned (inference tensors) in place.
Numerically safe for any parameter value, extreme or not: after penalties and after temperature the logits are made
finite where they must be (NaN -> -inf, +inf -> the largest float), a row left with no allowed token falls back to
the unmasked logits, and then to a uniform choice; temperature is capped so dividing never makes inf or NaN.
Nothing that is NaN or inf reaches softmax-then-multinomial.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Protocol, Sequence, Set

import torch

from sglang.srt.constrained.logits_mask import apply_grammar_mask_, apply_logit_bias_, has_grammar
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.sampling.topk_topp import filter_probs_


class Req(Protocol):
    """What the sampler reads of a request (managers/schedule_batch.Req provides it; sampling does not import
    managers, so the two packages do not import each other)."""

    sampling_params: SamplingParams
    output_ids: List[int]
    stop_token_ids: Set[int]
    return_logprob: bool
    top_logprobs_num: int
    generator: Optional[torch.Generator]
    grammar: Optional[Any]  # structured output: constrained/request_grammar.RequestGrammar, or None

    @property
    def fill_ids(self) -> Sequence[int]: ...


@dataclass
class SampleOutput:
    next_token_ids: List[int]
    token_logprobs: Optional[List[float]] = None  # per row, None entries if not asked
    top_logprobs: Optional[List[Optional[List[tuple]]]] = None


# Dividing by more than this cannot change a float32 logit distribution further (logits are ~1e2; the float32 range
# ends at ~3.4e38): temperatures above it sample as if it were this.
MAX_TEMPERATURE = 1e30
# Penalty factors are clamped into this range (float32 holds it exactly enough; beyond it only inf and 0 remain).
PENALTY_FACTOR_MIN = 1e-30
PENALTY_FACTOR_MAX = 1e30


def _make_finite_(logits: torch.Tensor) -> None:
    """NaN -> -inf (never chosen), +inf -> the largest finite value (ties among the largest); -inf stays masked."""
    big = torch.finfo(logits.dtype).max
    torch.nan_to_num_(logits, nan=float("-inf"), posinf=big, neginf=float("-inf"))


def _unmask_dead_rows_(logits: torch.Tensor, fallback: Optional[torch.Tensor] = None) -> None:
    """Rows where every token is -inf take `fallback` (the logits before masking), or 0 (uniform) if there is
    none or it is dead too, so softmax never sees a row without a finite maximum."""
    dead = ~(logits > float("-inf")).any(dim=-1)
    if not bool(dead.any()):
        return
    if fallback is not None:
        logits[dead] = fallback[dead]
        dead = ~(logits > float("-inf")).any(dim=-1)
    logits[dead] = 0.0


def _clamp(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


def _apply_penalties(logits: torch.Tensor, reqs: List[Req]) -> None:
    vocab = logits.shape[1]
    for i, req in enumerate(reqs):
        sp = req.sampling_params
        if not sp.has_penalties:
            continue
        row = logits[i]
        if sp.repetition_penalty != 1.0:
            # clamped into float32's range, so the factor is never 0 or inf (0 * inf would make NaN)
            rp = _clamp(sp.repetition_penalty, PENALTY_FACTOR_MIN, PENALTY_FACTOR_MAX)
            seen = torch.tensor(req.fill_ids, dtype=torch.int64, device=row.device)
            seen = seen[(seen >= 0) & (seen < vocab)].unique()
            vals = row[seen]
            row[seen] = torch.where(vals > 0, vals / rp, vals * rp)
        if (sp.frequency_penalty or sp.presence_penalty) and req.output_ids:
            fp = _clamp(sp.frequency_penalty, -PENALTY_FACTOR_MAX, PENALTY_FACTOR_MAX)
            pp = _clamp(sp.presence_penalty, -PENALTY_FACTOR_MAX, PENALTY_FACTOR_MAX)
            counts = torch.bincount(torch.tensor(req.output_ids, dtype=torch.int64, device=row.device),
                                    minlength=vocab)[:vocab]
            row -= fp * counts.to(row.dtype)
            row -= pp * (counts > 0).to(row.dtype)


def _mask_stops_before_min_tokens(logits: torch.Tensor, reqs: List[Req]) -> None:
    for i, req in enumerate(reqs):
        if len(req.output_ids) < req.sampling_params.min_new_tokens and req.stop_token_ids:
            ids = [t for t in req.stop_token_ids if t < logits.shape[1]]
            logits[i, ids] = float("-inf")


@torch.inference_mode()
def sample(logits: torch.Tensor, reqs: List[Req], grammar_bitmask: Optional[torch.Tensor] = None) -> SampleOutput:
    """logits: float32 [B, V] (modified in place). grammar_bitmask: the preallocated int32 [>= B, ceil(V / 32)]
    buffer, needed when a request has a grammar."""
    greedy = [r.sampling_params.is_greedy for r in reqs]
    want_lp = any(r.return_logprob for r in reqs)
    penalise = any(r.sampling_params.has_penalties for r in reqs)
    mask = any(r.sampling_params.min_new_tokens > len(r.output_ids) for r in reqs)
    biased = any(r.sampling_params.logit_bias for r in reqs)
    constrained = any(has_grammar(r) for r in reqs)
    if penalise or mask or want_lp or not all(greedy):
        _make_finite_(logits)
        if penalise:
            _apply_penalties(logits, reqs)
            _make_finite_(logits)
        if mask:
            unmasked = logits.clone()
            _mask_stops_before_min_tokens(logits, reqs)
            _unmask_dead_rows_(logits, unmasked)
            del unmasked  # not live at the draw (mem_plan/sizes.py counts the sampler's peak there)
        else:
            _unmask_dead_rows_(logits)

    if biased:
        apply_logit_bias_(logits, reqs)
    if constrained:  # last: a row the grammar leaves without a finite logit samples uniformly among its tokens
        apply_grammar_mask_(logits, reqs, grammar_bitmask)

    token_logprobs = top_logprobs = None
    if want_lp:
        logprobs = torch.log_softmax(logits, dim=-1)

    if all(greedy):
        # max().indices: the same first-maximum index as argmax, ~2.5x faster on CPU for [B, 49k] float32
        next_ids = logits.max(dim=-1).indices
    else:
        next_ids = _sample_random(logits, reqs, greedy)

    if want_lp:
        chosen = logprobs.gather(1, next_ids.view(-1, 1)).view(-1).tolist()
        token_logprobs = [chosen[i] if r.return_logprob else None for i, r in enumerate(reqs)]
        k_max = max((r.top_logprobs_num for r in reqs if r.return_logprob), default=0)
        if k_max > 0:
            vals, idx = logprobs.topk(k_max, dim=-1)
            vals, idx = vals.tolist(), idx.tolist()
            top_logprobs = [
                list(zip(idx[i][: r.top_logprobs_num], vals[i][: r.top_logprobs_num]))
                if r.return_logprob and r.top_logprobs_num else None
                for i, r in enumerate(reqs)
            ]
    return SampleOutput(next_ids.tolist(), token_logprobs, top_logprobs)


def _sample_random(logits: torch.Tensor, reqs: List[Req], greedy: List[bool]) -> torch.Tensor:
    """Next tokens [B] int64. Turns logits into the filtered probabilities in place: the only [B, V] tensor this
    allocates is torch.multinomial's Exp(1) noise (mem_plan/sizes.py, the sampler's peak)."""
    # greedy rows: the first maximum of their logits, taken before the logits become probabilities
    out = logits.argmax(dim=-1)
    temps = torch.tensor([1.0 if g else min(r.sampling_params.temperature, MAX_TEMPERATURE)
                          for r, g in zip(reqs, greedy)], dtype=logits.dtype, device=logits.device)
    logits.div_(temps.view(-1, 1))
    _make_finite_(logits)  # a tiny temperature can push the largest logits to +inf
    probs = _softmax_(logits)

    top_ks = [r.sampling_params.top_k for r in reqs]
    top_ps = [r.sampling_params.top_p for r in reqs]
    min_ps = [r.sampling_params.min_p for r in reqs]
    filter_probs_(probs, top_ks, top_ps, min_ps)  # no vocabulary sort: sampling/topk_topp.py

    unseeded = [r.generator is None and not g for r, g in zip(reqs, greedy)]
    if any(unseeded):
        # one draw for every row (greedy and seeded rows' draws are discarded): no copy of the unseeded rows
        drawn = torch.multinomial(probs, 1).view(-1)
        out = torch.where(torch.tensor(unseeded, device=out.device), drawn, out)
    for i, r in enumerate(reqs):
        if r.generator is not None and not greedy[i]:
            # a seeded request draws on the CPU (its generator lives there): the same tokens on any device
            out[i] = torch.multinomial(probs[i].cpu(), 1, generator=r.generator)[0]
    return out


def _softmax_(logits: torch.Tensor) -> torch.Tensor:
    """softmax over the last dim, in place (rows have a finite maximum: _unmask_dead_rows_). Returns logits."""
    logits.sub_(logits.amax(dim=-1, keepdim=True)).exp_()
    return logits.div_(logits.sum(dim=-1, keepdim=True))
