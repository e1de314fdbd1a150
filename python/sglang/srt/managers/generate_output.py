"""GenerateAccumulator: the ReqOutput deltas of one request -> the native generate API's response object, the same
for `Engine.generate` and POST /generate (upstream's shape):

    {"text": str, "output_ids": [int],
     "meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency",
                   ["output_token_logprobs": [[logprob, token_id, None], ...],        one per output token
                    "output_top_logprobs": [[[logprob, token_id, None], ...], ...]]}}  top-k per output token

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
        self.last: Optional[ReqOutput] = None

    def add(self, out: ReqOutput) -> None:
        self.text += out.new_text
        self.output_ids.extend(out.new_token_ids)
        if self.return_logprob and out.new_token_logprobs is not None:
            self.token_logprobs.extend([lp, tid, None] for lp, tid in zip(out.new_token_logprobs, out.new_token_ids))
            if out.new_top_logprobs is not None:
                self.top_logprobs.extend([[lp, tid, None] for tid, lp in pairs] for pairs in out.new_top_logprobs)
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
        return {"text": self.text, "output_ids": list(self.output_ids), "meta_info": meta}
