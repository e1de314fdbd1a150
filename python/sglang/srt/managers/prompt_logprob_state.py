"""A request's prompt logprobs (upstream's logprob_start_len): which rows of each extend chunk score its prompt, what
was collected, and how far its prefix-cache match may reach.

Prompt positions [start, len(prompt)) are returned; position p is scored by hidden row p - 1, so position 0 has no
logprob (None, as OpenAI's legacy echo did). Rows are collected in order, chunk by chunk (chunked prefill), and a
position is collected once: a retracted request prefills again but scores only the positions it has not collected.

Prefix cache: a cached prefix's hidden states are not kept, so the rows a request still needs must be computed. The
match is cut at row `next_pos - 1` (the request skips the cache from there, as upstream does from
logprob_start_len); the part before `start` is still served from the cache. A request that needs no more rows
matches as usual.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from sglang.srt.layers.prompt_logprobs import PromptLogprobSpec, RowLogprobs


# the ReqOutput fields `output()` fills, in its order
PROMPT_LOGPROB_FIELDS = ("input_token_logprobs", "input_top_logprobs", "input_token_ids_logprobs")


class PromptLogprobState:
    def __init__(self, prompt_ids: List[int], start: int, top_k: int, token_ids: Optional[List[int]]):
        assert 0 <= start < len(prompt_ids), (start, len(prompt_ids))
        self.prompt_ids = prompt_ids
        self.start = start
        self.top_k = top_k
        self.token_ids = list(token_ids) if token_ids else None
        # per position from start: the token's logprob (None for position 0), its top-k and token_ids pairs
        self.token_logprobs: List[Optional[float]] = []
        self.top: List[Optional[List[Tuple[int, float]]]] = []
        self.by_id: List[Optional[List[Tuple[int, float]]]] = []
        self.ranks: List[Optional[int]] = []
        self.sent = False
        if start == 0:
            self._add(None, None, None)

    def _add(self, lp: Optional[float], top, by_id, rank: Optional[int] = None) -> None:
        self.ranks.append(rank)
        self.token_logprobs.append(lp)
        self.top.append(top)
        self.by_id.append(by_id)

    @property
    def next_pos(self) -> int:
        """The first prompt position not collected yet (len(prompt) once complete)."""
        return self.start + len(self.token_logprobs)

    @property
    def complete(self) -> bool:
        return self.next_pos >= len(self.prompt_ids)

    def prefix_limit(self) -> Optional[int]:
        """How many leading tokens a prefix-cache match may cover (None: no limit)."""
        return None if self.complete else self.next_pos - 1

    def positions_in(self, kv_len: int, n: int) -> range:
        """Positions scored by the rows [kv_len, kv_len + n) of an extend chunk, in order."""
        lo = max(self.next_pos, kv_len + 1)
        hi = min(len(self.prompt_ids), kv_len + n + 1)
        if lo < hi and lo != self.next_pos:
            raise AssertionError(f"prompt logprobs: chunk starts at row {kv_len}, but position {self.next_pos} "
                                 f"is not collected (its prefix was served from the cache)")
        return range(lo, hi)

    def record(self, results: List[RowLogprobs]) -> None:
        for lp, top, by_id, rank in results:
            self._add(lp, top, by_id, rank)

    def output(self) -> Tuple[list, Optional[list], Optional[list]]:
        """(per position (logprob|None, token_id, rank|None), top-k pairs per position or None, token_ids pairs per
        position or None)."""
        ids = self.prompt_ids[self.start:]
        return (list(zip(self.token_logprobs, ids, self.ranks)), list(self.top) if self.top_k else None,
                list(self.by_id) if self.token_ids else None)


def attach(req, logprob_start_len: int, token_ids_logprob: Optional[List[int]]) -> None:
    """Give a new request its prompt-logprob state (the edge checked the fields: request_logprob_fields.py)."""
    if token_ids_logprob:
        req.token_ids_logprob = list(token_ids_logprob)
    if req.return_logprob and logprob_start_len >= 0:
        req.prompt_logprobs = PromptLogprobState(req.origin_input_ids, logprob_start_len, req.top_logprobs_num,
                                                 token_ids_logprob)


def take_output(req) -> Optional[Tuple[list, Optional[list], Optional[list]]]:
    """The prompt logprobs, once, when they are complete (with the request's first output after its prefill)."""
    st = req.prompt_logprobs
    if st is None or st.sent or not st.complete:
        return None
    st.sent = True
    return st.output()


def build_spec(units) -> Tuple[List[int], Optional[PromptLogprobSpec], List[Tuple[object, int]]]:
    """For an extend batch [(req, n)]: the hidden rows to score (batch-row indices), their spec, and per request
    with rows (req, count) in row order. ([], None, []) when no request asks."""
    rows: List[int] = []
    spec = PromptLogprobSpec([], [], [])
    owners: List[Tuple[object, int]] = []
    offset = 0
    for req, n in units:
        st = getattr(req, "prompt_logprobs", None)
        if st is not None:
            positions = st.positions_in(req.kv_len, n)
            if len(positions):
                rows.extend(offset + (p - 1 - req.kv_len) for p in positions)
                spec.targets.extend(st.prompt_ids[p] for p in positions)
                spec.top_k.extend([st.top_k] * len(positions))
                spec.token_ids.extend([st.token_ids] * len(positions))
                owners.append((req, len(positions)))
        offset += n
    return (rows, spec, owners) if rows else ([], None, [])


def record_results(owners, results: List[RowLogprobs]) -> None:
    """Hand each request its rows' results (after a forward that succeeded)."""
    start = 0
    for req, count in owners:
        req.prompt_logprobs.record(results[start:start + count])
        start += count
