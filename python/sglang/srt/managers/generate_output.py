"""GenerateAccumulator: the ReqOutput deltas of one request -> the native generate API's response object, the same
for `Engine.generate` and POST /generate (upstream's shape):

    {"text": str, "output_ids": [int],
     "meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency",
                   ["output_token_logprobs": [[logprob, token_id, None], ...],        one per output token
                    "output_top_logprobs": [[[logprob, token_id, None], ...], ...],   top-k per output token
                    "output_token_ids_logprobs": [...],       token_ids_logprob's ids per output token
                    "input_token_logprobs": [[logprob|None, token_id, None], ...],   per prompt position from
                                                              logprob_start_len (position 0: None); [] without it
                    "input_top_logprobs", "input_token_ids_logprobs": per prompt position as above (None at 0)],
                   ["spec_verify_ct", "spec_accept_length"]}}                 with --speculative-algorithm

text and output_ids are cumulative. The third element of each logprob entry is upstream's token text slot: None, or
with return_text_in_logprobs the token's text alone (`token_text(id)`: the tokenizer's decode of [id], as upstream).
e2e_latency is seconds from `start_time` (a time.perf_counter() value) to the latest output.
spec_verify_ct (upstream's name): the speculative verify steps in which the request had proposals; its decode steps
without proposals (the adaptive policy paused it, no free slot) are not counted. spec_accept_length: the tokens it
committed in those steps / spec_verify_ct (accepted proposals + the model's own token; 0 when it never proposed).
"""

from __future__ import annotations

import time
from typing import Callable, List, Optional

from sglang.srt.managers.io_struct import ReqOutput


class GenerateAccumulator:
    def __init__(self, rid: str, return_logprob: bool, start_time: float,
                 token_text: Optional[Callable[[int], str]] = None, speculative: bool = False):
        self.rid = rid
        self.speculative = speculative  # the server runs --speculative-algorithm: meta_info has its spec_* fields
        self.token_text = token_text  # set: return_text_in_logprobs
        self.return_logprob = return_logprob
        self.start_time = start_time
        self.text = ""
        self.output_ids: List[int] = []
        self.token_logprobs: list = []
        self.top_logprobs: list = []
        self.ids_logprobs: list = []
        self.input: dict = {}
        self.last: Optional[ReqOutput] = None

    def add(self, out: ReqOutput) -> None:
        self.text += out.new_text
        self.output_ids.extend(out.new_token_ids)
        if self.return_logprob and out.new_token_logprobs is not None:
            self.token_logprobs.extend(self._entry(lp, tid) for lp, tid in zip(out.new_token_logprobs, out.new_token_ids))
            if out.new_top_logprobs is not None:
                self.top_logprobs.extend(self._triples(pairs) for pairs in out.new_top_logprobs)
            if out.new_token_ids_logprobs is not None:
                self.ids_logprobs.extend(self._triples(pairs) for pairs in out.new_token_ids_logprobs)
        if self.return_logprob and out.input_token_logprobs is not None:
            self.input = {
                "input_token_logprobs": [self._entry(lp, tid) for lp, tid, _ in out.input_token_logprobs],
                "input_top_logprobs": [self._triples(p) for p in out.input_top_logprobs or []],
                "input_token_ids_logprobs": [self._triples(p) for p in out.input_token_ids_logprobs or []],
            }
        self.last = out

    @property
    def finished(self) -> bool:
        return self.last is not None and self.last.finished

    def response(self) -> dict:
        out = self.last
        meta = {
            "id": self.rid,
            "finish_reason": out.finish_reason if out.finished else None,
            "prompt_tokens": out.prompt_tokens,
            "completion_tokens": out.completion_tokens,
            "cached_tokens": out.cached_tokens,
            "e2e_latency": time.perf_counter() - self.start_time,
        }
        if self.speculative:
            meta["spec_verify_ct"] = out.spec_verify_ct
            meta["spec_accept_length"] = out.spec_verify_tokens / out.spec_verify_ct if out.spec_verify_ct else 0.0
        if self.return_logprob:
            meta["output_token_logprobs"] = list(self.token_logprobs)
            meta["output_top_logprobs"] = list(self.top_logprobs)
            meta["output_token_ids_logprobs"] = list(self.ids_logprobs)
            meta.update({"input_token_logprobs": [], "input_top_logprobs": [], "input_token_ids_logprobs": []})
            meta.update(self.input)
        return {"text": self.text, "output_ids": list(self.output_ids), "meta_info": meta}

    def _entry(self, logprob: Optional[float], token_id: int) -> list:
        """Upstream's [logprob, token_id, text-or-None]."""
        return [logprob, token_id, self.token_text(token_id) if self.token_text is not None else None]

    def _triples(self, pairs) -> Optional[list]:
        """[(token_id, logprob)] -> [[logprob, token_id, text-or-None]] (None stays None: prompt position 0)."""
        return None if pairs is None else [self._entry(lp, tid) for tid, lp in pairs]
