"""The edge's grammar check: a request's constraint parses under the server's grammar backend (the backend's own
parser, no tokenizer work), and the server has a backend. Raises ParamError naming the field, with the backend's
message (internal source locations removed: function_call/grammar_errors.py); cheap enough to run per request (the
expensive compile against the vocabulary happens later, in the scheduler's background thread)."""

from __future__ import annotations

from typing import Optional, Tuple

from sglang.srt.constrained.backend_table import NO_BACKEND, WORKING_BACKENDS, engine_class
from sglang.srt.constrained.empty_language import EMPTY_LANGUAGE_ALLOWED, EmptyGrammarError, check_not_empty
from sglang.srt.function_call.grammar_errors import clean_grammar_error
from sglang.srt.sampling.validation import ParamError

__all__ = ["NO_BACKEND", "EmptyGrammarError", "check_request_grammar", "grammar_refusal", "invalid_grammar_error", "parse_grammar",
           "xgrammar_message"]


def xgrammar_message(err: BaseException) -> str:
    """A grammar backend's error without its internal source locations (kept under this name for its callers)."""
    return clean_grammar_error(err)


def parse_grammar(kind: str, text: str, backend: str = "xgrammar"):
    """The backend's parse of (kind, text); raises its error (RuntimeError / ValueError) if it does not parse, and
    EmptyGrammarError if xgrammar's grammar matches no string (empty_language.py; llguidance's grammars are
    checked after their compile instead)."""
    parsed = engine_class(backend).check(kind, text)
    if backend == "xgrammar":
        check_not_empty(kind, text, parsed)
    return parsed


def grammar_refusal(err: BaseException, backend: str = "xgrammar") -> str:
    """Why a grammar is refused, as the reason of a ParamError."""
    if isinstance(err, EmptyGrammarError):
        return str(err)
    return f"{backend} could not compile it: {clean_grammar_error(err)}"


def invalid_grammar_error(kind: str, text: str, err: BaseException, backend: str = "xgrammar") -> ParamError:
    if isinstance(err, EmptyGrammarError):
        return ParamError(kind, str(err), text, EMPTY_LANGUAGE_ALLOWED)
    return ParamError(kind, grammar_refusal(err, backend), text,
                      f"a valid {'JSON schema (as a JSON string)' if kind == 'json_schema' else kind}"
                      + (" (a Lark grammar, or GBNF that llguidance can translate)"
                         if kind == "ebnf" and backend == "llguidance" else ""))


def check_request_grammar(grammar: Optional[Tuple[str, str]], grammar_backend: str) -> None:
    """Raise ParamError if the request carries a grammar this server cannot apply."""
    if grammar is None:
        return
    kind, text = grammar
    if grammar_backend not in WORKING_BACKENDS:
        raise ParamError(kind, f"This server was started with --grammar-backend {grammar_backend}, so constrained "
                         "decoding is off", text, "no json_schema / regex / ebnf / response_format; or restart the "
                         f"server with --grammar-backend {' or '.join(WORKING_BACKENDS)}")
    try:
        parse_grammar(kind, text, grammar_backend)
    except (RuntimeError, ValueError, TypeError) as e:
        raise invalid_grammar_error(kind, text, e, grammar_backend) from None
