"""POST /v1/embeddings in OpenAI's shape, served by an --is-embedding server (docs/embeddings.md).

A generative server answers 400 with how to start an embedding server. The response:
    {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [...] | "<base64 float32>"}],
     "model": ..., "usage": {"prompt_tokens": P, "total_tokens": P}}
"""

from __future__ import annotations

from typing import List, Literal, Optional, Union

from fastapi import Request
from fastapi.responses import Response
from pydantic import Field

from sglang.srt.entrypoints.embedding_inputs import (
    build_embedding_requests,
    check_dimensions,
    embedding_items,
    embedding_of,
    encode_vector,
)
from sglang.srt.entrypoints.openai.protocol import OpenAIModel
from sglang.srt.entrypoints.openai.serving_base import OpenAIServingBase, json_response
from sglang.srt.managers.request_kind import check_request_kind


class EmbeddingRequest(OpenAIModel):
    model: Optional[str] = None
    input: Union[str, List[str], List[int], List[List[int]]] = Field(
        ..., description="A string, a list of strings, a list of token ids, or a list of lists of token ids.")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = Field(None, description="Allowed: only the model's hidden size (no truncation).")
    user: Optional[str] = None


class OpenAIServingEmbedding(OpenAIServingBase):
    request_model = EmbeddingRequest
    object_prefix = "embd"

    async def create(self, req: EmbeddingRequest, raw_request: Request) -> Response:
        tm = self.tokenizer_manager
        check_request_kind(True, tm.server_args.is_embedding)  # before any work: a generative server says how
        hidden_size = tm.server_info.get("hidden_size")
        if hidden_size is not None:
            check_dimensions(req.dimensions, hidden_size)
        items = embedding_items(req.input)
        reqs = await tm.offloop.run(build_embedding_requests, items, tm.request_tokenizer)
        vectors: List[Optional[list]] = [None] * len(reqs)
        prompt_tokens = 0
        async for i, out in tm.generate_many(reqs, raw_request):
            if out.finished:
                vectors[i] = embedding_of(out)
                prompt_tokens += out.prompt_tokens
        if hidden_size is None and vectors:
            check_dimensions(req.dimensions, len(vectors[0]))
        data = [{"object": "embedding", "index": i, "embedding": encode_vector(v, req.encoding_format)}
                for i, v in enumerate(vectors)]
        # the request's model echoed, as upstream (it would only pick a LoRA adapter): the served name without one
        return json_response({"object": "list", "data": data, "model": req.model or tm.served_model_name,
                              "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}})
