"""Per-request sampling parameters, validated once at the API boundary.

Errors are ValueError with a message naming the parameter, the bad value and the allowed range; the HTTP layer turns
them into 400 responses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Union

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
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    seed: Optional[int] = None
    n: int = 1
    # normalised forms, filled by normalize()
    stop_strs: List[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> "SamplingParams":
        d = dict(d or {})
        known = {f for f in cls.__dataclass_fields__ if f != "stop_strs"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"Unknown sampling parameter(s): {', '.join(unknown)}. Allowed: {', '.join(sorted(known))}.")
        sp = cls(**d)
        sp.verify()
        sp.normalize()
        return sp

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0 or self.repetition_penalty != 1.0

    def verify(self, vocab_size: Optional[int] = None) -> None:
        def num(name, v, kind=(int, float)):
            if isinstance(v, bool) or not isinstance(v, kind):
                raise ValueError(f"{name} must be a number, got {v!r}.")

        num("temperature", self.temperature)
        num("top_p", self.top_p)
        num("min_p", self.min_p)
        num("frequency_penalty", self.frequency_penalty)
        num("presence_penalty", self.presence_penalty)
        num("repetition_penalty", self.repetition_penalty)
        num("top_k", self.top_k, int)
        num("min_new_tokens", self.min_new_tokens, int)
        num("n", self.n, int)
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.top_k < -1 or self.top_k == 0:
            raise ValueError(f"top_k must be -1 (disable) or at least 1, got {self.top_k}.")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}.")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise ValueError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}.")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise ValueError(f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}.")
        if self.max_new_tokens is not None:
            num("max_new_tokens", self.max_new_tokens, int)
            if self.max_new_tokens < 0:
                raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}.")
            if self.min_new_tokens > self.max_new_tokens:
                raise ValueError(
                    f"min_new_tokens ({self.min_new_tokens}) must not exceed max_new_tokens ({self.max_new_tokens})."
                )
        if self.min_new_tokens < 0:
            raise ValueError(f"min_new_tokens must be >= 0, got {self.min_new_tokens}.")
        if self.n < 1 or self.n > 128:
            raise ValueError(f"n must be in [1, 128], got {self.n}.")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an integer, got {self.seed!r}.")
        if self.stop is not None:
            stops = [self.stop] if isinstance(self.stop, str) else self.stop
            if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
                raise ValueError("stop must be a string or a list of strings.")
            if any(s == "" for s in stops):
                raise ValueError("stop strings must not be empty.")
        if self.stop_token_ids is not None:
            if not isinstance(self.stop_token_ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids
            ):
                raise ValueError("stop_token_ids must be a list of non-negative integers.")
            if vocab_size is not None and any(t >= vocab_size for t in self.stop_token_ids):
                raise ValueError(f"stop_token_ids must be < vocab size {vocab_size}.")

    def normalize(self) -> None:
        if self.stop is None:
            self.stop_strs = []
        elif isinstance(self.stop, str):
            self.stop_strs = [self.stop]
        else:
            self.stop_strs = list(self.stop)
        if self.temperature < _GREEDY_EPS:
            # greedy: make the sampler's fast path obvious
            self.top_k = 1

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d.pop("stop_strs", None)
        return d
