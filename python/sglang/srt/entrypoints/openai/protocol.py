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

from typing import Annotated, Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sglang.srt.managers.request_error import RequestError
from sglang.srt.sampling import validation as v
from sglang.srt.sampling.sampling_params import SamplingParamsModel, StopList, StopStr, TokenId
from sglang.srt.sampling.validation_errors import describe_validation_error

Rid = Annotated[str, v.RID.field(..., pattern=v.RID_PATTERN)]


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(OpenAIModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class ResponseFormat(OpenAIModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[Dict[str, Any]] = None


class SamplingFields(OpenAIModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: Optional[str] = None
    frequency_penalty: float = v.PENALTY.field(0.0)
    presence_penalty: float = v.PENALTY.field(0.0)
    logit_bias: Optional[Dict[str, float]] = None
    n: int = v.N.field(1)
    seed: Optional[int] = v.SEED.field(None)
    stop: Optional[Union[StopStr, StopList]] = v.STOP.field(None)
    stream: bool = v.FLAG.field(False)
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
    rid: Optional[Rid] = Field(None, description=v.RID.description)

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
        return self

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
            "ignore_eos": self.ignore_eos,
            "skip_special_tokens": self.skip_special_tokens,
            "spaces_between_special_tokens": self.spaces_between_special_tokens,
            "no_stop_trim": self.no_stop_trim,
            "seed": self.seed,
        }
        if self.temperature is not None:
            params["temperature"] = self.temperature
        if self.top_p is not None:
            params["top_p"] = self.top_p
        return params

    def unsupported(self) -> Optional[tuple[str, str]]:
        """(param, message) for a valid-looking request this server cannot honour, else None."""
        if self.logit_bias:
            return "logit_bias", "logit_bias is not supported by this server; remove it."
        return None


# ---------------------------------------------------------------------- completions
class CompletionRequest(SamplingFields):
    prompt: Union[str, List[str], List[TokenId], List[List[TokenId]]]
    best_of: Optional[int] = v.N.field(None)
    echo: bool = v.FLAG.field(False)
    logprobs: Optional[int] = v.COMPLETION_LOGPROBS.field(None)
    max_tokens: Optional[int] = v.NEW_TOKENS.field(16)
    suffix: Optional[str] = None

    def unsupported(self):
        if self.suffix:
            return "suffix", "suffix (fill-in-the-middle) is not supported by this model; remove it."
        if self.best_of is not None and self.best_of != self.n:
            return "best_of", "best_of must equal n (or be omitted); server-side best-of selection is not supported."
        return super().unsupported()


# ---------------------------------------------------------------------- chat
class TextContentPart(OpenAIModel):
    type: Literal["text"]
    text: str


class ImageURL(OpenAIModel):
    url: str
    detail: Optional[Literal["auto", "low", "high"]] = "auto"


class ImageContentPart(OpenAIModel):
    type: Literal["image_url"]
    image_url: ImageURL


ContentPart = Annotated[Union[TextContentPart, ImageContentPart], Field(discriminator="type")]


class ChatMessage(OpenAIModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, List[ContentPart]]] = None
    name: Optional[str] = None
    tool_calls: Optional[List[Dict[str, Any]]] = None
    tool_call_id: Optional[str] = None

    def text(self, image_placeholder: Optional[str] = None) -> str:
        """The text parts joined; image parts become image_placeholder (a multimodal model's image token)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(p.text if isinstance(p, TextContentPart) else (image_placeholder or "") for p in self.content)

    def image_urls(self) -> List[str]:
        if not isinstance(self.content, list):
            return []
        return [p.image_url.url for p in self.content if isinstance(p, ImageContentPart)]


class ChatCompletionRequest(SamplingFields):
    messages: List[ChatMessage] = Field(min_length=1)
    logprobs: bool = v.FLAG.field(False)
    top_logprobs: Optional[int] = v.TOP_LOGPROBS.field(None)
    max_tokens: Optional[int] = v.CHAT_MAX_TOKENS.field(None)
    max_completion_tokens: Optional[int] = v.CHAT_MAX_TOKENS.field(None)
    response_format: Optional[ResponseFormat] = None
    tools: Optional[List[Dict[str, Any]]] = None
    tool_choice: Optional[Union[str, Dict[str, Any]]] = None
    parallel_tool_calls: Optional[bool] = None
    store: Optional[bool] = None
    metadata: Optional[Dict[str, str]] = None
    service_tier: Optional[str] = None
    # SGLang extensions
    continue_final_message: bool = False
    chat_template_kwargs: Optional[Dict[str, Any]] = None

    @property
    def max_output_tokens(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def max_tokens_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    def unsupported(self):
        if self.top_logprobs and not self.logprobs:
            return "top_logprobs", "top_logprobs requires logprobs to be true."
        if self.response_format is not None and self.response_format.type != "text":
            return "response_format", (
                f"response_format type {self.response_format.type!r} (constrained decoding) is not supported "
                "by this server; use 'text' or omit it."
            )
        if self.tool_choice not in (None, "none", "auto"):
            return "tool_choice", "Only tool_choice 'none' or 'auto' is supported by this server."
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
    stream: bool = v.FLAG.field(False)
    return_logprob: bool = v.FLAG.field(False)
    top_logprobs_num: int = v.TOP_LOGPROBS.field(0)
    image_data: Optional[Any] = None
    model: Optional[str] = None


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
