"""Shared plumbing of the OpenAI-compatible handlers: body parsing, model check, SSE, finish reasons, usage.

Every handler is `await handler.handle_request(raw_request)`; client mistakes come back as OpenAI error bodies
(RequestError / pydantic ValidationError -> 400, queue full -> 503). Every `model` name is served.
"""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from typing import Any, AsyncIterator, Iterator, List, Optional, Type

import numpy as np
import orjson
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.responses import StreamingResponse

from sglang.srt.entrypoints.openai.errors import error_response
from sglang.srt.entrypoints.openai.protocol import validate_request_body
from sglang.srt.managers.tokenizer_manager import RequestError, TokenizerManager
from sglang.srt.sampling.validation import MAX_JSON_DEPTH, ParamError

SSE_DONE = b"data: [DONE]\n\n"
MODEL_ALIASES = ("default",)


def is_known_model(tm: TokenizerManager, model: str) -> bool:
    """A name GET /v1/models/{model} answers for. Requests are served whatever their `model`, as upstream's are (there
    the name only selects a LoRA adapter, and this runtime loads none)."""
    return model in {tm.served_model_name, tm.model_path, tm.server_args.model_path, *MODEL_ALIASES}


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def json_response(obj: Any, status_code: int = 200) -> Response:
    return Response(content=orjson.dumps(obj), status_code=status_code, media_type="application/json")


class SSEResponse(StreamingResponse):
    """A text/event-stream response that always closes its body generator.

    When the client disconnects, Starlette cancels the sending task; if that happens while the generator is
    suspended at a `yield`, it would only be closed by the garbage collector. Closing it here runs its `finally`
    at once, which aborts the request in the scheduler and frees its KV memory.
    """

    def __init__(self, content: AsyncIterator[bytes]):
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def stream_response(self, send) -> None:
        try:
            await super().stream_response(send)
        finally:
            await self.body_iterator.aclose()


# a JSON string literal (escapes included), written so that the regex engine runs it without backtracking
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKET_STEP = np.zeros(256, np.int32)  # byte -> +1 for [ {, -1 for ] }
_BRACKET_STEP[list(b"[{")], _BRACKET_STEP[list(b"]}")] = 1, -1


def json_nesting_depth(body: bytes) -> int:
    """How deep the arrays/objects of a JSON text nest, computed on the bytes (nothing recurses); strings are blanked
    out first so brackets inside them do not count."""
    steps = _BRACKET_STEP[np.frombuffer(_JSON_STRING.sub(b'""', body), np.uint8)]
    return int(np.cumsum(steps).max(initial=0))


async def parse_body(raw_request: Request, model_cls: Type[BaseModel]) -> Any:
    body = await raw_request.body()
    if not body.strip():
        raise RequestError(400, "The request body is empty; send a JSON object.")
    # fewer brackets than the limit in all cannot nest deeper than it: skip the scan
    num_open = body.count(b"[") + body.count(b"{")
    depth = json_nesting_depth(body) if num_open > MAX_JSON_DEPTH else 0
    if depth > MAX_JSON_DEPTH:
        raise RequestError(
            400, f"The JSON body nests {depth} levels deep; at most {MAX_JSON_DEPTH} levels of arrays and objects "
            "are accepted. Flatten the request.", param="body")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise RequestError(
            400, f"We could not parse the JSON body of your request ({e}). Send a valid JSON object."
        ) from None
    return validate_request_body(data, model_cls)


def grammar_param_names(req: Any) -> dict:
    """{"json_schema": "response_format"} when the request's json_schema comes from its response_format."""
    rf = getattr(req, "response_format", None)
    return {"json_schema": "response_format"} if rf is not None and rf.constraint_json_schema() is not None else {}


def rename_param(e: RequestError, names: dict) -> None:
    """Name e's field as this API calls it (`names`, e.g. {"json_schema": "response_format"})."""
    api = names.get(e.param)
    if api is not None:
        e.message = e.message.replace(f"Invalid value for {e.param}", f"Invalid value for {api}")
        e.param = api


@contextlib.contextmanager
def api_param_names(names: dict) -> Iterator[None]:
    """A RequestError raised inside (the request's tokenization: its grammar compiled by a backend the arrival
    checks do not run, e.g. llguidance refusing a schema keyword xgrammar accepts) names the API's field."""
    try:
        yield
    except RequestError as e:
        rename_param(e, names)
        raise


async def api_param_errors(gen: AsyncIterator, names: dict) -> AsyncIterator:
    """gen's items, unchanged; a RequestError it raises (a 400 from the scheduler: a grammar found to admit nothing
    after its compile, or a dead end mid-generation) names its field as this API calls it (rename_param), as the
    checks at arrival do. Closing this closes gen (aborting its requests)."""
    try:
        async for item in gen:
            yield item
    except RequestError as e:
        rename_param(e, names)
        raise
    finally:
        await gen.aclose()


