"""POST /v1/tokenize and /v1/detokenize with the served model's tokenizer."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from sglang.srt.entrypoints.openai.protocol import DetokenizeRequest, TokenizeRequest
from sglang.srt.entrypoints.openai.serving_base import OpenAIServingBase, json_response


class OpenAIServingTokenize(OpenAIServingBase):
    request_model = TokenizeRequest

    async def create(self, req: TokenizeRequest, raw_request: Request) -> Response:
        tm = self.tokenizer_manager
        if isinstance(req.prompt, str):
            tokens = await tm.encode(req.prompt, add_special_tokens=req.add_special_tokens)
            count = len(tokens)
        else:
            tokens = [await tm.encode(p, add_special_tokens=req.add_special_tokens) for p in req.prompt]
            count = [len(t) for t in tokens]
        return json_response({"tokens": tokens, "count": count, "max_model_len": tm.context_len})


class OpenAIServingDetokenize(OpenAIServingBase):
    request_model = DetokenizeRequest

    async def create(self, req: DetokenizeRequest, raw_request: Request) -> Response:
        tm = self.tokenizer_manager
        if req.tokens and isinstance(req.tokens[0], list):
            return json_response({"text": [await tm.decode(t) for t in req.tokens]})
        return json_response({"text": await tm.decode(req.tokens)})
