"""Verification of chain proposals against the target's logits: which proposed tokens a request keeps, and the token
after them (the correction, or the bonus token when every proposal was kept).

Request i's rows of `logits` are offsets[i] .. offsets[i] + k_i (k_i = len(proposals[i])); row j is the target's
distribution of the token after input j of [x0, d1, .., dk]. verify samples t_j from row j with the request's state as
if t_0 .. t_{j-1} were already output, hands t_j to `commit`, and goes on while t_j == d_{j+1}; it stops after the
first mismatch (t_j is the correction), after the last row (the bonus token), or when commit says the request is done.

Why this is exact (the point-mass argument). Speculative rejection sampling with a draft distribution q accepts a
proposal d with probability min(1, p(d) / q(d)) and on rejection draws from (p - q)+ renormalized. A deterministic
proposer is a point mass, q = 1 at d: it accepts d with probability p(d), and (p - q)+ is p with d removed, so the
correction is drawn from p restricted to tokens != d. Drawing t ~ p and accepting when t == d does exactly that:
P(t == d) = p(d), and given t != d, t is distributed as p restricted to != d. Row j's distribution p_j is the
target's conditional given x0 and t_0 .. t_{j-1} == d_1 .. d_j -- the only case in which row j is reached -- so the
committed tokens have the law of non-speculative decoding, token by token. What this needs of the draws: each
row's draw independent of the earlier rows' (the sampler's noise is drawn per row), and each row processed as
non-speculative decoding would at that output length (penalties, min_new_tokens: the proxies below).

Two paths:
  batched     requests without a grammar, a seeded generator or a client logit processor: one sample() call over
              all their rows, row j of a request standing for it through a RowView whose output_ids are its own
              plus d_1 .. d_j. Greedy rows give the tokens of non-speculative decoding; unseeded random rows the
              same distribution (above).
  sequential  requests with a grammar (its matcher only knows its current position, and advances only through
              commit, over accepted tokens), a seeded generator (a seed draws one noise row per committed token, so
              it gives exactly the tokens of non-speculative decoding) or a client logit processor (it sees the real
              request): row by row, sample(logits[row], [req]) with the real request, commit, stop on mismatch.
              apply_grammar_mask_ refills a bitmask row unless its filler filled it for this grammar at this
              row and position (RequestGrammar.num_accepted), so a fill made for the batch is never reused stale.
verify never touches KV or memory; the caller's commit appends the token (logprobs: the target row's, as sample()
returns them) and gives back the slots of what was not kept.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import torch

from sglang.srt.sampling.sampler import SampleOutput, sample

# commit(i, out, row): append row `row` of `out` to request i; False when the request is finished or dropped
Commit = Callable[[int, SampleOutput, int], bool]


class RowView:
    """A request as the sampler sees it at row j of its verify rows: its output followed by the first j proposals.
    Only read by the batched path (no grammar, generator or client processor)."""

    __slots__ = ("req", "tail", "output_ids")
    generator = None
    grammar = None
    custom_logit_processor = None

    def __init__(self, req: Any, tail: List[int]):
        self.req, self.tail = req, tail
        sp = req.sampling_params
        # the output is copied only where the sampler reads its contents (penalties) or its length can matter
        # (min_new_tokens not yet reached); otherwise the request's own list answers every question the same way
        reads = sp.has_penalties or sp.min_new_tokens > len(req.output_ids)
        self.output_ids = req.output_ids + tail if reads else req.output_ids

    @property
    def sampling_params(self):
        return self.req.sampling_params

    @property
    def stop_token_ids(self):
        return self.req.stop_token_ids

    @property
    def return_logprob(self) -> bool:
        return self.req.return_logprob

    @property
    def top_logprobs_num(self) -> int:
        return self.req.top_logprobs_num

    @property
    def token_ids_logprob(self) -> Optional[List[int]]:
        return getattr(self.req, "token_ids_logprob", None)

    @property
    def fill_ids(self) -> Sequence[int]:
        return list(self.req.fill_ids) + self.tail


def needs_sequential(req: Any) -> bool:
    """The request's rows must be sampled one at a time with the request itself (module docstring)."""
    return (getattr(req, "grammar", None) is not None
            or (req.generator is not None and not req.sampling_params.is_greedy)
            or bool(getattr(req, "custom_logit_processor", None)))


def _commit_chain(i: int, proposals: List[int], out: SampleOutput, first: int, commit: Commit,
                  sample_row: Optional[Callable[[int], SampleOutput]] = None) -> int:
    """Commit rows first, first + 1, .. of request i until a mismatch, the last row, or commit returning False.
    sample_row(j), when given, samples row j just before it is committed (the sequential path; out is unused)."""
    committed = 0
    for j in range(len(proposals) + 1):
        if sample_row is not None:
            out, row = sample_row(j), 0
        else:
            row = first + j
        token = out.next_token_ids[row]
        committed += 1
        if not commit(i, out, row) or j == len(proposals) or token != proposals[j]:
            break
    return committed


@torch.inference_mode()
def verify(logits: torch.Tensor, reqs: List[Any], proposals: List[List[int]], offsets: List[int],
           commit: Commit, grammar_bitmask) -> List[int]:
    """logits float32 [N, V] (modified in place). Commits each request's tokens in request order through commit;
    returns how many tokens were committed per request (commit calls, the last one included when it returned
    False)."""
    assert len(reqs) == len(proposals) == len(offsets)
    batched = [i for i, r in enumerate(reqs) if not needs_sequential(r)]
    views, rows = [], []
    for i in batched:
        for j in range(len(proposals[i]) + 1):
            rows.append(offsets[i] + j)
            views.append(reqs[i] if j == 0 else RowView(reqs[i], proposals[i][:j]))
    out = None
    if rows:
        every = rows == list(range(logits.shape[0]))
        out = sample(logits if every else logits[rows], views)
    first = dict(zip(batched, _starts([len(proposals[i]) + 1 for i in batched])))
    counts = []
    for i, req in enumerate(reqs):
        if i in first:
            counts.append(_commit_chain(i, proposals[i], out, first[i], commit))
            continue

        def sample_row(j: int, req=req, base=offsets[i]) -> SampleOutput:
            return sample(logits[base + j: base + j + 1], [req], grammar_bitmask)

        counts.append(_commit_chain(i, proposals[i], None, 0, commit, sample_row))
    return counts


def _starts(lengths: List[int]) -> List[int]:
    out, acc = [], 0
    for n in lengths:
        out.append(acc)
        acc += n
    return out
