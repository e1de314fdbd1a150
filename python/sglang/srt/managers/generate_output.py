"""GenerateAccumulator: the ReqOutput deltas of one request -> the native generate API's response object, the same
for `Engine.generate` and POST /generate (upstream's shape):

    {"text": str, "output_ids": [int],
     "meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency",
                   ["output_token_logprobs": [[logprob, token_id, None], ...],        one per output token
                    "output_top_logprobs": [[[logprob, token_id, None], ...], ...],   top-k per output token
                    "output_token_ids_logprobs": [...],       token_ids_logprob's ids per output token
                    "input_token_logprobs": [[logprob|None, token_id, None], ...],   per prompt position from
                                                              logprob_start_len (position 0: None); [] without it
                    "input_top_logprobs", "input_token_ids_logprobs": per prompt position as above (None at 0)]}}

text and output_ids are cumulative; the None in each logprob entry is upstream's token text slot (not filled).
e2e_latency is seconds from `start_time` (a time.perf_counter() value) to the latest output.
"""

from __future__ import annotations

import time
from typing import List, Optional

from sglang.srt.managers.io_struct import ReqOutput


class GenerateAccumulator:
    def __init__(self, rid: str, return_logprob: bool, start_time: float):
        self.rid = rid
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
            self.token_logprobs.extend([lp, tid, None] for lp, tid in zip(out.new_token_logprobs, out.new_token_ids))
            if out.new_top_logprobs is not None:
                self.top_logprobs.extend([[lp, tid, None] for tid, lp in pairs] for pairs in out.new_top_logprobs)
            if out.new_token_ids_logprobs is not None:
                self.ids_logprobs.extend(_triples(pairs) for pairs in out.new_token_ids_logprobs)
        if self.return_logprob and out.input_token_logprobs is not None:
            self.input = {
                "input_token_logprobs": [[lp, tid, None] for lp, tid, _ in out.input_token_logprobs],
                "input_top_logprobs": [_triples(p) for p in out.input_top_logprobs or []],
                "input_token_ids_logprobs": [_triples(p) for p in out.input_token_ids_logprobs or []],
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
        if self.return_logprob:
            meta["output_token_logprobs"] = list(self.token_logprobs)
            meta["output_top_logprobs"] = list(self.top_logprobs)
            meta["output_token_ids_logprobs"] = list(self.ids_logprobs)
            meta.update({"input_token_logprobs": [], "input_top_logprobs": [], "input_token_ids_logprobs": []})
            meta.update(self.input)
        return {"text": self.text, "output_ids": list(self.output_ids), "meta_info": meta}


def _triples(pairs) -> Optional[list]:
    """[(token_id, logprob)] -> upstream's [[logprob, token_id, None]] (None stays None: prompt position 0)."""
    return None if pairs is None else [[lp, tid, None] for tid, lp in pairs]
