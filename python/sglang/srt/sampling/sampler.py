"""Batched sampling from float32 logits [B, V].

Order of operations per row (each step skipped when every row leaves it at its neutral value):
  client-sent logit processors (--enable-custom-logit-processor; custom_logit_processor.py) -> penalties (repetition over prompt+output, frequency/presence over output) -> min_new_tokens stop masking
  -> logit_bias -> grammar bitmask (structured output, constrained/logits_mask.py: one masking call for the batch;
  the grammar wins over min_new_tokens) -> logprobs (of the penalised logits, before temperature) -> greedy rows: argmax
  -> temperature -> softmax (both in place) -> top-k -> top-p -> min-p -> the draw: argmax(probs / Exp(1) noise),
  the exponential race torch.multinomial runs for one sample (a seeded request's noise comes from its CPU
  torch.Generator, so a seed gives the same tokens on any device).

Runs under torch.inference_mode, so it may update the logits a forward returned (inference tensors) in place.
Numerically safe for any parameter value, extreme or not: after penalties and after temperature the logits are made
finite where they must be (NaN -> -inf, +inf -> the largest float), a row left with no allowed token falls back to
the unmasked logits, and then to a uniform choice; temperature is capped so dividing never makes inf or NaN.
Nothing that is NaN or inf reaches softmax-then-the-draw.

Device discipline (test/registered/sampling/test_sampler_device_discipline.py): the host decides from the requests
alone which steps run; nothing on the device path reads a device value or runs an op whose output shape depends on
one, and one call makes exactly one device->host transfer, the packed result (_to_host). Host lists reach the device
through topk_topp.to_device (pinned, non_blocking on CUDA). On the CPU a read costs nothing, so CPU-only shortcuts
branch on values where that is cheaper (topk_topp.on_host; tests force the device path on CPU tensors too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Protocol, Sequence, Set

import torch

from sglang.jit_kernel.cpu_ops import get_cpu_ops
from sglang.srt.constrained.logits_mask import apply_grammar_mask_, apply_logit_bias_, has_grammar
from sglang.srt.sampling.custom_logit_processor import apply_custom_logit_processors_, has_custom_processor
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.sampling.topk_topp import filter_probs_, on_host, to_device


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
    # per row: [(token_id, logprob)] for the request's token_ids_logprob, or None
    token_ids_logprobs: Optional[List[Optional[List[tuple]]]] = None


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
    none or it is dead too, so softmax never sees a row without a finite maximum. No host read off the CPU."""
    dead = (logits > float("-inf")).any(dim=-1, keepdim=True).logical_not_()  # bool [B, 1]
    if on_host(logits.device) and not bool(dead.any()):
        return  # the CPU's common case: one reduction
    if fallback is not None:
        torch.where(dead, fallback, logits, out=logits)
        dead = (logits > float("-inf")).any(dim=-1, keepdim=True).logical_not_()
    logits.masked_fill_(dead, 0.0)


