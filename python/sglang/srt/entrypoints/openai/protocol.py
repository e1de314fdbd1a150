"""Request models of the OpenAI-compatible API, validated like OpenAI validates them.

Strict types (a string is not an integer, a bool is not a number), unknown fields rejected (`extra="forbid"`), and
every range declared with the shared rules of srt/sampling/validation.py, so /v1/*, /generate and the Engine state
the same limits in the same words; the field descriptions (in /openapi.json too) say what is allowed. SGLang's
documented extensions (top_k, min_p, repetition_penalty, ignore_eos, ...) are declared fields, which is how the
`openai` client's `extra_body` reaches them.

Responses are built as plain dicts by the serving_* modules (the streaming path runs once per token); their shape
is OpenAI's: ChatCompletion / ChatCompletionChunk / Completion objects and the `usage` block.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Dict, List, Literal, Optional, Union

from pydantic import BeforeValidator, Field, ValidationError, model_validator

from sglang.srt.entrypoints.openai.protocol_content import (  # noqa: F401 (re-exported: the request models' parts)
    AudioURL, AudioURLContentPart, ContentPart, ImageContentPart, ImageURL, InputAudio, InputAudioContentPart,
    OpenAIModel, TextContentPart, VideoContentPart, VideoURL)
from sglang.srt.function_call.tool_types import Tool, ToolChoice
from sglang.srt.managers.request_error import RequestError
from sglang.srt.sampling import validation as v
from sglang.srt.sampling.sampling_params import SamplingParamsModel, StopList, StopStr, TokenId
from sglang.srt.sampling.validation_errors import describe_validation_error

Rid = Annotated[str, v.RID.field(..., pattern=v.RID_PATTERN)]
CacheSalt = Annotated[str, v.CACHE_SALT.field(...)]
# OpenAI documents `stream` as a boolean or null (the default, false); sglang-router sends null when unset
StreamFlag = Annotated[Optional[bool], BeforeValidator(lambda value: False if value is None else value)]


def priority_field() -> Any:
    """Upstream's per-request scheduling priority. Upstream ignores it unless launched with
    --enable-priority-scheduling (abort_on_priority_when_disabled is off by default); this server has no priority
    scheduling, so it is accepted and ignored the same way (sglang-router sends it on every request)."""
    return Field(None, description="Upstream's scheduling priority: accepted and ignored (requests run first come, "
                                   "first served, as upstream's default without --enable-priority-scheduling).")


def check_response_format_schema(schema_text: str) -> None:
    """response_format's schema must be one xgrammar accepts (its parser; the vocabulary compile comes later)."""
    from sglang.srt.constrained.grammar_check import EmptyGrammarError, parse_grammar, xgrammar_message

    try:
        parse_grammar("json_schema", schema_text)
    except EmptyGrammarError as e:
        raise v.ParamError("response_format", f"json_schema.schema: {e}", schema_text,
                           "a JSON schema that at least one JSON value matches") from None
    except (RuntimeError, ValueError, TypeError) as e:
        raise v.ParamError("response_format", f"xgrammar could not compile json_schema.schema: {xgrammar_message(e)}",
                           schema_text, "a JSON schema xgrammar can compile") from None


def upstream_only(value: Any, why: str) -> Any:
    """A field of upstream's request schema this server accepts only at its no-op value (sglang-router, which
    re-serializes every body with upstream's defaults, always sends it); any other value is a 400 saying why."""
    return Field(value, description=f"Allowed: only {str(value).lower()}; {why}")


