"""The proposer protocol of speculative decoding (managers/spec_decode.py drives it).

A proposer suggests, per decoding request, up to max_k tokens that may follow its last output token. Proposals are
deterministic (a point-mass draft), which is what lets speculative/verify.py accept them exactly: greedy output is
the target's own, and sampling keeps the target's distribution. A proposer never touches KV or the request's state.

    propose(reqs, max_k)        -> per request a list of at most max_k[i] token ids (empty: decode without proposals)
    on_extend(units)            after a target extend forward of (req, num_tokens) units (a draft model prefills here)
    on_decoded(reqs)            after an ordinary decode step (no proposals in the batch; a hidden-state head catches up)
    on_verified(reqs, committed) after a verify step: how many tokens each request committed
    release(req)                the request left the scheduler (finished, failed or aborted)
"""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple


class Proposer:
    def propose(self, reqs: Sequence[Any], max_k: Sequence[int]) -> List[List[int]]:
        raise NotImplementedError

    def on_extend(self, units: Sequence[Tuple[Any, int]]) -> None:
        pass

    def on_decoded(self, reqs: Sequence[Any]) -> None:
        pass

    def on_verified(self, reqs: Sequence[Any], committed: Sequence[int]) -> None:
        pass

    def release(self, req: Any) -> None:
        pass

