"""The rules every request field is checked against, written once.

The OpenAI request models (entrypoints/openai/protocol.py), the typed `sampling_params` of /generate and
SamplingParams.from_dict / verify (the offline Engine and the scheduler) all declare their fields with these rules,
so a bad value gets the same sentence on every path, naming the field, what was wrong and what is allowed:

    Invalid value for temperature: Input should be less than or equal to 2 (got 5). Allowed: a finite number in [0, 2].

Limits and why (types are strict everywhere: a bool is not a number, a string is not a bool):
  temperature         [0, 2]          OpenAI's range, 0 is greedy. A bound keeps logits / temperature finite next to
                                      the -inf of masked tokens (1e39 is inf in float32, and -inf / inf is NaN).
  top_p               (0, 1]          min_p [0, 1]; top_k -1 (no cut) or [1, 2^31-1]
  frequency/presence  [-2, 2]         OpenAI's range
  repetition_penalty  [0.01, 2]       1 is off; logits are scaled by at most 1 / 0.01 = 100x, so they stay finite
                                      (1e-300 is 0 in float32: a division by zero)
  seed                [0, 2^63-1]     torch.Generator takes a signed 64-bit seed; choice i of n uses seed + i, so
                                      seed + n - 1 must fit as well
  n                   [1, 128]        token counts (max/min_new_tokens, top_k) fit int32: [0, 2^31-1]
  stop                at most 4 strings of 1..512 characters (OpenAI allows 4)
  stop_token_ids      at most 256 ids, each in [0, vocab size)
  logprobs            chat top_logprobs / top_logprobs_num [0, 20]; completions logprobs [0, 5] (OpenAI's limits);
                      prompt_logprobs [0, 20] (vLLM's); logprob_start_len [-1, prompt length); token_ids_logprob at
                      most 256 ids in [0, vocab size) (upstream's /generate fields; both need return_logprob)
  rid                 1..256 characters, no control characters
  json_schema/regex/  at most one per request, 1..262,144 characters (compile time grows with the grammar); whether
  ebnf                it is a valid grammar is xgrammar's to say (srt/constrained/grammar_check.py)
  logit_bias          at most 1024 entries "token id" -> bias in [-100, 100] (OpenAI's range; 100 forces, -100
                      bans), each id in [0, vocab size)
  JSON bodies         nested at most 64 levels (deeper ones would exhaust the recursion of repr/pickle)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from pydantic import Field

MAX_TEMPERATURE = 2.0
MAX_ABS_PENALTY = 2.0
MIN_REPETITION_PENALTY = 0.01
MAX_REPETITION_PENALTY = 2.0
MAX_SEED = 2**63 - 1
MAX_N = 128
MAX_TOKEN_COUNT = 2**31 - 1
MAX_STOP_SEQUENCES = 4
MAX_STOP_CHARS = 512
MAX_STOP_TOKEN_IDS = 256
MAX_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5
MAX_PROMPT_LOGPROBS = 20  # vLLM's default max_logprobs
MAX_TOKEN_IDS_LOGPROB = 256
MAX_RID_CHARS = 256
MAX_CACHE_SALT_CHARS = 256
MAX_JSON_DEPTH = 64
MAX_GRAMMAR_CHARS = 262_144
GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf")
MAX_LOGIT_BIAS = 100.0
MAX_LOGIT_BIAS_ENTRIES = 1024
RID_PATTERN = r"^[^\x00-\x1f\x7f]+$"


def short_repr(value: Any) -> str:
    try:
        text = repr(value)
    except RecursionError:
        return "<a value nested too deeply>"
    return text if len(text) <= 80 else text[:77] + "..."


def _num(x: float) -> str:
    if x == MAX_SEED:
        return "2^63-1"
    if x == MAX_TOKEN_COUNT:
        return "2^31-1"
    return str(int(x)) if float(x).is_integer() else str(x)


@dataclass(frozen=True)
class Rule:
    """A scalar field's type and range: `field()` declares it on a pydantic model, `allowed` says it in words."""

    kind: type  # int, float, bool, str; list: constraints declared on the items (only `words` describes it)
    ge: Optional[float] = None
    gt: Optional[float] = None
    le: Optional[float] = None
    max_chars: Optional[int] = None
    words: Optional[str] = None  # replaces the generated description of the range
    note: str = ""

    @property
    def allowed(self) -> str:
        if self.words is not None:
            return self.words + self.note
        if self.kind is bool:
            return "true or false" + self.note
        if self.kind is str:
            return f"a string of 1 to {self.max_chars} characters" + self.note
        noun = "an integer" if self.kind is int else "a finite number"
        low = self.gt if self.gt is not None else self.ge
        if low is not None and self.le is not None:
            return f"{noun} in {'(' if self.gt is not None else '['}{_num(low)}, {_num(self.le)}]" + self.note
        if low is not None:
            return f"{noun} {'>' if self.gt is not None else '>='} {_num(low)}" + self.note
        return noun + self.note

    @property
    def description(self) -> str:
        return f"Allowed: {self.allowed}."

    def field(self, default: Any = ..., **extra: Any) -> Any:
        kw: dict = {"description": self.description}
        if self.kind in (int, float):
            kw.update(ge=self.ge, gt=self.gt, le=self.le)
        if self.kind is float:
            kw["allow_inf_nan"] = False
        if self.kind is str:
            kw.update(min_length=1, max_length=self.max_chars)
        kw.update(extra)
        return Field(default, **kw)