class StreamOptions(OpenAIModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


RESPONSE_FORMAT_ALLOWED = ('{"type": "text"}, {"type": "json_object"}, or {"type": "json_schema", "json_schema": '
                           '{"name": ..., "schema": {...}, "strict": true}}')
JSON_SCHEMA_FORMAT_KEYS = {"name": str, "description": str, "schema": dict, "strict": bool}
JSON_OBJECT_SCHEMA = '{"type": "object"}'  # response_format json_object: any JSON object (upstream's mapping)


class ResponseFormat(OpenAIModel):
    """OpenAI's structured output, enforced by the grammar backend as a json_schema constraint (srt/constrained/)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[Dict[str, Any]] = None

    @model_validator(mode="after")
    def _shape(self) -> "ResponseFormat":
        js = self.json_schema
        if self.type != "json_schema":
            if js is not None:
                raise v.ParamError("json_schema", f"Only type 'json_schema' takes json_schema (type is {self.type!r})",
                                   js, RESPONSE_FORMAT_ALLOWED)
            return self
        if js is None or not isinstance(js.get("name"), str) or not js["name"]:
            raise v.ParamError("json_schema", "type 'json_schema' needs json_schema with a non-empty name", js,
                               RESPONSE_FORMAT_ALLOWED)
        for key, value in js.items():
            kind = JSON_SCHEMA_FORMAT_KEYS.get(key)
            if kind is None or not isinstance(value, kind):
                raise v.ParamError(f"json_schema.{key}", "Unknown key or wrong type" if kind is None else
                                   f"Input should be a {kind.__name__}", value, RESPONSE_FORMAT_ALLOWED)
        return self

    def constraint_json_schema(self) -> Optional[str]:
        """The JSON schema (a JSON string) the output must match, or None for plain text."""
        if self.type == "text":
            return None
        if self.type == "json_object" or self.json_schema.get("schema") is None:
            return JSON_OBJECT_SCHEMA
        return json.dumps(self.json_schema["schema"])


class SamplingFields(OpenAIModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: Optional[str] = None
    frequency_penalty: float = v.PENALTY.field(0.0)
    presence_penalty: float = v.PENALTY.field(0.0)
    logit_bias: Optional[Dict[str, float]] = v.LOGIT_BIAS.field(None)
    response_format: Optional[ResponseFormat] = None
    n: int = v.N.field(1)
    seed: Optional[int] = v.SEED.field(None)
    stop: Optional[Union[StopStr, StopList]] = v.STOP.field(None)
    stream: StreamFlag = v.FLAG.field(False)
    priority: Optional[int] = priority_field()
    stream_options: Optional[StreamOptions] = None
    temperature: Optional[float] = v.TEMPERATURE.field(None)
    top_p: Optional[float] = v.TOP_P.field(None)
    user: Optional[str] = None
    # SGLang extensions (sent through the openai client's extra_body)
    top_k: int = v.TOP_K.field(-1, json_schema_extra={"not": {"const": 0}})
    min_p: float = v.MIN_P.field(0.0)
    repetition_penalty: float = v.REPETITION_PENALTY.field(1.0)
    min_tokens: int = v.NEW_TOKENS.field(0)
    ignore_eos: bool = v.FLAG.field(False)
    skip_special_tokens: bool = v.FLAG.field(True)
    spaces_between_special_tokens: bool = v.FLAG.field(True)
    stop_token_ids: Optional[List[TokenId]] = v.STOP_TOKEN_IDS.field(None, max_length=v.MAX_STOP_TOKEN_IDS)
    no_stop_trim: bool = v.FLAG.field(False)
    stop_regex: Optional[Union[StopStr, StopList]] = v.STOP_REGEX.field(None)
    cache_salt: Optional[str] = v.CACHE_SALT.field(None)
    rid: Optional[Rid] = Field(None, description=v.RID.description)
    json_schema: Optional[str] = v.GRAMMAR.field(None)  # structured output, SGLang's names (one at most)
    regex: Optional[str] = v.GRAMMAR.field(None)
    ebnf: Optional[str] = v.GRAMMAR.field(None)
    return_hidden_states: Literal[False] = upstream_only(False, "this server does not return hidden states.")
    # upstream's client-sent logit processor and its per-request parameters (--enable-custom-logit-processor)
    custom_logit_processor: Optional[str] = None
    custom_params: Optional[Dict[str, Any]] = None

    # the output-length field and its name, per API
    @property
    def max_tokens_param(self) -> str:
        return "max_tokens"

    @property
    def max_output_tokens(self) -> Optional[int]:
        return getattr(self, "max_tokens", None)

    @model_validator(mode="after")
    def _across_fields(self):
        v.check_top_k(self.top_k)
        v.check_min_max(self.min_tokens, self.max_output_tokens, "min_tokens", self.max_tokens_param)
        v.check_seed_with_n(self.seed, self.n)
        v.check_logit_bias(self.logit_bias)
        v.check_one_grammar({name: getattr(self, name) for name in v.GRAMMAR_FIELDS})
        rf_schema = self.response_format.constraint_json_schema() if self.response_format is not None else None
        if rf_schema is not None:
            given = [name for name in v.GRAMMAR_FIELDS if getattr(self, name) is not None]
            if given:
                raise v.ParamError(given[0], "response_format already constrains the output", getattr(self, given[0]),
                                   "at most one of response_format (json_object / json_schema), json_schema, regex, "
                                   "ebnf")
            check_response_format_schema(rf_schema)
        return self

    def constraint(self) -> Dict[str, str]:
        """The grammar sampling param this request sets: {"json_schema" | "regex" | "ebnf": text}, or {}."""
        rf_schema = self.response_format.constraint_json_schema() if self.response_format is not None else None
        if rf_schema is not None:
            return {"json_schema": rf_schema}
        return {name: getattr(self, name) for name in v.GRAMMAR_FIELDS if getattr(self, name) is not None}

    def sampling_params(self, max_new_tokens: Optional[int]) -> dict:
        """The SamplingParams dict of choice `index` 0; serving code offsets the seed per choice."""
        params = {
            "max_new_tokens": max_new_tokens,
            "min_new_tokens": self.min_tokens,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
            "stop": self.stop,
            "stop_token_ids": self.stop_token_ids,
            "stop_regex": self.stop_regex,
            "ignore_eos": self.ignore_eos,
            "skip_special_tokens": self.skip_special_tokens,
            "spaces_between_special_tokens": self.spaces_between_special_tokens,
            "no_stop_trim": self.no_stop_trim,
            "seed": self.seed,
            "logit_bias": self.logit_bias,
            **self.constraint(),
        }
        if self.temperature is not None:
            params["temperature"] = self.temperature
        if self.top_p is not None:
            params["top_p"] = self.top_p
        if self.custom_params is not None:
            params["custom_params"] = self.custom_params
        return params

    def unsupported(self) -> Optional[tuple[str, str]]:
        """(param, message) for a valid-looking request this server cannot honour, else None."""
        return None


# ---------------------------------------------------------------------- completions
class CompletionRequest(SamplingFields):
    prompt: Union[str, List[str], List[TokenId], List[List[TokenId]]]
    best_of: Optional[int] = v.N.field(None)
    echo: bool = v.FLAG.field(False)
    logprobs: Optional[int] = v.COMPLETION_LOGPROBS.field(None)
    max_tokens: Optional[int] = v.NEW_TOKENS.field(16)
    suffix: Optional[str] = None
    prompt_logprobs: Optional[int] = v.PROMPT_LOGPROBS.field(None)  # vLLM's extension

    def unsupported(self):
        if self.suffix:
            return "suffix", "suffix (fill-in-the-middle) is not supported by this model; remove it."
        if self.best_of is not None and self.best_of != self.n:
            return "best_of", "best_of must equal n (or be omitted); server-side best-of selection is not supported."
        return super().unsupported()


# ---------------------------------------------------------------------- chat


class ChatMessage(OpenAIModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, List[ContentPart]]] = None
    name: Optional[str] = None
    tool_calls: Optional[List[Dict[str, Any]]] = None
    tool_call_id: Optional[str] = None
    reasoning_content: Optional[str] = None  # an earlier reply's thoughts, sent back by some clients

    def text(self, image_placeholder: Optional[str] = None, video_placeholder: Optional[str] = None,
             audio_placeholder: Optional[str] = None) -> str:
        """The text parts joined; image / video / audio parts become the model's placeholder text for them."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        holders = {"image_url": image_placeholder or "", "video_url": video_placeholder or "",
                   "audio_url": audio_placeholder or "", "input_audio": audio_placeholder or ""}
        return "".join(p.text if isinstance(p, TextContentPart) else holders[p.type] for p in self.content)

    def image_urls(self) -> List[str]:
        if not isinstance(self.content, list):
            return []
        return [p.image_url.url for p in self.content if isinstance(p, ImageContentPart)]

    def video_urls(self) -> List[str]:
        if not isinstance(self.content, list):
            return []
        return [p.video_url.url for p in self.content if isinstance(p, VideoContentPart)]

    def audios(self) -> List[Any]:
        """audio_url parts as their URL, input_audio parts as {"data", "format"} (multimodal/audio_loader.py)."""
        if not isinstance(self.content, list):
            return []
        return [p.audio_url.url if isinstance(p, AudioURLContentPart) else p.input_audio.model_dump()
                for p in self.content if isinstance(p, (AudioURLContentPart, InputAudioContentPart))]


