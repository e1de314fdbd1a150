"""Native POST /generate (upstream's shape): text or input_ids, one or a batch, sampling_params, optional SSE.

    single:  {"text": str, "output_ids": [int], "meta_info": {...}}
    batch:   a list of those, one per prompt x n (sampling_params["n"])
    stream:  SSE events of the same objects with cumulative text/output_ids (plus "index" in a batch),
             ending in "data: [DONE]"
"""

from __future__ import annotations

import time
from typing import AsyncIterator, List

from fastapi import Request
from fastapi.responses import Response

from sglang.srt.entrypoints.generate_builder import build_generate_requests
from sglang.srt.entrypoints.openai.protocol import GenerateRequest
from sglang.srt.entrypoints.openai.serving_base import OpenAIServingBase, json_response, sse
from sglang.srt.managers.generate_output import GenerateAccumulator
from sglang.srt.managers.tokenizer_manager import RequestError
from sglang.srt.sampling import validation as v


def check_require_reasoning(req: GenerateRequest, reasoning_parser) -> None:
    """require_reasoning is upstream's switch to hold a grammar off until the reasoning ends: a no-op without a
    --reasoning-parser or without a grammar (as upstream), refused where it would change the output."""
    params = req.sampling_params if isinstance(req.sampling_params, list) else [req.sampling_params]
    grammars = [name for p in params if p is not None for name in v.GRAMMAR_FIELDS if getattr(p, name) is not None]
    if reasoning_parser and grammars:
        raise RequestError(400, f"require_reasoning holds sampling_params.{grammars[0]} off until the reasoning "
                           "ends, which this server does not do (its grammars apply from the first token); drop "
                           f"require_reasoning or the {grammars[0]} constraint.", param="require_reasoning")


class ServingGenerate(OpenAIServingBase):
    request_model = GenerateRequest

    async def create(self, req: GenerateRequest, raw_request: Request) -> Response:
        tm = self.tokenizer_manager
        if req.require_reasoning:
            check_require_reasoning(req, tm.server_args.reasoning_parser)
        # the Engine's builder, on a pool thread (tokenizing and image preprocessing block)
        batch = await tm.offloop.run(build_generate_requests, req, tm.request_tokenizer)
        start = time.perf_counter()
        spec = tm.server_args.speculative_algorithm is not None
        accs = [GenerateAccumulator(t.rid, req.return_logprob, start, batch.token_text, spec) for t in batch.reqs]
        gen = tm.generate_many(batch.reqs, raw_request)
        if req.stream:
            return await self.stream(gen, accs, batch.is_batch)
        async for i, out in gen:
            accs[i].add(out)
        if any(a.last is None for a in accs):
            raise RequestError(499, "Client disconnected.")
        results = [a.response() for a in accs]
        return json_response(results if batch.is_batch else results[0])

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