def check_sampling_params(params: dict, vocab_size: int, names: Optional[dict] = None, prefix: str = "",
                          grammar_backend: Optional[str] = None) -> None:
    """Validate the sampling params of a request before it is split into choices (seed + n - 1 is checked here) and
    its stop_token_ids against the vocabulary; a failure is a 400 whose param is the API's name of the field
    (`names` maps SamplingParams names to it, e.g. {"min_new_tokens": "min_tokens"}, or `prefix` goes before it).
    With grammar_backend "none" a grammar is refused here, under the API's name of the field that set it."""
    from sglang.srt.constrained.grammar_check import NO_BACKEND, check_request_grammar
    from sglang.srt.sampling.sampling_params import SamplingParams

    try:
        sp = SamplingParams.from_dict(params)
        sp.verify(vocab_size)
        if grammar_backend == NO_BACKEND:
            check_request_grammar(sp.grammar, grammar_backend)
    except ParamError as e:
        names = names or {}
        param = prefix + names.get(e.param, e.param)
        raise RequestError(400, e.render(param) if e.reason else str(e), param=param) from None


def finish_reason_str(finish_reason: Optional[dict]) -> Optional[str]:
    """Upstream's finish_reason dict -> OpenAI's string ("stop", "length", or "abort")."""
    if not finish_reason:
        return None
    return finish_reason.get("type")


def matched_stop(finish_reason: Optional[dict]) -> Any:
    if finish_reason and finish_reason.get("type") == "stop":
        return finish_reason.get("matched")
    return None


def usage_dict(prompt_tokens: int, completion_tokens: int, cached_tokens: Optional[int] = None,
               reasoning_tokens: int = 0) -> dict:
    """OpenAI's usage block, as upstream fills it: prompt_tokens_details is null unless the cache is reported
    (cached_tokens given: --enable-cache-report); reasoning_tokens (tokens of the reasoning part, 0 without a
    --reasoning-parser) both where OpenAI puts it, completion_tokens_details, and where upstream does, top level."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": None if cached_tokens is None else {"cached_tokens": cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "reasoning_tokens": reasoning_tokens,
    }


class OpenAIServingBase:
    object_prefix = "cmpl"
    request_model: Type[BaseModel]

    def __init__(self, tokenizer_manager: TokenizerManager):
        self.tokenizer_manager = tokenizer_manager

    async def handle_request(self, raw_request: Request) -> Response:
        try:
            req = await parse_body(raw_request, self.request_model)
            problem = req.unsupported() if hasattr(req, "unsupported") else None
            if problem is not None:
                raise RequestError(400, problem[1], param=problem[0])
            return await self.create(req, raw_request)
        except RequestError as e:
            return error_response(e.status_code, e.message, e.param, e.code)

    async def create(self, req: Any, raw_request: Request) -> Response:
        raise NotImplementedError

    def usage(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int, reasoning_tokens: int = 0) -> dict:
        report = self.tokenizer_manager.server_args.enable_cache_report
        return usage_dict(prompt_tokens, completion_tokens, cached_tokens if report else None, reasoning_tokens)

    def response_model(self, req: Any) -> str:
        """The `model` a response reports: the request's, as upstream echoes it, else the served name."""
        return getattr(req, "model", None) or self.tokenizer_manager.served_model_name

    def new_id(self) -> str:
        return f"{self.object_prefix}-{uuid.uuid4().hex}"

    @staticmethod
    def created() -> int:
        return int(time.time())

    @staticmethod
    async def first_item(gen: AsyncIterator) -> Any:
        """Wait for a stream's first item before sending headers, so early errors keep their status code."""
        try:
            return await gen.__anext__()
        except StopAsyncIteration:
            return None

    def stream_response(self, gen: AsyncIterator, events: AsyncIterator[bytes]) -> "SSEResponse":
        """SSE response over `events` (which reads `gen`): a RequestError mid-stream becomes an error event, the
        request stream is always closed (aborting the request if the client left), and the stream ends in [DONE]
        (`events` may send it itself, at the end of its last chunk, so that one write carries both)."""

        async def body() -> AsyncIterator[bytes]:
            done = False
            try:
                async for chunk in events:
                    done = chunk.endswith(SSE_DONE)
                    yield chunk
            except RequestError as e:
                done = False
                yield self.stream_error(e)
            finally:
                await gen.aclose()
            if not done:
                yield SSE_DONE

        return SSEResponse(body())

    @staticmethod
    def stream_error(e: RequestError) -> bytes:
        from sglang.srt.entrypoints.openai.errors import error_body

        return sse(error_body(e.status_code, e.message, e.param, e.code))

    def rids(self, base: Optional[str], count: int) -> List[Optional[str]]:
        if base is None:
            return [None] * count
        return [base] if count == 1 else [f"{base}-{i}" for i in range(count)]