class ChatCompletionRequest(SamplingFields):
    messages: List[ChatMessage] = Field(min_length=1)
    logprobs: bool = v.FLAG.field(False)
    top_logprobs: Optional[int] = v.TOP_LOGPROBS.field(None)
    prompt_logprobs: Optional[int] = v.PROMPT_LOGPROBS.field(None)  # vLLM's extension
    max_tokens: Optional[int] = v.CHAT_MAX_TOKENS.field(None)
    max_completion_tokens: Optional[int] = v.CHAT_MAX_TOKENS.field(None)
    tools: Optional[List[Tool]] = None
    tool_choice: Optional[ToolChoice] = None
    parallel_tool_calls: Optional[bool] = None
    store: Optional[bool] = None
    metadata: Optional[Dict[str, str]] = None
    service_tier: Optional[str] = None
    # SGLang extensions
    continue_final_message: bool = False
    chat_template_kwargs: Optional[Dict[str, Any]] = None
    # upstream's reasoning switches (serving_chat.py): with --reasoning-parser, separate_reasoning moves the reasoning
    # to reasoning_content and stream_reasoning streams it; without a parser they change nothing (as upstream)
    separate_reasoning: bool = True
    stream_reasoning: bool = True

    @property
    def max_output_tokens(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def max_tokens_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    def unsupported(self):
        if self.top_logprobs and not self.logprobs:
            return "top_logprobs", "top_logprobs requires logprobs to be true."
        if self.prompt_logprobs is not None and self.stream:
            return "prompt_logprobs", "prompt_logprobs is returned on a non-streamed chat completion; set stream to false."
        return super().unsupported()


# ---------------------------------------------------------------------- tokenizer endpoints
class TokenizeRequest(OpenAIModel):
    model: Optional[str] = None
    prompt: Union[str, List[str]]
    add_special_tokens: bool = True


class DetokenizeRequest(OpenAIModel):
    model: Optional[str] = None
    tokens: Union[List[TokenId], List[List[TokenId]]]


# ---------------------------------------------------------------------- native /generate
class GenerateRequest(OpenAIModel):
    """Body of the native POST /generate (upstream's GenerateReqInput, the fields this runtime serves).

    A batch (a list of text or input_ids) may carry one sampling_params / rid per prompt, or one for all."""

    text: Optional[Union[str, List[str]]] = None
    input_ids: Optional[Union[List[TokenId], List[List[TokenId]]]] = None
    sampling_params: Optional[Union[SamplingParamsModel, List[SamplingParamsModel]]] = None
    rid: Optional[Union[Rid, List[Rid]]] = Field(None, description=v.RID.description)
    stream: StreamFlag = v.FLAG.field(False)
    priority: Optional[int] = priority_field()
    return_logprob: bool = v.FLAG.field(False)
    top_logprobs_num: int = v.TOP_LOGPROBS.field(0)
    logprob_start_len: int = v.LOGPROB_START_LEN.field(-1)
    token_ids_logprob: Optional[List[TokenId]] = v.TOKEN_IDS_LOGPROB.field(None, max_length=v.MAX_TOKEN_IDS_LOGPROB)
    image_data: Optional[Any] = None
    video_data: Optional[Any] = None
    audio_data: Optional[Any] = None
    model: Optional[str] = None
    require_reasoning: bool = Field(False, description=(
        "Upstream's: with --reasoning-parser, the grammar (json_schema / regex / ebnf) applies only once the "
        "reasoning has ended. Without a parser or a grammar it changes nothing, as upstream; with both it is refused "
        "(400): this server applies a grammar from the first token."))
    # upstream's client-sent logit processor (one, or one per prompt); sampling_params.custom_params: its parameters
    custom_logit_processor: Optional[Union[str, List[Optional[str]]]] = None
    # upstream fields sglang-router always sends (see upstream_only)
    return_text_in_logprobs: bool = v.FLAG.field(False)  # logprob triples carry the token's text, not None
    cache_salt: Optional[Union[CacheSalt, List[CacheSalt]]] = Field(None, description=v.CACHE_SALT.description)
    log_metrics: Literal[True] = upstream_only(True, "every request is counted in the metrics.")
    return_hidden_states: Literal[False] = upstream_only(False, "this server does not return hidden states.")
    background: Literal[False] = upstream_only(False, "requests run in the foreground.")
    no_logs: Literal[False] = upstream_only(False, "request logging is set by --log-requests.")
    return_bytes: Literal[False] = upstream_only(False, "outputs are text.")
    return_entropy: Literal[False] = upstream_only(False, "this server does not return entropies.")


class AbortRequest(OpenAIModel):
    rid: str = Field("", max_length=v.MAX_RID_CHARS, description="The request to abort ('' with abort_all).")
    abort_all: bool = v.FLAG.field(False)


def validate_request_body(data: Any, model_cls: type) -> Any:
    """A parsed JSON body as `model_cls`, or RequestError(400) naming the field (the HTTP routes and the Engine's
    request builder both come through here, so their messages are the same)."""
    if not isinstance(data, dict):
        raise RequestError(400, f"The request body must be a JSON object, got {type(data).__name__}.")
    try:
        return model_cls.model_validate(data)
    except ValidationError as e:
        message, param = describe_validation_error(e, model_cls)
        raise RequestError(400, message, param=param) from None
