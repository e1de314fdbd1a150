"""Incremental detokenization that never splits a multi-byte character, plus stop-string and stop-regex matching.

Text is decoded over a short window of tokens: `prefix_offset` marks tokens already turned into text that are kept
only as context (so a tokenizer's leading-space rules apply), `read_offset` marks the end of the tokens whose text
has been emitted. A new piece is emitted only when it does not end in U+FFFD (an incomplete UTF-8 sequence).

Cost: one decode call per token. The text of the context window is kept between calls, and when the window is one
token (the usual case) it comes from a table of single-token texts shared by every request of the tokenizer. A
transformers fast tokenizer is called through its Rust `tokenizers.Tokenizer` directly (the Python wrapper costs
three times the decode itself) when that gives the same text: no clean-up of tokenization spaces, and no subclass
decoding its own way.
"""

from __future__ import annotations

import weakref
from typing import Callable, Dict, List, Optional, Tuple

REPLACEMENT_CHAR = "\ufffd"
# transformers' generic fast-tokenizer classes (4.x, 5.x): their _decode is the Rust decode, then an optional clean-up
_GENERIC_FAST_DECODE_MODULES = ("transformers.tokenization_utils_fast", "transformers.tokenization_utils_tokenizers")
SINGLE_TOKEN_TABLE_MAX_ENTRIES = 1 << 18  # per tokenizer and flags; a vocabulary is smaller than this

Decode = Callable[[List[int]], str]
# tokenizer -> {(skip_special_tokens, spaces_between_special_tokens): (decode, {token id: its text alone})}
_DECODERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _rust_decode(tokenizer, skip_special_tokens: bool) -> Optional[Decode]:
    """The Rust decode behind `tokenizer.decode`, when calling it directly gives the same text; else None."""
    backend = getattr(tokenizer, "_tokenizer", None)
    cls = type(tokenizer)
    try:
        import tokenizers
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
    except ImportError:
        return None
    if (not isinstance(backend, tokenizers.Tokenizer) or getattr(tokenizer, "clean_up_tokenization_spaces", True)
            or cls.decode is not PreTrainedTokenizerBase.decode
            or getattr(cls, "_decode", None) is None or cls._decode.__module__ not in _GENERIC_FAST_DECODE_MODULES):
        return None
    rust = backend.decode
    return lambda ids: rust(ids, skip_special_tokens=skip_special_tokens)


def text_decoder(tokenizer, skip_special_tokens: bool = True,
                 spaces_between_special_tokens: bool = True) -> Tuple[Decode, Dict[int, str]]:
    """(ids -> text, the shared table of single-token texts) for a tokenizer and decode flags."""
    key = (skip_special_tokens, spaces_between_special_tokens)
    try:
        per_tokenizer = _DECODERS.setdefault(tokenizer, {})
    except TypeError:  # not weak-referenceable: nothing shared
        per_tokenizer = {}
    found = per_tokenizer.get(key)
    if found is None:
        decode = _rust_decode(tokenizer, skip_special_tokens)
        if decode is None:
            def decode(ids: List[int]) -> str:
                return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens,
                                        spaces_between_special_tokens=spaces_between_special_tokens)
        found = per_tokenizer[key] = (decode, {})
    return found


class IncrementalDetokenizer:
    def __init__(self, tokenizer, skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.spaces_between_special_tokens = spaces_between_special_tokens
        self._decode, self._single_texts = text_decoder(tokenizer, skip_special_tokens, spaces_between_special_tokens)
        self.token_ids: List[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.prefix_text = ""  # the text of token_ids[prefix_offset:read_offset]

    def _window_text(self) -> str:
        """The text of token_ids[prefix_offset:read_offset]: a single token's from the shared table."""
        if self.read_offset - self.prefix_offset != 1:
            return self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        tid = self.token_ids[self.prefix_offset]
        text = self._single_texts.get(tid)
        if text is None:
            text = self._decode([tid])
            if len(self._single_texts) < SINGLE_TOKEN_TABLE_MAX_ENTRIES:
                self._single_texts[tid] = text
        return text

    def _emit(self, full_text: str) -> str:
        piece = full_text[len(self.prefix_text) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)
        self.prefix_text = self._window_text()
        return piece

    def add(self, new_ids: List[int]) -> str:
        """Append tokens; returns the text they complete (possibly empty)."""
        self.token_ids.extend(new_ids)
        full_text = self._decode(self.token_ids[self.prefix_offset :])
        if full_text.endswith(REPLACEMENT_CHAR) or len(full_text) < len(self.prefix_text):
            return ""
        return self._emit(full_text)

    def flush(self) -> str:
        """At the end of generation: whatever is pending, replacement characters included."""
        if self.read_offset == len(self.token_ids):
            return ""
        piece = self._emit(self._decode(self.token_ids[self.prefix_offset :]))
        self.prefix_offset = self.read_offset
        self.prefix_text = ""
        return piece


def find_stop(text: str, stops: List[str], search_from: int) -> Optional[Tuple[int, str]]:
    """Earliest occurrence of any stop string that ends at or after `search_from`: (start index, stop)."""
    best: Optional[Tuple[int, str]] = None
    for s in stops:
        idx = text.find(s, max(0, search_from - len(s) + 1))
        if idx != -1 and (best is None or idx < best[0]):
            best = (idx, s)
    return best


def held_back_len(text: str, stops: List[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop string (not safe to stream yet)."""
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), hold, -1):
            if text.endswith(s[:k]):
                hold = k
                break
    return hold


# one stop_regex search on the scheduler's thread may take this long; a pattern that backtracks catastrophically raises
# TimeoutError instead of stalling every request (Req fails its own request with a 400)
STOP_REGEX_SEARCH_TIMEOUT_S = 0.05


def find_stop_regex(text: str, patterns: list) -> Optional[Tuple[int, int, str]]:
    """Earliest match of any compiled stop regex in `text`: (start, end, the pattern's text), or None."""
    best: Optional[Tuple[int, int, str]] = None
    for p in patterns:
        m = p.search(text, timeout=STOP_REGEX_SEARCH_TIMEOUT_S)
        if m is not None and (best is None or m.start() < best[0]):
            best = (m.start(), m.end(), p.pattern)
    return best


def regex_held_back_len(text: str, patterns: list) -> int:
    """Length of the suffix of `text` from the earliest place where a stop regex could still match once more text
    arrives (a partial match reaching the end; `regex` module patterns): not safe to stream yet."""
    hold = 0
    for p in patterns:
        m = p.search(text, partial=True, timeout=STOP_REGEX_SEARCH_TIMEOUT_S)
        if m is not None and m.partial:
            hold = max(hold, len(text) - m.start())
    return hold
