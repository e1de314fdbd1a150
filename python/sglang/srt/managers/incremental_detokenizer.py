"""Incremental detokenization that never splits a multi-byte character, plus stop-string matching.

Text is decoded over a short window of tokens: `prefix_offset` marks tokens already turned into text that are kept
only as context (so a tokenizer's leading-space rules apply), `read_offset` marks the end of the tokens whose text
has been emitted. A new piece is emitted only when it does not end in U+FFFD (an incomplete UTF-8 sequence).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer, skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.spaces_between_special_tokens = spaces_between_special_tokens
        self.token_ids: List[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""

    def _decode(self, ids: List[int]) -> str:
        return self.tokenizer.decode(
            ids,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
        )

    def add(self, new_ids: List[int]) -> str:
        """Append tokens; returns the text they complete (possibly empty)."""
        self.token_ids.extend(new_ids)
        prefix_text = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(self.token_ids[self.prefix_offset :])
        if full_text.endswith(REPLACEMENT_CHAR) or len(full_text) < len(prefix_text):
            return ""
        piece = full_text[len(prefix_text) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)
        self.text += piece
        return piece

    def flush(self) -> str:
        """At the end of generation: whatever is pending, replacement characters included."""
        if self.read_offset == len(self.token_ids):
            return ""
        prefix_text = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(self.token_ids[self.prefix_offset :])
        piece = full_text[len(prefix_text) :]
        self.prefix_offset = self.read_offset = len(self.token_ids)
        self.text += piece
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
