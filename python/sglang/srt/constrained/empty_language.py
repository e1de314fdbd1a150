"""Grammars that match no string at all, refused as the client's error before any token is sampled under them:
those whose output cannot even begin (`root ::= root`, the regex `[^\\s\\S]`, a JSON schema whose $ref only refers
to itself), and those that can begin but never finish (`root ::= "a" rest` / `rest ::= rest`, the regex
`a[^\\s\\S]`, a required property whose schema is a $ref cycle).

Cannot begin: the grammar matcher's own test, from its start state: if no token can begin an output and the output
may not end there either (no stop token allowed), no string is in the language -- a matcher accepts every prefix of
a matching string, the empty one included. It runs twice:

    at the edge      admits_nothing_bytewise: against a vocabulary of the 256 single bytes and one stop token, so the
                     answer holds for every tokenizer (each output is some byte string); ~1 ms, no tokenizer
    after a compile  admits_nothing_from_start: the compiled grammar's matcher against the served vocabulary -- what
                     sampling would mask with; covers the llguidance backend (whose Lark grammars xgrammar cannot
                     read at the edge) and a tokenizer that cannot spell what the grammar wants

Cannot finish: a matcher's start state says nothing about it, so the test is on the grammar itself: never_finishes
runs the productive-symbol analysis (grammar_productivity.py) on xgrammar's normalized grammar, at the edge and
again after the compile; it answers only when sure, so a grammar some string matches is never refused.

What neither test can see: a grammar some byte string matches that the served tokenizer cannot spell past a prefix
(it lacks a token for a byte the grammar needs next). Sampling finds that one: the request ends with a 400 when its
mask allows nothing (logits_mask.py, request_grammar.GrammarDeadEnd).
"""

from __future__ import annotations

import threading
from typing import Any, Optional, Sequence

import torch

from sglang.srt.constrained.grammar_productivity import root_is_productive
from sglang.srt.mem_plan.sizes import grammar_bitmask_words

EMPTY_LANGUAGE_REASON = (
    "it matches no string at all: no character can begin an output and an empty output is not allowed either "
    "(e.g. a rule that only refers to itself, like root ::= root; a $ref cycle with no other choice; an empty "
    "character class like [^\\s\\S])")
NEVER_FINISHES_REASON = (
    "it matches no string at all: an output can begin, but no continuation of it ever completes the grammar (e.g. a "
    "rule with no way out of its recursion, like rest ::= rest or root ::= \"a\" root; a required property whose "
    "schema is a $ref cycle; an empty character class like [^\\s\\S] after a prefix)")
EMPTY_LANGUAGE_ALLOWED = "a grammar that at least one string matches"

_BYTE_VOCAB_SIZE = 257  # the 256 bytes, then the stop token


class EmptyGrammarError(ValueError):
    """The grammar's language is empty (str: EMPTY_LANGUAGE_REASON, or NEVER_FINISHES_REASON)."""

    def __init__(self, reason: str = EMPTY_LANGUAGE_REASON) -> None:
        super().__init__(reason)


def _allowed_tokens(matcher: Any, vocab_size: int) -> torch.Tensor:
    row = torch.zeros((1, grammar_bitmask_words(vocab_size)), dtype=torch.int32)
    matcher.fill_next_token_bitmask(row, 0)
    bits = (row[0].unsqueeze(1) >> torch.arange(32, dtype=torch.int32)) & 1  # bit t % 32 of word t // 32
    return torch.nonzero(bits.reshape(-1)[:vocab_size]).flatten()


def admits_nothing_from_start(matcher: Any, vocab_size: int, stop_token_ids: Sequence[int]) -> bool:
    """True when a fresh matcher (xgrammar's, or llguidance_engine.LLGuidanceMatcher) allows no token in its first
    position, or (llguidance, which then allows the stop token while not accepting) only a stop token where the
    output may not end."""
    allowed = set(_allowed_tokens(matcher, vocab_size).tolist())
    if not allowed:
        return True
    accepting = getattr(matcher, "accepting", None)
    return callable(accepting) and allowed <= set(stop_token_ids) and not accepting()


class _ByteCompiler:
    """An xgrammar compiler over the 256 single-byte tokens + one stop token, built on first use."""

    _lock = threading.Lock()
    _compiler: Optional[Any] = None

    @classmethod
    def compile(cls, kind: str, text: str) -> Any:
        import xgrammar as xgr

        with cls._lock:  # one compile at a time: the compiler is shared by the edge's worker threads
            if cls._compiler is None:
                vocab = [bytes([b]) for b in range(256)] + [b"<stop>"]
                info = xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.RAW, stop_token_ids=[256])
                cls._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            c = cls._compiler
            if kind == "json_schema":
                return c.compile_json_schema(text, any_whitespace=False)
            if kind == "regex":
                return c.compile_regex(text)
            if kind == "ebnf":
                return c.compile_grammar(text)
            raise ValueError(f"unknown grammar kind {kind!r}")


def never_finishes(grammar: Any) -> bool:
    """True when the xgrammar Grammar (or CompiledGrammar) is sure to match no finite string; False also when the
    analysis cannot tell (grammar_productivity.py)."""
    return root_is_productive(str(getattr(grammar, "grammar", grammar))) is False


def admits_nothing_bytewise(kind: str, text: str) -> bool:
    """True when no byte string can begin an output of the (xgrammar-parsable) grammar; raises the backend's error
    if it does not compile."""
    import xgrammar as xgr

    return len(_allowed_tokens(xgr.GrammarMatcher(_ByteCompiler.compile(kind, text)), _BYTE_VOCAB_SIZE)) == 0


def check_not_empty(kind: str, text: str, grammar: Any) -> None:
    """The edge's test of an xgrammar grammar (`grammar`: its parse of (kind, text)): raises EmptyGrammarError with
    the reason when no string matches it."""
    if admits_nothing_bytewise(kind, text):
        raise EmptyGrammarError()
    if never_finishes(grammar):
        raise EmptyGrammarError(NEVER_FINISHES_REASON)