def _clamp(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


def _vocab_ids(ids: Sequence[int], vocab: int) -> torch.Tensor:
    """The distinct ids of a host list that index the vocabulary, as a sorted int64 CPU tensor (host work)."""
    t = torch.tensor(ids, dtype=torch.int64)
    return t[(t >= 0) & (t < vocab)].unique()


class _Scatter:
    """(row, id, value) triples gathered on the host, applied to the logits with one gather and one scatter."""

    def __init__(self):
        self.rows, self.ids, self.values = [], [], []

    def add(self, row: int, ids: torch.Tensor, values) -> None:
        self.rows.append(torch.full_like(ids, row))
        self.ids.append(ids)
        self.values.append(values if isinstance(values, torch.Tensor) else torch.full(ids.shape, values,
                                                                                    dtype=torch.float64))

    def to_device(self, logits: torch.Tensor):
        """(row index, id index, float32 values) on the logits' device; each (row, id) at most once."""
        index = to_device(torch.stack([torch.cat(self.rows), torch.cat(self.ids)]), torch.int64, logits.device)
        values = to_device(torch.cat(self.values), logits.dtype, logits.device)
        return index[0], index[1], values


def _apply_penalties(logits: torch.Tensor, reqs: List[Req]) -> None:
    """Repetition over prompt+output ids (positive logits divided by the factor, negative ones multiplied), then
    logit -= frequency x count(output) + presence x [count > 0]. The ids are deduplicated and counted on the host,
    so each (row, id) is one gather and one scatter: no unique/bincount/boolean mask on the device."""
    vocab = logits.shape[1]
    rep, freq = _Scatter(), _Scatter()
    for i, req in enumerate(reqs):
        sp = req.sampling_params
        if not sp.has_penalties:
            continue
        if sp.repetition_penalty != 1.0:
            # clamped into float32's range, so the factor is never 0 or inf (0 * inf would make NaN)
            rep.add(i, _vocab_ids(req.fill_ids, vocab),
                    _clamp(sp.repetition_penalty, PENALTY_FACTOR_MIN, PENALTY_FACTOR_MAX))
        if (sp.frequency_penalty or sp.presence_penalty) and req.output_ids:
            fp = _clamp(sp.frequency_penalty, -PENALTY_FACTOR_MAX, PENALTY_FACTOR_MAX)
            pp = _clamp(sp.presence_penalty, -PENALTY_FACTOR_MAX, PENALTY_FACTOR_MAX)
            out = torch.tensor(req.output_ids, dtype=torch.int64)
            ids, counts = out[(out >= 0) & (out < vocab)].unique(return_counts=True)
            # float64 on the host, then clamped into float32's range (an inf would be made finite anyway)
            freq.add(i, ids, (fp * counts.double() + pp).clamp_(-PENALTY_FACTOR_MAX, PENALTY_FACTOR_MAX))
    if rep.rows:
        rows, ids, factor = rep.to_device(logits)
        vals = logits[rows, ids]
        logits[rows, ids] = torch.where(vals > 0, vals / factor, vals * factor)
    if freq.rows:
        rows, ids, delta = freq.to_device(logits)
        logits[rows, ids] = logits[rows, ids] - delta


def _mask_stops_before_min_tokens(logits: torch.Tensor, reqs: List[Req]) -> None:
    vocab = logits.shape[1]
    rows, ids = [], []
    for i, req in enumerate(reqs):
        if len(req.output_ids) < req.sampling_params.min_new_tokens and req.stop_token_ids:
            stops = [t for t in req.stop_token_ids if 0 <= t < vocab]
            rows += [i] * len(stops)
            ids += stops
    if rows:
        index = to_device([rows, ids], torch.int64, logits.device)
        logits[index[0], index[1]] = float("-inf")


def argmax_only(reqs: List[Req]) -> bool:
    """True when sample() is the argmax of the raw logits for every row: all greedy, and nothing that reads or edits
    the logits first (logprobs, penalties, a min_new_tokens mask, logit_bias, a grammar, a custom processor)."""
    return (all(r.sampling_params.is_greedy for r in reqs) and not has_custom_processor(reqs)
            and not any(r.return_logprob or r.sampling_params.has_penalties or r.sampling_params.logit_bias
                        or r.sampling_params.min_new_tokens > len(r.output_ids) or has_grammar(r) for r in reqs))


def greedy_output(token_ids: torch.Tensor, reqs: List[Req]) -> SampleOutput:
    """sample()'s result for an argmax_only batch whose token ids the forward already chose (ForwardBatch.greedy_fused)."""
    return _to_host(token_ids, None, reqs)


@torch.inference_mode()
def sample(logits: torch.Tensor, reqs: List[Req], grammar_bitmask: Optional[torch.Tensor] = None) -> SampleOutput:
    """logits: float32 [B, V] (modified in place). grammar_bitmask: the preallocated int32 [>= B, ceil(V / 32)]
    buffer, needed when a request has a grammar."""
    if argmax_only(reqs):
        return greedy_output(greedy_argmax(logits), reqs)
    greedy = [r.sampling_params.is_greedy for r in reqs]
    want_lp = any(r.return_logprob for r in reqs)
    penalise = any(r.sampling_params.has_penalties for r in reqs)
    mask = any(r.sampling_params.min_new_tokens > len(r.output_ids) for r in reqs)
    biased = any(r.sampling_params.logit_bias for r in reqs)
    constrained = any(has_grammar(r) for r in reqs)
    custom = has_custom_processor(reqs)
    if custom:  # first, on the raw logits (upstream's order); what it writes is made finite below
        apply_custom_logit_processors_(logits, reqs)
    if penalise or mask or want_lp or custom or not all(greedy):
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

    logprobs = torch.log_softmax(logits, dim=-1) if want_lp else None
    if all(greedy):
        next_ids = greedy_argmax(logits)
    else:
        next_ids = _sample_random(logits, reqs, greedy)
    return _to_host(next_ids, logprobs, reqs)


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """int64 [B]: each row's first maximum, torch.max(dim=-1).indices' rule (a NaN counts as the maximum). On a CPU
    with the kernels loaded, one pass of sgl-kernel/csrc/cpu/logits.h on the kernels' threads: torch's reduction is
    an OpenMP region, a thread wake-up per decode step in the server's scheduler (~70 us against ~5 us of work)."""
    if logits.is_cpu and logits.dtype == torch.float32 and logits.dim() == 2 and logits.shape[1] > 0 \
            and logits.stride(1) == 1:
        ops = get_cpu_ops()
        if ops is not None:
            return ops.argmax_rows(logits)
    # max().indices: the same first-maximum index as argmax, ~2.5x faster on CPU for [B, 49k] float32
    return logits.max(dim=-1).indices


def _to_host(next_ids: torch.Tensor, logprobs: Optional[torch.Tensor], reqs: List[Req]) -> SampleOutput:
    """The call's one device->host transfer: next ids, with logprobs their log-probability and the top logprobs
    (values, then ids) packed as float64 [B, 2 + 2 k] (ids < 2^53 are exact in float64)."""
    if logprobs is None:
        return SampleOutput(next_ids.tolist())
    k_max = max((r.top_logprobs_num for r in reqs if r.return_logprob), default=0)
    cols = [next_ids.view(-1, 1), logprobs.gather(1, next_ids.view(-1, 1))]
    if k_max > 0:
        cols += list(logprobs.topk(k_max, dim=-1))
    id_lists = [getattr(r, "token_ids_logprob", None) if r.return_logprob else None for r in reqs]
    n_ids = max((len(ids) for ids in id_lists if ids), default=0)
    if n_ids > 0:  # upstream's token_ids_logprob: these ids' logprobs at every output token
        padded = [list(ids or []) + [0] * (n_ids - len(ids or [])) for ids in id_lists]
        cols.append(logprobs.gather(1, torch.tensor(padded, dtype=torch.int64, device=logprobs.device)))
    packed = torch.cat([c.to(torch.float64) for c in cols], dim=1).tolist()
    token_logprobs = [row[1] if r.return_logprob else None for row, r in zip(packed, reqs)]
    top_logprobs = None
    if k_max > 0:
        top_logprobs = [
            [(int(t), v) for t, v in zip(row[2 + k_max:2 + k_max + n], row[2:2 + n])]
            if r.return_logprob and n else None
            for row, r, n in zip(packed, reqs, (r.top_logprobs_num for r in reqs))
        ]
    by_id = None
    if n_ids > 0:
        base = 2 + 2 * k_max
        by_id = [list(zip(ids, row[base:base + len(ids)])) if ids else None for row, ids in zip(packed, id_lists)]
    return SampleOutput([int(row[0]) for row in packed], token_logprobs, top_logprobs, by_id)


def _sample_random(logits: torch.Tensor, reqs: List[Req], greedy: List[bool]) -> torch.Tensor:
    """Next tokens [B] int64. Turns logits into the filtered probabilities in place, then the exponential race:
    argmax(probs / E), E ~ Exp(1) per entry, picks token i with probability probs_i / sum(probs) -- the draw
    torch.multinomial(probs, 1) makes. The noise [B, V] is the only [B, V] tensor this allocates, in place of
    multinomial's own (mem_plan/sizes.py, the sampler's peak)."""
    device = logits.device
    # greedy rows: the first maximum of their logits, taken before the logits become probabilities
    greedy_ids = greedy_argmax(logits) if any(greedy) else None
    temps = [1.0 if g else min(r.sampling_params.temperature, MAX_TEMPERATURE) for r, g in zip(reqs, greedy)]
    logits.div_(to_device(temps, logits.dtype, device).view(-1, 1))
    _make_finite_(logits)  # a tiny temperature can push the largest logits to +inf
    probs = _softmax_(logits)

    top_ks = [r.sampling_params.top_k for r in reqs]
    top_ps = [r.sampling_params.top_p for r in reqs]
    min_ps = [r.sampling_params.min_p for r in reqs]
    filter_probs_(probs, top_ks, top_ps, min_ps)  # no vocabulary sort: sampling/topk_topp.py

    noise = torch.empty_like(probs)
    seeded = [i for i, (r, g) in enumerate(zip(reqs, greedy)) if r.generator is not None and not g]
    if len(seeded) + sum(greedy) < len(reqs):
        # unseeded rows, from the device's generator: Exp(1) as -log(U) -- exponential_'s CPU kernel is ~6x slower
        # (22.6 vs 3.7 ms for 32 x 49,152 on two cores). U in [tiny, 1): the noise is finite and > 0, so a row's
        # largest probability (>= 1/V) always races above 0 and a zero probability never wins. Seeded rows are
        # overwritten below.
        noise.uniform_(torch.finfo(noise.dtype).tiny, 1.0).log_().neg_()
    else:
        noise.fill_(1.0)  # no unseeded row: the device's generator is not advanced
    if seeded:
        _seeded_noise_(noise, seeded, [reqs[i].generator for i in seeded])
    next_ids = probs.div_(noise).argmax(dim=-1)
    del noise
    if greedy_ids is not None:
        next_ids = torch.where(to_device(greedy, torch.bool, device), greedy_ids, next_ids)
    return next_ids


def _seeded_noise_(noise: torch.Tensor, rows: List[int], generators: List[torch.Generator]) -> None:
    """noise[rows[j]] = Exp(1) draws of generators[j] (CPU generators): the values a CPU torch.multinomial(p, 1,
    generator=g) races with, so a seed gives the same tokens as there, on any device. Off the CPU each row is drawn
    on the host into its own pinned row and copied non_blocking (the pinned allocator keeps a row until its copy
    has run): no device memory beyond the noise itself."""
    host = on_host(noise.device)
    pin = noise.device.type == "cuda"
    for i, g in zip(rows, generators):
        if host:
            noise[i].exponential_(generator=g)
        else:
            draw = torch.empty(noise.shape[1], dtype=noise.dtype, pin_memory=pin).exponential_(generator=g)
            noise[i].copy_(draw, non_blocking=pin)
            del draw  # one host row at a time


def _softmax_(logits: torch.Tensor) -> torch.Tensor:
    """softmax over the last dim, in place (rows have a finite maximum: _unmask_dead_rows_). Returns logits."""
    logits.sub_(logits.amax(dim=-1, keepdim=True)).exp_()
    return logits.div_(logits.sum(dim=-1, keepdim=True))
