"""When to propose: the adaptive policy of speculative decoding (managers/spec_decode.py asks it every step).

Per request an acceptance-rate EMA (accepted proposals / proposed, over its verify steps). A request whose rate falls
below MIN_ACCEPT_RATE stops proposing for a pause, then probes again; pauses double while probes keep failing.
Per step a batch budget: the verify forward holds at most max(batch size, verify_token_budget) tokens, the proposals
going to the requests with the best EMA first. On a CPU a forward's cost grows with its tokens as soon as the batch
is more than a few rows (the GEMMs become compute-bound, and the verify forward takes the extend kernels instead of
the decode ones), so the CPU budget is small: batch 1 proposes its full chain, large batches decode as without
speculation. Elsewhere the budget is the plan's verify_token_cap of every slot's verify rows (a tree's branches
expanded), so a full batch of whole trees fits it: mem_plan/spec_sizes.verify_budget, which SpecDecoder reads.
"""

from __future__ import annotations

from typing import Dict, List, Sequence


# Initial rate: a new request proposes at once (one step of evidence decides whether it keeps going).
INITIAL_ACCEPT_RATE = 0.5
# Weight of the latest verify step in the EMA: a request's text changes character quickly (quoting, then writing).
EMA_WEIGHT = 0.5
# Below this rate a proposal of k tokens adds ~k rows for < 1 expected accepted token when k >= 4: it does not pay
# on a CPU, where each verify row costs compute (benchmark/README.md has the measurements).
MIN_ACCEPT_RATE = 0.25
# Decode steps a request waits before probing again; doubled per failed probe up to MAX_PAUSE_STEPS, so a text that
# never repeats costs about one wasted verify per MAX_PAUSE_STEPS tokens.
PAUSE_STEPS = 8
MAX_PAUSE_STEPS = 64
# The rate a probe starts from: one fully rejected probe pauses again (0.3 * 0.5 < MIN_ACCEPT_RATE).
PROBE_ACCEPT_RATE = 0.3


class _ReqStats:
    __slots__ = ("rate", "paused_until", "pause")

    def __init__(self):
        self.rate, self.paused_until, self.pause = INITIAL_ACCEPT_RATE, -1, PAUSE_STEPS


class SpecPolicy:
    def __init__(self, max_proposals: int, verify_token_budget: int):
        """max_proposals: a request's most rows in a verify forward - 1 (spec_sizes.verify_rows_per_request: a tree's
        expanded rows); verify_token_budget: spec_sizes.verify_budget."""
        self.max_proposals = max_proposals
        self.verify_token_budget = verify_token_budget
        self.step = 0
        self.stats: Dict[str, _ReqStats] = {}

    def _get(self, rid: str) -> _ReqStats:
        s = self.stats.get(rid)
        if s is None:
            s = self.stats[rid] = _ReqStats()
        return s

    def max_k(self, reqs: Sequence) -> List[int]:
        """Proposals each request may make this step (0: none)."""
        self.step += 1
        out = [0] * len(reqs)
        extra = self.verify_token_budget - len(reqs)  # tokens beyond one per request
        if extra <= 0:
            return out
        want = []
        for i, r in enumerate(reqs):
            s = self._get(r.rid)
            # the last verified token is the bonus or correction: k proposals may yield k + 1 tokens
            k = min(self.max_proposals, r.remaining_new_tokens() - 1)
            if k > 0 and s.paused_until <= self.step:
                want.append((-s.rate, i, k))
        for _, i, k in sorted(want):
            out[i] = min(k, extra)
            extra -= out[i]
            if extra <= 0:
                break
        return out

    def on_verified(self, req, proposed: int, accepted: int) -> None:
        if proposed <= 0:
            return
        s = self._get(req.rid)
        s.rate += EMA_WEIGHT * (accepted / proposed - s.rate)
        if s.rate >= MIN_ACCEPT_RATE:
            s.pause = PAUSE_STEPS
            return
        s.paused_until = self.step + s.pause
        s.pause = min(2 * s.pause, MAX_PAUSE_STEPS)
        s.rate = PROBE_ACCEPT_RATE

    def release(self, rid: str) -> None:
        self.stats.pop(rid, None)
