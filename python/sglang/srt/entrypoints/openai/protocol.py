"""Request models of the OpenAI-compatible API, validated like OpenAI validates them.

Strict types (a string is not an integer, a bool is not a number), ranges checked here, and unknown top-level
fields rejected (`extra="forbid"`). SGLang's documented extensions (top_k, min_p, repetition_penalty, ignore_eos,
...) are declared fields, which is how the `openai` client's `extra_body` reaches them.

Responses are built as plain dicts by the serving_* modules (the streaming path runs once per token); their shape
is OpenAI's: ChatCompletion / ChatCompletionChunk / Completion objects and the `usage` block.
"""

from __future__ import annotations

from typing import Annotated, Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

# OpenAI's own limits
MAX_COMPLETION_LOGPROBS = 5
MAX_CHAT_TOP_LOGPROBS = 20
MAX_N = 128
MAX_STOP_SEQUENCES = 4


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(OpenAIModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class ResponseFormat(OpenAIModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[Dict[str, Any]] = None


StopType = Optional[Union[str, Annotated[List[str], Field(max_length=MAX_STOP_SEQUENCES)]]]


class SamplingFields(OpenAIModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: Optional[str] = None
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: Optional[Dict[str, float]] = None
    n: int = Field(1, ge=1, le=MAX_N)
    seed: Optional[int] = None
    stop: StopType = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    temperature: Optional[float] = Field(None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    user: Optional[str] = None
    # SGLang extensions (sent through the openai client's extra_body)
    top_k: int = Field(-1, ge=-1)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=2.0)
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    stop_token_ids: Optional[List[Annotated[int, Field(ge=0)]]] = None
    no_stop_trim: bool = False
    rid: Optional[str] = None

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
    prompt: Union[str, List[str], List[int], List[List[int]]]
    best_of: Optional[int] = Field(None, ge=1, le=MAX_N)
    echo: bool = False
    logprobs: Optional[int] = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    max_tokens: Optional[int] = Field(16, ge=0)
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
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_CHAT_TOP_LOGPROBS)
    max_tokens: Optional[int] = Field(None, ge=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
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
    tokens: Union[List[int], List[List[int]]]


# ---------------------------------------------------------------------- native /generate
class GenerateRequest(BaseModel):
    """Body of the native POST /generate (upstream's GenerateReqInput, the fields this runtime serves)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: Optional[Union[str, List[str]]] = None
    input_ids: Optional[Union[List[int], List[List[int]]]] = None
    sampling_params: Optional[Union[Dict[str, Any], List[Dict[str, Any]]]] = None
    rid: Optional[Union[str, List[str]]] = None
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = Field(0, ge=0, le=MAX_CHAT_TOP_LOGPROBS)
    image_data: Optional[Any] = None
    model: Optional[str] = None


class AbortRequest(OpenAIModel):
    rid: str = ""
    abort_all: bool = False
