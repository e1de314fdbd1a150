"""Per-request sampling parameters, validated at the API boundary by the rules of validation.py.

SamplingParamsModel is the pydantic form of SamplingParams: /generate declares its `sampling_params` with it (so
/openapi.json documents them) and from_dict / verify validate with it, so the Engine, /generate and the OpenAI
routes report a bad value in the same words. Errors are ParamError (a ValueError) naming the parameter, the bad
value and the allowed range; the HTTP layer turns them into 400 responses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Dict, List, Optional, Tuple, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sglang.srt.sampling import validation as v
from sglang.srt.sampling.validation import ParamError, check_logit_bias, check_token_ids_in_vocab
from sglang.srt.sampling.validation_errors import describe_validation_error

_GREEDY_EPS = 1e-6
TOP_K_ALL = -1  # upstream spelling of "no top-k cut"


@dataclass
class SamplingParams:
    max_new_tokens: Optional[int] = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = TOP_K_ALL
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None
    stop_regex: Optional[Union[str, List[str]]] = None  # upstream's: stop where the output text matches a regex
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    seed: Optional[int] = None
    n: int = 1
    # structured output: at most one grammar (srt/constrained/); logit_bias: "token id" -> bias added to its logit
    json_schema: Optional[str] = None
    regex: Optional[str] = None
    ebnf: Optional[str] = None
    logit_bias: Optional[Dict[str, float]] = None
    # per-request parameters of the request's custom_logit_processor (custom_logit_processor.py), upstream's name
    custom_params: Optional[Dict[str, Any]] = None
    # normalised forms, filled by normalize()
    stop_strs: List[str] = field(default_factory=list)
    stop_regex_strs: List[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> "SamplingParams":
        """Validate a dict of sampling parameters (the rules of validation.py); raises ParamError (a ValueError)."""
        model = validate_sampling_params({} if d is None else d)
        sp = cls(**model.model_dump(exclude_unset=True))
        sp.normalize()
        return sp

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def grammar(self) -> Optional[Tuple[str, str]]:
        """(kind, text) of the request's constraint -- kind is json_schema, regex or ebnf -- or None."""
        for kind in v.GRAMMAR_FIELDS:
            if getattr(self, kind) is not None:
                return kind, getattr(self, kind)
        return None

    def verify(self, vocab_size: Optional[int] = None) -> None:
        """Check every field again (values may have been set after from_dict), and token ids against the vocabulary."""
        validate_sampling_params(self.to_dict())
        if vocab_size is not None and self.stop_token_ids:
            check_token_ids_in_vocab(self.stop_token_ids, vocab_size, "stop_token_ids")
        check_logit_bias(self.logit_bias, vocab_size)

    def normalize(self) -> None:
        if self.stop is None:
            self.stop_strs = []
        elif isinstance(self.stop, str):
            self.stop_strs = [self.stop]
        else:
            self.stop_strs = list(self.stop)
        self.stop_regex_strs = [self.stop_regex] if isinstance(self.stop_regex, str) else list(self.stop_regex or [])
        if self.temperature < _GREEDY_EPS:
            # greedy: make the sampler's fast path obvious
            self.top_k = 1

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d.pop("stop_strs", None)
        d.pop("stop_regex_strs", None)
        return d


_DEFAULTS = SamplingParams()
StopStr = Annotated[str, v.STOP_STR_FIELD]
StopList = Annotated[List[StopStr], Field(max_length=v.MAX_STOP_SEQUENCES)]
TokenId = Annotated[int, v.TOKEN_ID_FIELD]


class SamplingParamsModel(BaseModel):
    """SamplingParams as a strict pydantic model: the schema of /generate's sampling_params."""

    model_config = ConfigDict(extra="forbid", strict=True, title="SamplingParams")

    max_new_tokens: Optional[int] = v.NEW_TOKENS.field(_DEFAULTS.max_new_tokens)
    min_new_tokens: int = v.NEW_TOKENS.field(_DEFAULTS.min_new_tokens)
    temperature: float = v.TEMPERATURE.field(_DEFAULTS.temperature)
    top_p: float = v.TOP_P.field(_DEFAULTS.top_p)
    top_k: int = v.TOP_K.field(_DEFAULTS.top_k, json_schema_extra={"not": {"const": 0}})
    min_p: float = v.MIN_P.field(_DEFAULTS.min_p)
    frequency_penalty: float = v.PENALTY.field(_DEFAULTS.frequency_penalty)
    presence_penalty: float = v.PENALTY.field(_DEFAULTS.presence_penalty)
    repetition_penalty: float = v.REPETITION_PENALTY.field(_DEFAULTS.repetition_penalty)
    stop: Optional[Union[StopStr, StopList]] = v.STOP.field(_DEFAULTS.stop)
    stop_token_ids: Optional[List[TokenId]] = v.STOP_TOKEN_IDS.field(
        _DEFAULTS.stop_token_ids, max_length=v.MAX_STOP_TOKEN_IDS)
    stop_regex: Optional[Union[StopStr, StopList]] = v.STOP_REGEX.field(_DEFAULTS.stop_regex)
    ignore_eos: bool = v.FLAG.field(_DEFAULTS.ignore_eos)
    skip_special_tokens: bool = v.FLAG.field(_DEFAULTS.skip_special_tokens)
    spaces_between_special_tokens: bool = v.FLAG.field(_DEFAULTS.spaces_between_special_tokens)
    no_stop_trim: bool = v.FLAG.field(_DEFAULTS.no_stop_trim)
    seed: Optional[int] = v.SEED.field(_DEFAULTS.seed)
    n: int = v.N.field(_DEFAULTS.n)
    json_schema: Optional[str] = v.GRAMMAR.field(_DEFAULTS.json_schema)
    regex: Optional[str] = v.GRAMMAR.field(_DEFAULTS.regex)
    ebnf: Optional[str] = v.GRAMMAR.field(_DEFAULTS.ebnf)
    logit_bias: Optional[Dict[str, float]] = v.LOGIT_BIAS.field(_DEFAULTS.logit_bias)
    custom_params: Optional[Dict[str, Any]] = Field(
        _DEFAULTS.custom_params, description="Parameters passed to the request's custom_logit_processor "
        "(a server started with --enable-custom-logit-processor).")

    @model_validator(mode="after")
    def _across_fields(self) -> "SamplingParamsModel":
        v.check_top_k(self.top_k)
        v.check_min_max(self.min_new_tokens, self.max_new_tokens, "min_new_tokens", "max_new_tokens")
        v.check_seed_with_n(self.seed, self.n)
        v.check_one_grammar({name: getattr(self, name) for name in v.GRAMMAR_FIELDS})
        v.check_logit_bias(self.logit_bias)
        v.check_stop_regex(self.stop_regex)
        return self


def validate_sampling_params(d: Any) -> SamplingParamsModel:
    if not isinstance(d, dict):
        raise ParamError("sampling_params", "Input should be a dictionary", d, "a dict of sampling parameters")
    try:
        return SamplingParamsModel.model_validate(d)
    except ValidationError as e:
        message, param = describe_validation_error(e, SamplingParamsModel)
        raise ParamError(param or "sampling_params", "", message=message) from None


def choice_sampling_params(base: dict, index: int) -> dict:
    """Choice i of an n>1 request: the same params with its own seed (seed + i), so seeded choices differ
    reproducibly. One rule for chat, completions, /generate and the Engine."""
    params = dict(base)
    if params.get("seed") is not None and index > 0:
        params["seed"] = params["seed"] + index
    return params
