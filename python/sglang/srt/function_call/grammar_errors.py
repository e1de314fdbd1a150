"""Grammar backends' error messages as a client may read them: the backends' internal source locations taken out.

xgrammar reports a bad schema as "[11:28:28] /project/cpp/json_schema_converter.cc:4944: Unsupported type ..." and
may add a C++ check's wording; llguidance's Rust errors can name a .rs file. What the client gets is the rest -- the
part about its grammar. Both constrained/ (request grammars) and function_call/ (tool-call grammars) build
grammars; this sits in the lower of the two layers so both use it.
"""

from __future__ import annotations

import re

# "[hh:mm:ss] " timestamps, and "path/file.cc:123: " / "file.rs:12:5" source locations anywhere in the text
_TIMESTAMP = re.compile(r"\[\d{1,2}:\d{2}:\d{2}\]\s*")
_SOURCE_LOCATION = re.compile(r"(?:[\w./\\-]*/)?[\w.-]+\.(?:cc|cpp|cxx|c|h|hpp|rs)(?::\d+)+:?\s*")
_CHECK_WORDING = ("Check failed: (error.empty()) is false: ",)
_STACK_TRACE = re.compile(r"\n\s*Stack trace:.*", re.S)


def clean_grammar_error(err: object) -> str:
    """The message of a grammar backend's exception (or the text itself), without internal source locations."""
    text = _STACK_TRACE.sub("", str(err)).strip()
    text = _SOURCE_LOCATION.sub("", _TIMESTAMP.sub("", text))
    for wording in _CHECK_WORDING:
        text = text.replace(wording, "")
    return text.strip() or type(err).__name__
