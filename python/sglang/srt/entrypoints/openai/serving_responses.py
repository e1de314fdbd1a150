"""POST /v1/responses: OpenAI's Responses API, stateless (as `store: false`), served by the chat machinery.

The request becomes a chat completion request (protocol_responses.to_chat_request), which OpenAIServingChat runs as
ever (chat template, sampling parameters, tool plan and grammar, tokenization); this class only replaces how the
reply is written: a `response` object whose `output` holds reasoning / message / function_call items
(response_items.OutputItems), or, streamed, OpenAI's named SSE events, each with a sequence_number:

    response.created, response.in_progress,
    per item: response.output_item.added, [response.content_part.added, response.output_text.delta...,
              response.output_text.done, response.content_part.done | response.function_call_arguments.delta...,
              response.function_call_arguments.done], response.output_item.done,
    response.completed (or response.incomplete when max_output_tokens cut the reply, response.failed on an abort)

A stream ends after its last event (no [DONE], as OpenAI's); an error after the first event is an `error` event.
"""

from __future__ import annotations

import itertools
import re
from typing import AsyncIterator, Optional

import orjson
from fastapi import Request
from fastapi.responses import Response

from sglang.srt.entrypoints.openai.protocol_responses import ResponsesChatRequest, ResponsesRequest, to_chat_request
from sglang.srt.entrypoints.openai.response_items import OutputItems
from sglang.srt.entrypoints.openai.serving_base import SSEResponse, json_response
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.function_call.tool_plan import ToolPlan
from sglang.srt.managers.tokenizer_manager import RequestError

# the chat request's field names in errors -> the Responses request's
_PARAM_NAMES = [
    (re.compile(r"^tools\[(\d+)\]\.function\.(.+)$"), r"tools[\1].\2"),
    (re.compile(r"^tool_choice\.function\.name$"), "tool_choice.name"),
    (re.compile(r"^(max_tokens|max_completion_tokens)$"), "max_output_tokens"),
    (re.compile(r"^(response_format|json_schema)(\..*)?$"), "text.format"),
    (re.compile(r"^messages(\[.*)?$"), "input"),
]


def responses_param(param: Optional[str]) -> Optional[str]:
    for pattern, name in _PARAM_NAMES:
        if param is not None and pattern.match(param):
            return pattern.sub(name, param)
    return param


def final_status(finish_reason: Optional[dict]) -> tuple[str, Optional[dict], Optional[dict]]:
    """(status, incomplete_details, error) of a finished reply."""
    kind = (finish_reason or {}).get("type")
    if kind == "length":
        return "incomplete", {"reason": "max_output_tokens"}, None
    if kind == "abort":
        message = (finish_reason or {}).get("message") or "The request was aborted."
        return "failed", None, {"code": "server_error", "message": message}
    return "completed", None, None


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int) -> dict:
    return {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": cached_tokens},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + output_tokens}


class OpenAIServingResponses(OpenAIServingChat):
    object_prefix = "resp"
    request_model = ResponsesRequest

    async def create(self, req: ResponsesRequest, raw_request: Request) -> Response:
        try:
            return await super().create(to_chat_request(req), raw_request)
        except RequestError as e:
            raise RequestError(e.status_code, e.message, responses_param(e.param), e.code) from None

    def response_object(self, req: ResponsesChatRequest, resp_id: str, created_at: int, status: str, output: list,
                        usage_: Optional[dict] = None, incomplete: Optional[dict] = None,
                        error: Optional[dict] = None) -> dict:
        r: ResponsesRequest = req._responses
        fmt = r.text.format if r.text is not None and r.text.format is not None else None
        choice = r.tool_choice.model_dump() if hasattr(r.tool_choice, "model_dump") else (r.tool_choice or "auto")
        return {
            "id": resp_id,
            "object": "response",
            "created_at": created_at,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": incomplete,
            "instructions": r.instructions,
            "max_output_tokens": r.max_output_tokens,
            "max_tool_calls": None,
            "model": self.tokenizer_manager.served_model_name,
            "output": output,
            "parallel_tool_calls": r.parallel_tool_calls is not False,
            "previous_response_id": None,
            "reasoning": None,
            "store": False,
            "temperature": r.temperature,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
            "tool_choice": choice,
            "tools": [t.model_dump(exclude_none=True) for t in r.tools or ()],
            "top_p": r.top_p,
            "truncation": "disabled",
            "usage": usage_,
            "user": r.user,
            "metadata": r.metadata or {},
        }

    async def complete(self, req: ResponsesChatRequest, gen, prompt_tokens: int, plan: ToolPlan) -> Response:
        out = None
        async for _, out in gen:
            pass
        if out is None:
            raise RequestError(499, "Client disconnected.")
        items = OutputItems()
        items.feed(self.output_parser(req, plan).feed(out.new_text, True))
        status, incomplete, error = final_status(out.finish_reason)
        items.close("incomplete" if status == "incomplete" else "completed")
        return json_response(self.response_object(
            req, self.new_id(), self.created(), status, items.output,
            usage(prompt_tokens, out.completion_tokens, out.cached_tokens), incomplete, error))

    async def stream(self, req: ResponsesChatRequest, gen: AsyncIterator, prompt_tokens: int,
                     plan: ToolPlan) -> Response:
        try:
            first = await self.first_item(gen)
        except RequestError:
            await gen.aclose()
            raise
        resp_id, created_at = self.new_id(), self.created()
        sequence = itertools.count()

        def event(ev: dict) -> bytes:
            ev["sequence_number"] = next(sequence)
            return b"event: " + ev["type"].encode() + b"\ndata: " + orjson.dumps(ev) + b"\n\n"

        async def body() -> AsyncIterator[bytes]:
            try:
                shell = self.response_object(req, resp_id, created_at, "in_progress", [])
                yield event({"type": "response.created", "response": shell}) + event(
                    {"type": "response.in_progress", "response": shell})
                parser, items = self.output_parser(req, plan), OutputItems()
                item, last, events = first, None, []
                while item is not None:
                    _, out = item
                    last = out
                    events = items.feed(parser.feed(out.new_text, out.finished))
                    if out.finished:
                        break
                    if events:
                        yield b"".join(event(e) for e in events)
                    events = []
                    item = await self.first_item(gen)
                if last is None or not last.finished:
                    status, incomplete = "failed", None
                    error = {"code": "server_error", "message": "The reply ended before its finish."}
                else:
                    status, incomplete, error = final_status(last.finish_reason)
                events += items.close("incomplete" if status == "incomplete" else "completed")
                done = self.response_object(
                    req, resp_id, created_at, status, items.output,
                    usage(prompt_tokens, last.completion_tokens if last else 0, last.cached_tokens if last else 0),
                    incomplete, error)
                final = {"completed": "response.completed", "incomplete": "response.incomplete"}
                events.append({"type": final.get(status, "response.failed"), "response": done})
                yield b"".join(event(e) for e in events)
            except RequestError as e:
                yield event({"type": "error", "code": str(e.code or e.status_code), "message": e.message,
                             "param": responses_param(e.param)})
            finally:
                await gen.aclose()

        return SSEResponse(body())
