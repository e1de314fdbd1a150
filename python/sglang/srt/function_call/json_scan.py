"""Where a JSON value ends in text that may still be arriving.

The tool-call parsers read model output token by token, so a JSON object is usually cut off somewhere. These
scanners answer, for text[i:], one of three things: the value ends at index j; the text stops before the value ends
(INCOMPLETE); or it can no longer become JSON (INVALID, with the index of the offending character). Nothing
recurses: nesting is a stack of expected closing brackets.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Dict, Tuple

INCOMPLETE = -1
INVALID = -2

WHITESPACE = " \t\r\n"
_STRING_RUN = re.compile(r'[^"\\]*')
_NUMBER_RUN = re.compile(r"[-+0-9.eE]+")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_LITERALS = ("true", "false", "null")


def skip_ws(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in WHITESPACE:
        i += 1
    return i


def string_end(text: str, i: int) -> Tuple[int, int]:
    """text[i] is '"': (end index after the closing quote, 0) or (INCOMPLETE, len(text))."""
    j, n = i + 1, len(text)
    while True:
        j = _STRING_RUN.match(text, j).end()
        if j >= n:
            return INCOMPLETE, n
        if text[j] == '"':
            return j + 1, 0
        if j + 1 >= n:  # a backslash as the last character: its escape has not arrived
            return INCOMPLETE, n
        j += 2


def value_end(text: str, i: int) -> Tuple[int, int]:
    """(status, position) of the JSON value starting at text[i] (no leading whitespace):
    (end index, end index) when it is complete, (INCOMPLETE, len(text)), or (INVALID, index of the bad character)."""
    n = len(text)
    closers = []  # '}' / ']' still owed, innermost last
    expect = "value"  # "value" | "key" | "after"
    while True:
        if expect == "after":
            if not closers:
                return i, i
            i = skip_ws(text, i)
            if i >= n:
                return INCOMPLETE, n
            c = text[i]
            if c == ",":
                i = skip_ws(text, i + 1)
                expect = "key" if closers[-1] == "}" else "value"
            elif c == closers[-1]:
                closers.pop()
                i += 1
            else:
                return INVALID, i
            continue
        if i >= n:
            return INCOMPLETE, n
        c = text[i]
        if expect == "key":
            if c != '"':
                return INVALID, i
            i, _ = string_end(text, i)
            if i == INCOMPLETE:
                return INCOMPLETE, n
            i = skip_ws(text, i)
            if i >= n:
                return INCOMPLETE, n
            if text[i] != ":":
                return INVALID, i
            i = skip_ws(text, i + 1)
            expect = "value"
            continue
        # expect == "value"
        if c == '"':
            i, _ = string_end(text, i)
            if i == INCOMPLETE:
                return INCOMPLETE, n
            expect = "after"
        elif c in "{[":
            closers.append("}" if c == "{" else "]")
            i = skip_ws(text, i + 1)
            if i >= n:
                return INCOMPLETE, n
            if text[i] == closers[-1]:
                closers.pop()
                i += 1
                expect = "after"
            else:
                expect = "key" if c == "{" else "value"
        elif c == "-" or c.isdigit():
            run_end = _NUMBER_RUN.match(text, i).end()
            if run_end >= n:
                return INCOMPLETE, n  # more digits may follow
            if not _NUMBER.fullmatch(text, i, run_end):
                return INVALID, i
            i, expect = run_end, "after"
        else:
            for lit in _LITERALS:
                if text.startswith(lit, i):
                    i += len(lit)
                    expect = "after"
                    break
                if lit.startswith(text[i:i + len(lit)]) and i + len(lit) > n:
                    return INCOMPLETE, n
            else:
                return INVALID, i


@dataclass
class ObjectScan:
    """One JSON object's top-level members as far as the text goes."""

    # key -> (value start, value end), end INCOMPLETE for the member still arriving
    members: Dict[str, Tuple[int, int]] = field(default_factory=dict)
    end: int = INCOMPLETE  # index after the closing brace, INCOMPLETE, or INVALID
    error_at: int = 0  # with INVALID: the offending character


def scan_object(text: str, i: int) -> ObjectScan:
    """The object starting at text[i] == '{'."""
    n, scan = len(text), ObjectScan()

    def invalid(at: int) -> ObjectScan:
        scan.end, scan.error_at = INVALID, at
        return scan

    i = skip_ws(text, i + 1)
    if i < n and text[i] == "}":
        scan.end = i + 1
        return scan
    while True:
        if i >= n:
            return scan
        if text[i] != '"':
            return invalid(i)
        key_end, _ = string_end(text, i)
        if key_end == INCOMPLETE:
            return scan
        try:
            key = json.loads(text[i:key_end])
        except ValueError:
            return invalid(i)
        i = skip_ws(text, key_end)
        if i >= n:
            return scan
        if text[i] != ":":
            return invalid(i)
        i = skip_ws(text, i + 1)
        if i >= n:
            return scan
        status, at = value_end(text, i)
        if status == INVALID:
            scan.members[key] = (i, at)
            return invalid(at)
        scan.members[key] = (i, status)
        if status == INCOMPLETE:
            return scan
        i = skip_ws(text, status)
        if i >= n:
            return scan
        if text[i] == "}":
            scan.end = i + 1
            return scan
        if text[i] != ",":
            return invalid(i)
        i = skip_ws(text, i + 1)
