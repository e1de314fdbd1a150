"""Native POST /generate (upstream's shape): text or input_ids, one or a batch, sampling_params, optional SSE.

    single:  {"text": str, "output_ids": [int], "meta_info": {...}}
    batch:   a list of those, one per prompt x n (sampling_params["n"])
    stream:  SSE events of the same objects with cumulative text/output_ids (plus "index" in a batch),
             ending in "data: [DONE]"
"""

from __future__ import annotations

import time
from typing import AsyncIterator, List, Optional

from fastapi import Request
from fastapi.responses import Response

from sglang.srt.entrypoints.openai.protocol import GenerateRequest
from sglang.srt.entrypoints.openai.serving_base import (
    OpenAIServingBase,
    choice_sampling_params,
    json_response,
    sse,
)
from sglang.srt.managers.io_struct import ReqOutput
from sglang.srt.managers.tokenizer_manager import RequestError


class GenerateAccumulator:
    """Turns the deltas of one request into upstream's cumulative response object."""

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
            meta["output_token_logprobs"] = self.token_logprobs
            meta["output_top_logprobs"] = self.top_logprobs
        return {"text": self.text, "output_ids": self.output_ids, "meta_info": meta}


def _as_list(value, count: int, name: str) -> list:
    if isinstance(value, list):
        if len(value) != count:
            raise RequestError(400, f"{name} has {len(value)} entries but there are {count} prompts.", param=name)
        return value
    return [value] * count


class ServingGenerate(OpenAIServingBase):
    request_model = GenerateRequest

    async def create(self, req: GenerateRequest, raw_request: Request) -> Response:
        tm = self.tokenizer_manager
        if (req.text is None) == (req.input_ids is None):
            raise RequestError(400, "Send exactly one of text or input_ids.", param="text")
        if req.text is not None:
            is_batch = isinstance(req.text, list)
            prompts = [{"text": t} for t in (req.text if is_batch else [req.text])]
        else:
            is_batch = bool(req.input_ids) and isinstance(req.input_ids[0], list)
            prompts = [{"input_ids": ids} for ids in (req.input_ids if is_batch else [req.input_ids])]
        if is_batch and not prompts:
            raise RequestError(400, "The batch is empty.", param="text")
        params = _as_list(req.sampling_params, len(prompts), "sampling_params")
        rids = _as_list(req.rid, len(prompts), "rid") if isinstance(req.rid, list) else None

        tokenized = []
        for p, prompt in enumerate(prompts):
            sp = dict(params[p] or {})
            n = sp.pop("n", 1)
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 128:
                raise RequestError(400, f"n must be an integer in [1, 128], got {n!r}.", param="sampling_params")
            ids = prompt.get("input_ids")
            for i in range(n):
                rid = rids[p] if rids is not None else (req.rid if not is_batch and n == 1 else None)
                if rid is not None and n > 1:
                    rid = f"{rid}-{i}"
                t = tm.tokenize_request(
                    text=prompt.get("text"),
                    input_ids=ids,
                    sampling_params=choice_sampling_params(sp, i),
                    rid=rid,
                    stream=req.stream,
                    return_logprob=req.return_logprob,
                    top_logprobs_num=req.top_logprobs_num,
                    image_data=req.image_data[p] if is_batch and isinstance(req.image_data, list) else req.image_data,
                    prompt_param="text" if req.text is not None else "input_ids",
                    max_tokens_param="max_new_tokens",
                )
                ids = t.input_ids if t.mm_inputs is None else prompt.get("input_ids")  # images: process again
                tokenized.append(t)
        is_batch = is_batch or len(tokenized) > 1
        start = time.perf_counter()
        accs = [GenerateAccumulator(t.rid, req.return_logprob, start) for t in tokenized]
        gen = tm.generate_many(tokenized, raw_request)
        if req.stream:
            return await self.stream(gen, accs, is_batch)
        async for i, out in gen:
            accs[i].add(out)
        if any(a.last is None for a in accs):
            raise RequestError(499, "Client disconnected.")
        results = [a.response() for a in accs]
        return json_response(results if is_batch else results[0])

    async def stream(self, gen: AsyncIterator, accs: List[GenerateAccumulator], is_batch: bool) -> Response:
        try:
            first = await self.first_item(gen)
        except RequestError:
            await gen.aclose()
            raise

        async def events() -> AsyncIterator[bytes]:
            item = first
            while item is not None:
                i, out = item
                accs[i].add(out)
                obj = accs[i].response()
                if is_batch:
                    obj["index"] = i
                yield sse(obj)
                item = await self.first_item(gen)

        return self.stream_response(gen, events())
