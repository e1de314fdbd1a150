"""POST /v1/score (upstream SGLang's decoder-only scoring): how likely each label token is to follow query + item.

    {"query": str | [token id], "items": str | [str] | [[token id]], "label_token_ids": [token id],
     "apply_softmax": false, "item_first": false, "model": optional}
 -> {"scores": [[p(label_0), p(label_1), ...] per item], "model", "usage", "object": "scoring"}

Each item is one request whose prompt is query + item (item + query with item_first; text is concatenated before
tokenizing, token ids are concatenated), generating one token with token_ids_logprob = label_token_ids; a score is
exp(logprob) of the label at the position after the prompt, or with apply_softmax the softmax over the labels'
logprobs only.

Cheap for many items: the first item runs alone, so its prompt (the query) enters the radix cache when it finishes;
the other items then run as one batch and each prefills only what follows the cached query (usage.prompt_tokens_details
.cached_tokens shows it). With item_first the items lead and nothing is shared.
"""

from __future__ import annotations

import math
from typing import List, Optional, Union

from fastapi import Request
from fastapi.responses import Response
from pydantic import Field

from sglang.srt.entrypoints.openai.protocol import OpenAIModel
from sglang.srt.entrypoints.openai.serving_base import OpenAIServingBase, json_response
from sglang.srt.managers.io_struct import ReqOutput
from sglang.srt.managers.request_error import RequestError
from sglang.srt.managers.request_logprob_fields import apply_logprob_fields
from sglang.srt.sampling import validation as v
from sglang.srt.sampling.sampling_params import TokenId

MAX_SCORE_ITEMS = 1024


class ScoreRequest(OpenAIModel):
    query: Union[str, List[TokenId]]
    items: Union[str, List[str], List[List[TokenId]]]
    label_token_ids: List[TokenId] = v.TOKEN_IDS_LOGPROB.field(..., min_length=1, max_length=v.MAX_TOKEN_IDS_LOGPROB)
    apply_softmax: bool = v.FLAG.field(False)
    item_first: bool = v.FLAG.field(False)
    model: Optional[str] = None
    rid: Optional[str] = Field(None, max_length=v.MAX_RID_CHARS)

    def unsupported(self):
        items = [self.items] if isinstance(self.items, str) else self.items
        if not items:
            return "items", "items is empty; send at least one item."
        if len(items) > MAX_SCORE_ITEMS:
            return "items", f"items has {len(items)} entries; send at most {MAX_SCORE_ITEMS} per request."
        if isinstance(self.query, str) != isinstance(items[0], str):
            return "items", "query and items must both be text or both be token id lists."
        return None


class OpenAIServingScore(OpenAIServingBase):
    object_prefix = "score"
    request_model = ScoreRequest

    async def create(self, req: ScoreRequest, raw_request: Request) -> Response:
        tm = self.tokenizer_manager
        items = [req.items] if isinstance(req.items, str) else req.items
        tokenized = []
        for i, item in enumerate(items):
            prompt = (item + req.query) if req.item_first else (req.query + item)
            text, ids = (prompt, None) if isinstance(prompt, str) else (None, list(prompt))
            t = await tm.tokenize_request(
                text=text, input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0.0},
                rid=f"{req.rid}-{i}" if req.rid else None, return_logprob=True, prompt_param="query")
            tokenized.append(apply_logprob_fields(t, -1, req.label_token_ids, tm.vocab_size,
                                                  ids_param="label_token_ids"))
        outs: List[Optional[ReqOutput]] = [None] * len(tokenized)
        async for _, out in tm.generate_many(tokenized[:1], raw_request):  # the query enters the cache
            outs[0] = out
        async for i, out in tm.generate_many(tokenized[1:], raw_request):
            outs[1 + i] = out
        if any(o is None for o in outs):
            raise RequestError(499, "Client disconnected.")
        scores = [self.item_scores(o, req) for o in outs]
        return json_response({
            "scores": scores, "model": tm.served_model_name, "object": "scoring",
            "usage": self.usage(sum(o.prompt_tokens for o in outs), 0, sum(o.cached_tokens for o in outs)),
        })

    @staticmethod
    def item_scores(out: ReqOutput, req: ScoreRequest) -> List[float]:
        pairs = dict(out.new_token_ids_logprobs[0])
        lps = [pairs[t] for t in req.label_token_ids]
        if not req.apply_softmax:
            return [math.exp(lp) for lp in lps]
        top = max(lps)
        exps = [math.exp(lp - top) for lp in lps]
        return [e / sum(exps) for e in exps]