TEMPERATURE = Rule(float, ge=0.0, le=MAX_TEMPERATURE, note=" (0 is greedy)")
TOP_P = Rule(float, gt=0.0, le=1.0)
TOP_K = Rule(int, ge=-1, le=MAX_TOKEN_COUNT, words="-1 (no top-k cut) or an integer in [1, 2^31-1]")
MIN_P = Rule(float, ge=0.0, le=1.0)
PENALTY = Rule(float, ge=-MAX_ABS_PENALTY, le=MAX_ABS_PENALTY)
REPETITION_PENALTY = Rule(float, ge=MIN_REPETITION_PENALTY, le=MAX_REPETITION_PENALTY, note=" (1 is off)")
NEW_TOKENS = Rule(int, ge=0, le=MAX_TOKEN_COUNT)
CHAT_MAX_TOKENS = Rule(int, ge=1, le=MAX_TOKEN_COUNT)
SEED = Rule(int, ge=0, le=MAX_SEED, note="; choice i of n uses seed + i, so seed + n - 1 must not exceed 2^63-1")
N = Rule(int, ge=1, le=MAX_N)
TOP_LOGPROBS = Rule(int, ge=0, le=MAX_TOP_LOGPROBS)
COMPLETION_LOGPROBS = Rule(int, ge=0, le=MAX_COMPLETION_LOGPROBS)
PROMPT_LOGPROBS = Rule(int, ge=0, le=MAX_PROMPT_LOGPROBS, note=" (vLLM's extension: the top-N of every prompt token)")
LOGPROB_START_LEN = Rule(int, ge=-1, le=MAX_TOKEN_COUNT, note=" (-1: no prompt logprobs) below the prompt's length")
# worded with upstream's terms ("flat list of integers", "out-of-vocabulary"): clients match on them
TOKEN_IDS_LOGPROB = Rule(list, words=f"a flat list of integers: at most {MAX_TOKEN_IDS_LOGPROB} token ids, each in "
                                     "[0, vocab size) (other ids are out-of-vocabulary)")
FLAG = Rule(bool)
RID = Rule(str, max_chars=MAX_RID_CHARS, note=" without control characters")
CACHE_SALT = Rule(str, max_chars=MAX_CACHE_SALT_CHARS, note="; requests share cached prompt prefixes only with the "
                  "same salt (none shares with none)")
STOP = Rule(
    list, words=f"a string or a list of at most {MAX_STOP_SEQUENCES} strings, each of 1 to {MAX_STOP_CHARS} characters"
)
STOP_REGEX = Rule(list, words=f"a regular expression or a list of at most {MAX_STOP_SEQUENCES}, each of 1 to "
                              f"{MAX_STOP_CHARS} characters, that compiles and does not match the empty text")
STOP_TOKEN_IDS = Rule(list, words=f"a list of at most {MAX_STOP_TOKEN_IDS} token ids, each in [0, vocab size)")
GRAMMAR = Rule(str, max_chars=MAX_GRAMMAR_CHARS, note="; at most one of json_schema, regex, ebnf per request")
LOGIT_BIAS = Rule(dict, words=f"an object of at most {MAX_LOGIT_BIAS_ENTRIES} entries mapping a token id (a string "
                               f"of digits, in [0, vocab size)) to a bias in [-100, 100]")

