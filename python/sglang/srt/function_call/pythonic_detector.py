"""--tool-call-parser pythonic: tool calls written as a Python list of calls with keyword arguments,

    [get_weather(city="Paris", unit="celsius"), get_time(tz="UTC")]

anywhere in the output (the text around the list is content; Llama 3.2 / 4 and other small models use it). The list
is read with `ast.parse` and each argument with `ast.literal_eval` -- never evaluated -- and the arguments become a
JSON object (OpenAI's `arguments` string). JSON's true / false / null are read as Python's True / False / None.

Streaming: a "[" that may open such a list (`[`, blanks, a name, `(`) holds the text from there back until the list
closes; then its calls go out whole (name, then arguments), or, if the bracketed text is not a list of calls, it is
content. So the stream adds up to the non-streamed parse, as for every format (base_format_detector.py).
tool_choice "required" / a named function cannot be enforced in this format (supports_grammar = False): its
arguments are Python, not JSON, and the grammar backends constrain JSON schemas.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any, List, Optional, Tuple

from sglang.srt.function_call.base_format_detector import BaseFormatDetector, ParsedCall, ParseState

_OPENS = re.compile(r"\[\s*[A-Za-z_][A-Za-z0-9_]*\s*\(")  # the start of a list of calls
_MAY_OPEN = re.compile(r"\[\s*(?:[A-Za-z_][A-Za-z0-9_]*\s*)?")  # what may still become one
_CLOSERS = {"(": ")", "[": "]", "{": "}"}
_JSON_NAMES = {"true": True, "false": False, "null": None}
INCOMPLETE, INVALID = -1, -2


def list_end(text: str, i: int) -> int:
    """Index after the "]" closing the bracket at text[i] (Python strings and nesting respected), INCOMPLETE, or
    INVALID (a mismatched closer)."""
    stack: List[str] = []
    n = len(text)
    while i < n:
        c = text[i]
        if c in _CLOSERS:
            stack.append(_CLOSERS[c])
        elif c in ")]}":
            if not stack or stack.pop() != c:
                return INVALID
            if not stack:
                return i + 1
        elif c in "'\"":
            quote = c * 3 if text.startswith(c * 3, i) else c
            j = i + len(quote)
            while True:
                if j >= n:
                    return INCOMPLETE
                if text[j] == "\\":
                    j += 2
                    continue
                if text.startswith(quote, j):
                    break
                if len(quote) == 1 and text[j] == "\n":
                    return INVALID
                j += 1
            i = j + len(quote) - 1
        i += 1
    return INCOMPLETE


def _value(node: ast.AST) -> Any:
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.List):
        return [_value(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("** in a dict")
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values)}
    value = ast.literal_eval(node)  # constants, tuples, negative numbers; raises on anything else
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, (set, frozenset, bytes, complex)):
        raise ValueError(f"{type(value).__name__} is not a JSON value")
    return value


def parse_call_list(source: str) -> Optional[List[Tuple[str, str]]]:
    """[(name, arguments as JSON)] of a Python list of calls, or None if `source` is not one."""
    try:
        tree = ast.parse(source.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for call in tree.elts:
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)) or call.args:
            return None
        try:
            args = {kw.arg: _value(kw.value) for kw in call.keywords if kw.arg is not None}
            if len(args) != len(call.keywords):
                return None  # **kwargs
            calls.append((call.func.id, json.dumps(args, ensure_ascii=False)))
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return None
    return calls


class PythonicDetector(BaseFormatDetector):
    name = "pythonic"
    supports_grammar = False

    @property
    def trigger(self) -> str:
        return "["

    def parse(self, text: str, pos: int = 0, final: bool = True, forced: bool = False) -> ParseState:
        st = ParseState(settled_pos=pos)
        content: List[str] = []
        i = pos
        n = len(text)
        while True:
            t = text.find("[", i)
            if t < 0:
                content.append(text[i:])
                self._settle(st, n, content)
                break
            m = _OPENS.match(text, t)
            if m is None:
                if not final and _MAY_OPEN.fullmatch(text, t):
                    content.append(text[i:t])  # a list of calls may be opening: hold it back
                    self._settle(st, t, content)
                    break
                content.append(text[i:t + 1])
                i = t + 1
                continue
            end = list_end(text, t)
            if end == INCOMPLETE and not final:
                content.append(text[i:t])
                self._settle(st, t, content)
                break
            calls = parse_call_list(text[t:end]) if end > 0 else None
            if calls is None:
                content.append(text[i:t + 1])
                i = t + 1
                continue
            content.append(text[i:t])
            st.calls.extend(ParsedCall(name, args) for name, args in calls)
            i = end
            self._settle(st, i, content)
        st.content = "".join(content)
        return st
