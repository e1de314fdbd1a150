"""LLGuidanceEngine: --grammar-backend llguidance (Microsoft's llguidance, from PyPI) behind the same interface as
xgrammar_engine.py, writing the same token bitmask (bit t % 32 of int32 word t // 32 = token t allowed).

    json_schema  llguidance's JSON compiler, as xgrammar's path compiles it: the compact layout (", " and ": ", no
                 free whitespace) unless the schema's own "x-guidance" says otherwise, and objects closed where the
                 schema leaves additionalProperties unset (xgrammar's strict mode)
    regex        Rust regex syntax
    ebnf         a Lark grammar (llguidance's own syntax, `start: ...`), or a GBNF / xgrammar-style one
                 (`root ::= ...`), which llguidance's converter translates to Lark; a form it cannot translate
                 (e.g. xgrammar's lookahead `(= ...)`, the escape \\0) is refused with its message
The compile builds one matcher (the lexer and parser tables: the slow part); each request gets a copy of it.
A matcher is terminated once it has accepted a stop token, as xgrammar's is (llguidance alone would also call a
grammar with nothing left to match stopped before that token).
"""

from __future__ import annotations

import json
from typing import Any, Optional, Sequence

from sglang.srt.function_call.grammar_lark import LLGUIDANCE_COMPACT_JSON, closed_objects


def grammar_text(kind: str, text: str) -> str:
    """llguidance's grammar (its serialized form) for (kind, text); raises ValueError if it cannot be built."""
    from llguidance import LLMatcher, grammar_from

    if kind == "json_schema":
        schema = json.loads(text)  # ValueError when it is not JSON
        return LLMatcher.grammar_from_json_schema(json.dumps(closed_objects(schema)), defaults=LLGUIDANCE_COMPACT_JSON)
    if kind in ("regex", "ebnf"):
        return grammar_from(kind, text)
    raise ValueError(f"unknown grammar kind {kind!r}")


class _Compiled:
    """A compiled grammar: a matcher that never advances, copied for each request."""

    def __init__(self, template: Any, memory_size_bytes: int):
        self.template = template
        # llguidance does not report its tables' size; the serialized grammar's length stands for it (cache budget)
        self.memory_size_bytes = memory_size_bytes


class LLGuidanceMatcher:
    def __init__(self, matcher: Any, stop_token_ids: frozenset):
        self._m = matcher
        self._stops = stop_token_ids
        self._terminated = False

    def fill_next_token_bitmask(self, bitmask: Any, row: int) -> None:
        words = bitmask[row]
        assert bitmask.dtype.itemsize == 4 and words.is_contiguous() and words.device.type == "cpu"
        self._m.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * 4)

    def accept_token(self, token_id: int) -> bool:
        ok = self._m.consume_token(token_id)
        if ok and token_id in self._stops:
            self._terminated = True
        return ok and not self._m.is_error()

    def is_terminated(self) -> bool:
        return self._terminated

    def accepting(self) -> bool:
        """Whether the output may end here. llguidance allows the stop token also where the grammar cannot go on
        at all (an empty language), so an allowed stop token alone does not say this."""
        return self._m.is_accepting()

    def stuck(self, words: Any) -> bool:
        """Whether this matcher's filled mask row `words` (int32 [W], host) is llguidance's form of a mask that allows
        nothing: only stop tokens, where the output may not end (sampling would pick one and be refused)."""
        if self._m.is_accepting():
            return False
        stop_bits: dict = {}
        for t in self._stops:
            stop_bits[t // 32] = stop_bits.get(t // 32, 0) | (1 << (t % 32))
        rest = words.clone()
        rest[list(stop_bits)] = 0
        if bool(rest.any()):
            return False
        return all(int(words[w]) & 0xFFFFFFFF & ~bits == 0 for w, bits in stop_bits.items())

    def error(self) -> Optional[str]:
        return self._m.get_error() if self._m.is_error() else None


class LLGuidanceEngine:
    name = "llguidance"
    package = "llguidance"

    @staticmethod
    def check(kind: str, text: str) -> str:
        from llguidance import LLMatcher

        grammar = grammar_text(kind, text)
        error = LLMatcher.validate_grammar(grammar)  # no tokenizer: the grammar itself only
        if error:
            raise ValueError(error)
        return grammar

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int]):
        import llguidance.hf

        self.stop_token_ids = frozenset(int(t) for t in stop_token_ids)
        self._tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size,
                                                       eos_token=sorted(self.stop_token_ids) or None)

    def compile(self, kind: str, text: str) -> _Compiled:
        from llguidance import LLMatcher

        grammar = grammar_text(kind, text)
        template = LLMatcher(self._tokenizer, grammar, log_level=0)
        if template.is_error():
            raise ValueError(template.get_error())
        return _Compiled(template, len(grammar))

    def matcher(self, compiled: _Compiled) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(compiled.template.deep_copy(), self.stop_token_ids)