# a token id before the vocabulary is known; the vocabulary check comes with the model (SamplingParams.verify)
TOKEN_ID_FIELD = Field(ge=0, le=MAX_TOKEN_COUNT)
STOP_STR_FIELD = Field(min_length=1, max_length=MAX_STOP_CHARS)


class ParamError(ValueError):
    """A bad request field. `param` names it; str() is the sentence for the client."""

    def __init__(self, param: str, reason: str, value: Any = None, allowed: Optional[str] = None,
                 message: Optional[str] = None):
        self.param, self.reason, self.value, self.allowed = param, reason, value, allowed
        super().__init__(message if message is not None else self.render(param))

    def render(self, path: str) -> str:
        return invalid_value(path, self.reason, self.value, self.allowed)


def invalid_value(path: str, reason: str, value: Any, allowed: Optional[str]) -> str:
    text = f"Invalid value for {path}: {reason} (got {short_repr(value)})."
    return text + (f" Allowed: {allowed}." if allowed else "")


# ---------------------------------------------------------------------- checks across fields
def check_top_k(top_k: int) -> None:
    if top_k == 0:
        raise ParamError("top_k", "Input should not be 0", top_k, TOP_K.allowed)


def check_seed_with_n(seed: Optional[int], n: int, seed_param: str = "seed") -> None:
    if seed is not None and seed + n - 1 > MAX_SEED:
        raise ParamError(seed_param, f"With n={n}, the last choice's seed (seed + {n - 1}) exceeds 2^63-1", seed,
                         f"an integer in [0, 2^63-1 - (n-1)] = [0, {MAX_SEED - n + 1}]")


def check_min_max(min_value: int, max_value: Optional[int], min_param: str, max_param: str) -> None:
    if max_value is not None and min_value > max_value:
        raise ParamError(min_param, f"Input should not exceed {max_param} ({max_value})", min_value,
                         f"an integer in [0, {max_param}]")


def check_token_ids_in_vocab(ids, vocab_size: int, param: str) -> None:
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ParamError(param, f"Token ID {bad} is out of vocabulary (an out-of-vocabulary id: outside the vocabulary)",
                         bad,
                         f"token ids in [0, {vocab_size}) (the model's vocabulary size is {vocab_size})")


def check_one_grammar(values: dict) -> None:
    """At most one of json_schema, regex, ebnf (values: field -> value or None)."""
    given = [name for name in GRAMMAR_FIELDS if values.get(name) is not None]
    if len(given) > 1:
        raise ParamError(given[1], f"Only one constraint may be given per request, but {' and '.join(given)} are set",
                         values[given[1]], f"one of {', '.join(GRAMMAR_FIELDS)}")


def check_logit_bias(bias: Optional[dict], vocab_size: Optional[int] = None, param: str = "logit_bias") -> None:
    """Keys are token ids written as decimal strings; values are finite numbers in [-100, 100]."""
    if bias is None:
        return
    if len(bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise ParamError(param, f"{len(bias)} entries is too many", f"<{len(bias)} entries>", LOGIT_BIAS.allowed)
    for key, value in bias.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise ParamError(param, f"Key {key!r} is not a token id", key, LOGIT_BIAS.allowed)
        if vocab_size is not None and int(key) >= vocab_size:
            raise ParamError(param, f"Token id {key} is outside the vocabulary", key,
                             f"token ids in [0, {vocab_size}) (the model's vocabulary size is {vocab_size})")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            raise ParamError(param, f"The bias of token {key} is not a number in [-100, 100]", value,
                             LOGIT_BIAS.allowed)


def check_stop_regex(stop_regex, param: str = "stop_regex") -> None:
    """Each pattern must compile (Python's `regex` syntax, a superset of `re`) and must not match the empty text (it
    would stop before the first token)."""
    import regex

    for pattern in [stop_regex] if isinstance(stop_regex, str) else stop_regex or []:
        try:
            compiled = regex.compile(pattern)
        except regex.error as e:
            raise ParamError(param, f"The pattern does not compile ({e})", pattern, STOP_REGEX.allowed) from None
        if compiled.search("") is not None:
            raise ParamError(param, "The pattern matches the empty text, so it would stop before the first token",
                             pattern, STOP_REGEX.allowed)
