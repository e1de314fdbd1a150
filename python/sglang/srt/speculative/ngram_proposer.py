"""NGRAM proposals: continue the text the way it continued the last time its current suffix occurred.

Per request an index maps every n-gram of the request's tokens (prompt + output), n in [min_window, max_window], to
the position right after its most recent occurrence. Proposal for a sequence of length L: the longest suffix
tokens[L-n:L] (n from max_window down to min_window) that occurred earlier, ending at e < L; propose tokens[e:e+k].
Invariant: the index holds the n-grams ending at positions <= L-1 only (the suffix itself, ending at L, is added when
the next token arrives), so a lookup finds an EARLIER occurrence and e <= L-1 leaves at least one token to propose.
Indexing a new token adds max_window - min_window + 1 entries (hash of a tuple of at most max_window ids each); the
prompt is indexed on the request's first proposal, so a request costs nothing until it decodes under speculation.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from sglang.srt.speculative.proposer import Proposer


class NgramIndex:
    """The index of one token sequence, appended to incrementally."""

    def __init__(self, min_window: int, max_window: int):
        assert 1 <= min_window <= max_window
        self.min_window, self.max_window = min_window, max_window
        self.tokens: List[int] = []
        self.last_end: Dict[Tuple[int, ...], int] = {}  # n-gram -> end (exclusive) of its most recent occurrence

    def extend(self, new_tokens: Sequence[int]) -> None:
        toks, index, lo, hi = self.tokens, self.last_end, self.min_window, self.max_window
        for t in new_tokens:
            toks.append(t)
            end = len(toks) - 1  # n-grams ending here become visible now that a token follows them
            for n in range(lo, min(hi, end) + 1):
                index[tuple(toks[end - n : end])] = end

    def propose(self, max_k: int) -> List[int]:
        toks, L = self.tokens, len(self.tokens)
        if max_k <= 0:
            return []
        for n in range(min(self.max_window, L - 1), self.min_window - 1, -1):
            e = self.last_end.get(tuple(toks[L - n :]))
            if e is not None:
                return toks[e : min(e + max_k, L)]
        return []


class NgramProposer(Proposer):
    def __init__(self, min_window: int, max_window: int):
        self.min_window, self.max_window = min_window, max_window
        self.indexes: Dict[str, NgramIndex] = {}  # by request id

    def _index(self, req) -> NgramIndex:
        idx = self.indexes.get(req.rid)
        if idx is None:
            idx = self.indexes[req.rid] = NgramIndex(self.min_window, self.max_window)
        n_prompt, have = len(req.origin_input_ids), len(idx.tokens)
        if have < n_prompt:
            idx.extend(req.origin_input_ids[have:])
            have = n_prompt
        if have < n_prompt + len(req.output_ids):
            idx.extend(req.output_ids[have - n_prompt :])
        return idx

    def propose(self, reqs, max_k) -> List[List[int]]:
        return [self._index(r).propose(k) if k > 0 else [] for r, k in zip(reqs, max_k)]

    def release(self, req) -> None:
        self.indexes.pop(req.rid, None)

    def tracked(self) -> List[str]:
        return list(self.indexes)
