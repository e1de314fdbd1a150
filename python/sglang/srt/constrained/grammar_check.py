"""The edge's grammar check: a request's constraint parses (xgrammar's own parser, no tokenizer work), and the server
has a grammar backend. Raises ParamError naming the field, with xgrammar's message; cheap enough to run per request
(the expensive compile against the vocabulary happens later, in the scheduler's background thread)."""

from __future__ import annotations

import re
from typing import Optional, Tuple

from sglang.srt.sampling.validation import ParamError

NO_BACKEND = "none"
# xgrammar prefixes its C++ errors with "[hh:mm:ss] /path/file.cc:123: "; the rest is the message for the client
_CPP_PREFIX = re.compile(r"^\s*\[[0-9:]+\]\s+\S+:\d+:\s*")


def xgrammar_message(err: BaseException) -> str:
    text = str(err).strip()
    text = _CPP_PREFIX.sub("", text)
    return text.replace("Check failed: (error.empty()) is false: ", "")


def parse_grammar(kind: str, text: str):
    """xgrammar.Grammar for (kind, text); raises xgrammar's error (RuntimeError / ValueError) if it does not parse."""
    import xgrammar as xgr

    if kind == "json_schema":
        return xgr.Grammar.from_json_schema(text)
    if kind == "regex":
        return xgr.Grammar.from_regex(text)
    if kind == "ebnf":
        return xgr.Grammar.from_ebnf(text)
    raise ValueError(f"unknown grammar kind {kind!r}")


def invalid_grammar_error(kind: str, text: str, err: BaseException) -> ParamError:
    return ParamError(kind, f"xgrammar could not compile it: {xgrammar_message(err)}", text,
                      f"a valid {'JSON schema (as a JSON string)' if kind == 'json_schema' else kind}")


def check_request_grammar(grammar: Optional[Tuple[str, str]], grammar_backend: str) -> None:
    """Raise ParamError if the request carries a grammar this server cannot apply."""
    if grammar is None:
        return
    kind, text = grammar
    if grammar_backend == NO_BACKEND:
        raise ParamError(kind, "This server was started with --grammar-backend none, so constrained decoding is off",
                         text, "no json_schema / regex / ebnf / response_format; or restart the server with "
                               "--grammar-backend xgrammar")
    try:
        parse_grammar(kind, text)
    except (RuntimeError, ValueError, TypeError) as e:
        raise invalid_grammar_error(kind, text, e) from None
