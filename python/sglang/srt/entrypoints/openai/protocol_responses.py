"""The request body of POST /v1/responses (OpenAI's Responses API), validated like the chat API, and its translation
into a chat completion request.

The Responses API is served by the chat machinery (serving_responses.py): `to_chat_request` turns `instructions` and
`input` into chat messages, the Responses-shaped `tools` / `tool_choice` / `text.format` into chat's `tools` /
`tool_choice` / `response_format`, and `max_output_tokens` into the output-length limit; the chat template, sampling
parameters, grammar backend and tool-call parsers then run exactly as for /v1/chat/completions.

    input item                                        chat message
    "text" (input as a string)                        {"role": "user", "content": "text"}
    {"role", "content": str | [input_text, ...]}      {"role", "content"} (input_image parts become image parts)
    {"type": "message", "role": "assistant", ...}     {"role": "assistant", "content": the output_text parts joined}
    {"type": "function_call", call_id, name, ...}     tool_calls of an assistant message (consecutive calls share one)
    {"type": "function_call_output", call_id, ...}    {"role": "tool", "tool_call_id": call_id, "content": output}
    {"type": "reasoning", "content": [...]}           reasoning_content of the assistant message that follows

Stateless only: this server stores no responses. `store: true` (OpenAI's default, which sglang-router writes when the
client leaves it out) is answered as a server without storage answers it, as upstream's does: the reply says
`"store": false`, and GET /v1/responses/{id} is a 404 saying why. `previous_response_id`, `conversation` and
`background: true`, which need a stored response, are 400s naming the field (send the whole conversation as `input`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Dict, List, Literal, Optional, Union

from pydantic import Discriminator, Field, PrivateAttr, Tag, model_validator

from sglang.srt.entrypoints.openai.protocol import (ChatCompletionRequest, OpenAIModel, Rid, StreamFlag, priority_field,
                                                   validate_request_body)
from sglang.srt.function_call.tool_types import FUNCTION_NAME_PATTERN
from sglang.srt.sampling import validation as v
from sglang.srt.sampling.sampling_params import StopList, StopStr, TokenId

ROLES = Literal["user", "assistant", "system", "developer"]
ITEM_STATUS = Optional[Literal["in_progress", "completed", "incomplete"]]


# ---------------------------------------------------------------------- content parts
class InputText(OpenAIModel):
    type: Literal["input_text"]
    text: str


class InputImage(OpenAIModel):
    type: Literal["input_image"]
    image_url: str = Field(description="A data URL, base64, or an allowed URL / local file (file_id is not served).")
    detail: Optional[Literal["auto", "low", "high"]] = "auto"


class OutputText(OpenAIModel):
    """An earlier reply's text, sent back in an assistant message."""

    type: Literal["output_text"]
    text: str
    annotations: List[Dict[str, Any]] = []
    logprobs: Optional[List[Dict[str, Any]]] = None


class Refusal(OpenAIModel):
    type: Literal["refusal"]
    refusal: str


ContentPart = Annotated[Union[InputText, InputImage, OutputText, Refusal], Field(discriminator="type")]


# ---------------------------------------------------------------------- input items
class InputMessage(OpenAIModel):
    type: Literal["message"] = "message"
    role: ROLES
    content: Union[str, List[ContentPart]]
    id: Optional[str] = None
    status: ITEM_STATUS = None
    phase: Optional[Literal["commentary", "final_answer"]] = None


class FunctionCallItem(OpenAIModel):
    """A call the model made earlier (an output item sent back)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: Optional[str] = None
    status: ITEM_STATUS = None


class FunctionCallOutputItem(OpenAIModel):
    """The result of running a call, for the model to read."""

    type: Literal["function_call_output"]
    call_id: str
    output: Union[str, List[InputText]]
    id: Optional[str] = None
    status: ITEM_STATUS = None


class ReasoningText(OpenAIModel):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(OpenAIModel):
    type: Literal["reasoning"]
    id: Optional[str] = None
    summary: List[ReasoningText] = []
    content: Optional[List[ReasoningText]] = None
    encrypted_content: Optional[str] = None  # OpenAI's own thoughts, opaque: accepted, not read
    status: ITEM_STATUS = None


def _item_type(item: Any) -> str:
    return item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", "message")


InputItem = Annotated[
    Union[
        Annotated[InputMessage, Tag("message")],
        Annotated[FunctionCallItem, Tag("function_call")],
        Annotated[FunctionCallOutputItem, Tag("function_call_output")],
        Annotated[ReasoningItem, Tag("reasoning")],
    ],
    Discriminator(_item_type),  # a message may leave out its type
]


# ---------------------------------------------------------------------- tools, tool_choice, text.format
class FunctionTool(OpenAIModel):
    type: Literal["function"] = Field(description="Allowed: 'function' (this server runs no built-in tools).")
    name: str = Field(pattern=FUNCTION_NAME_PATTERN,
                      description="The function's name: 1 to 64 letters, digits, underscores or dashes.")
    description: Optional[str] = None
    parameters: Optional[Dict[str, Any]] = None
    strict: Optional[bool] = None


class FunctionChoice(OpenAIModel):
    type: Literal["function"]
    name: str


class TextFormatText(OpenAIModel):
    type: Literal["text"]


class TextFormatJSONObject(OpenAIModel):
    type: Literal["json_object"]


class TextFormatJSONSchema(OpenAIModel):
    type: Literal["json_schema"]
    name: str = Field(min_length=1)
    schema_: Dict[str, Any] = Field(alias="schema")
    description: Optional[str] = None
    strict: Optional[bool] = None


class TextConfig(OpenAIModel):
    format: Optional[Annotated[Union[TextFormatText, TextFormatJSONObject, TextFormatJSONSchema],
                               Field(discriminator="type")]] = None
    verbosity: Optional[Literal["low", "medium", "high"]] = None


class ResponsesStreamOptions(OpenAIModel):
    include_obfuscation: bool = False


# ---------------------------------------------------------------------- the request
class ResponsesRequest(OpenAIModel):
    model: Optional[str] = None
    input: Union[str, List[InputItem]]
    instructions: Optional[str] = None
    max_output_tokens: Optional[int] = v.CHAT_MAX_TOKENS.field(None)
    temperature: Optional[float] = v.TEMPERATURE.field(None)
    top_p: Optional[float] = v.TOP_P.field(None)
    tools: Optional[List[FunctionTool]] = None
    tool_choice: Optional[Union[Literal["none", "auto", "required"], FunctionChoice]] = None
    parallel_tool_calls: Optional[bool] = None
    text: Optional[TextConfig] = None
    stream: StreamFlag = v.FLAG.field(False)
    priority: Optional[int] = priority_field()
    stream_options: Optional[ResponsesStreamOptions] = None
    # accepted, no effect here
    metadata: Optional[Dict[str, str]] = None
    user: Optional[str] = None
    safety_identifier: Optional[str] = None
    prompt_cache_key: Optional[str] = None
    service_tier: Optional[str] = None
    truncation: Optional[Literal["disabled"]] = Field(
        None, description="Allowed: 'disabled'; a too-long input is a 400, never truncated.")
    store: Optional[bool] = None  # true is answered "store": false: nothing is stored here
    # refused unless at their no-op value (unsupported() says why)
    previous_response_id: Optional[str] = None
    conversation: Optional[Any] = None
    background: Optional[bool] = None
    include: Optional[List[str]] = None
    reasoning: Optional[Dict[str, Any]] = None
    top_logprobs: Optional[int] = None
    max_tool_calls: Optional[int] = None
    prompt: Optional[Any] = None
    # SGLang extensions (the openai client's extra_body), as on /v1/chat/completions
    seed: Optional[int] = v.SEED.field(None)
    top_k: int = v.TOP_K.field(-1, json_schema_extra={"not": {"const": 0}})
    min_p: float = v.MIN_P.field(0.0)
    repetition_penalty: float = v.REPETITION_PENALTY.field(1.0)
    frequency_penalty: float = v.PENALTY.field(0.0)
    presence_penalty: float = v.PENALTY.field(0.0)
    stop: Optional[Union[StopStr, StopList]] = v.STOP.field(None)
    stop_token_ids: Optional[List[TokenId]] = v.STOP_TOKEN_IDS.field(None, max_length=v.MAX_STOP_TOKEN_IDS)
    ignore_eos: bool = v.FLAG.field(False)
    chat_template_kwargs: Optional[Dict[str, Any]] = None
    rid: Optional[Rid] = Field(None, description=v.RID.description)
    regex: Optional[str] = v.GRAMMAR.field(None)  # SGLang's output constraints besides text.format
    ebnf: Optional[str] = v.GRAMMAR.field(None)

    @model_validator(mode="after")
    def _across_fields(self) -> "ResponsesRequest":
        v.check_top_k(self.top_k)
        schema = self.format_json_schema()
        if schema is not None:
            from sglang.srt.constrained.grammar_check import grammar_refusal, parse_grammar

            try:
                parse_grammar("json_schema", schema)
            except (RuntimeError, ValueError, TypeError) as e:
                raise v.ParamError("text.format.schema", grammar_refusal(e), self.text.format.schema_,
                                   "a JSON schema xgrammar can compile, that at least one JSON value matches") from None
        return self

    def format_json_schema(self) -> Optional[str]:
        fmt = self.text.format if self.text is not None else None
        if fmt is None or fmt.type == "text":
            return None
        return '{"type": "object"}' if fmt.type == "json_object" else json.dumps(fmt.schema_)

    def unsupported(self) -> Optional[tuple[str, str]]:
        stateless = "this server keeps no responses (stateless, as store: false); send the whole conversation as "
        if self.previous_response_id is not None:
            return "previous_response_id", stateless + "`input` (earlier output items included) instead."
        if self.conversation is not None:
            return "conversation", stateless + "`input` instead."
        if self.background:
            return "background", "background responses need storage, which this server does not keep; omit it."
        if self.include:
            return "include", f"include {self.include} is not supported here; omit include."
        if self.reasoning and any(value is not None for value in self.reasoning.values()):
            return "reasoning", ("reasoning settings are not supported: thinking is set by the model's chat template "
                                 "(chat_template_kwargs, e.g. {\"enable_thinking\": false}); omit reasoning.")
        if self.top_logprobs:
            return "top_logprobs", "top_logprobs is not supported on /v1/responses (use /v1/chat/completions)."
        if self.max_tool_calls is not None:
            return "max_tool_calls", "max_tool_calls is not supported; omit it."
        if self.prompt is not None:
            return "prompt", "stored prompt templates are not supported; send instructions and input."
        forced = self.tool_choice == "required" or isinstance(self.tool_choice, FunctionChoice)
        if forced and self.format_json_schema() is not None:
            return "text.format", ("tool_choice 'required' or a named function is enforced with a grammar, and "
                                   "text.format already constrains the output; use one or the other.")
        return None


# ---------------------------------------------------------------------- -> chat
class ResponsesChatRequest(ChatCompletionRequest):
    """The chat request a Responses request becomes; carries the original for the response object."""

    _responses: Any = PrivateAttr(default=None)

    @property
    def max_tokens_param(self) -> str:
        return "max_output_tokens"


def _part_text(part: Any) -> str:
    return part.refusal if isinstance(part, Refusal) else part.text


def _content(msg: InputMessage, where: str) -> Union[str, List[dict]]:
    """A message's content in chat's shape: a string, or text / image_url parts."""
    if isinstance(msg.content, str):
        return msg.content
    if not any(isinstance(p, InputImage) for p in msg.content):
        return "".join(_part_text(p) for p in msg.content)
    if msg.role != "user":
        raise v.ParamError(f"{where}.content", "only user messages may carry input_image parts", "input_image",
                           "text parts (input_text / output_text) in system, developer and assistant messages")
    return [{"type": "image_url", "image_url": {"url": p.image_url, "detail": p.detail}} if isinstance(p, InputImage)
            else {"type": "text", "text": _part_text(p)} for p in msg.content]


def chat_messages(instructions: Optional[str], items: Union[str, List[Any]]) -> List[dict]:
    """instructions + input -> chat messages (see the module's table). ParamError names the input item."""
    messages: List[dict] = []
    if instructions is not None:
        messages.append({"role": "system", "content": instructions})
    if isinstance(items, str):
        return messages + [{"role": "user", "content": items}]
    reasoning: List[str] = []  # thoughts waiting for the assistant message they belong to
    previous = None  # the previous item's type (consecutive calls and an assistant message share one message)
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if isinstance(item, ReasoningItem):
            reasoning.extend(part.text for part in item.content or item.summary)
        elif isinstance(item, InputMessage):
            msg = {"role": item.role, "content": _content(item, where)}
            if item.role == "assistant" and reasoning:
                msg["reasoning_content"], reasoning = "".join(reasoning), []
            messages.append(msg)
        elif isinstance(item, FunctionCallItem):
            function = {"name": item.name, "arguments": item.arguments}
            call = {"id": item.call_id, "type": "function", "function": function}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and previous in ("message", "function_call"):
                last.setdefault("tool_calls", []).append(call)
                if not last["content"]:
                    last["content"] = None
            else:
                msg = {"role": "assistant", "content": None, "tool_calls": [call]}
                if reasoning:
                    msg["reasoning_content"], reasoning = "".join(reasoning), []
                messages.append(msg)
        else:  # FunctionCallOutputItem
            output = item.output if isinstance(item.output, str) else "".join(p.text for p in item.output)
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
        previous = item.type
    if not messages:
        raise v.ParamError("input", "no messages to answer", items, "a string, or a list of at least one input item")
    return messages


def to_chat_request(req: ResponsesRequest) -> ResponsesChatRequest:
    """The chat completion request that serves `req` (validated like any chat request)."""
    from sglang.srt.managers.request_error import RequestError

    try:
        messages = chat_messages(req.instructions, req.input)
    except v.ParamError as e:
        raise RequestError(400, e.render(e.param) if e.reason else str(e), param=e.param) from None
    body: Dict[str, Any] = {"messages": messages, "stream": req.stream}
    for name in ("temperature", "top_p", "seed", "stop", "stop_token_ids", "parallel_tool_calls",
                 "chat_template_kwargs", "rid", "user", "regex", "ebnf"):
        if getattr(req, name) is not None:
            body[name] = getattr(req, name)
    for name in ("top_k", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty", "ignore_eos"):
        body[name] = getattr(req, name)
    if req.max_output_tokens is not None:
        body["max_tokens"] = req.max_output_tokens
    if req.tools:
        body["tools"] = [{"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})}
                         for t in req.tools]
    if isinstance(req.tool_choice, FunctionChoice):
        body["tool_choice"] = {"type": "function", "function": {"name": req.tool_choice.name}}
    elif req.tool_choice is not None:
        body["tool_choice"] = req.tool_choice
    fmt = req.text.format if req.text is not None else None
    if isinstance(fmt, TextFormatJSONSchema):
        js = {"name": fmt.name, "schema": fmt.schema_, "description": fmt.description, "strict": fmt.strict}
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {k: val for k, val in js.items() if val is not None}}
    elif isinstance(fmt, TextFormatJSONObject):
        body["response_format"] = {"type": "json_object"}
    chat = validate_request_body(body, ResponsesChatRequest)
    chat._responses = req
    return chat
