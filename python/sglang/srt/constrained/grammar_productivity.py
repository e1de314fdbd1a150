"""Whether a grammar's root can derive any finite string: the productive-symbol analysis of a context-free grammar,
run on xgrammar's own normalized grammar (str(xgrammar.Grammar): one `name ::= body [(= lookahead)]` line per rule).

A rule is productive when one of its alternatives is a sequence of productive elements; the productive set is the
least fixpoint of that rule. Elements:
    "..." (any byte string, "" included), [...]* (zero repetitions)   productive
    Regex("..."), Token(...) (xgrammar's own elements, e.g. a pattern)  productive (their text is not read)
    [...] / [^...]                                                    productive iff its set of code points is not empty
    name                                                              iff the rule is
    name{m, n}                                                        iff m == 0 or the rule is
    (= ...) lookahead                                                 ignored: it only restricts what follows
The root's language is empty iff the root is not productive. A grammar that can begin but never finish
(`root ::= "a" rest` / `rest ::= rest`, `a[^\\s\\S]`, a required property whose schema is a $ref cycle) is such a
grammar even though its matcher accepts a prefix -- the check at the start state (empty_language.py) cannot see it.

Only a sure answer refuses anything: every approximation here errs towards "productive" (lookaheads ignored, a
character class that cannot be read counts as non-empty, so do Regex(...) and Token(...)), and a line or element
this reader does not know (TagDispatch, a format of a later xgrammar) makes the answer None, "unknown", which refuses
nothing.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple, Union

MAX_CODEPOINT = 0x10FFFF
_RULE_LINE = re.compile(r"^([A-Za-z_][\w.\-]*)(?:\[[^\]]*\])? ::= (.*)$")
_NAME = re.compile(r"[A-Za-z_][\w.\-]*")
_REPEAT = re.compile(r"\{(\d+), (-?\d+)\}")
_SIMPLE_ESCAPES = {"'": 39, '"': 34, "?": 63, "\\": 92, "a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9,
                   "v": 11, "0": 0, "e": 27, "-": 45, "]": 93}
_HEX_WIDTH = {"x": 2, "u": 4, "U": 8}

# an expression: True/False (a terminal), ("ref", name, min_repeats), ("seq", [expr]), ("alt", [expr])
Expr = Union[bool, Tuple]


class _Unknown(Exception):
    """The printed grammar holds something this reader does not know: no answer."""


def _codepoint(text: str, i: int) -> Tuple[int, int]:
    """(code point, index after it) of the character or escape at text[i] (xgrammar's printer escapes: C escapes,
    \\xHH, \\uHHHH, \\UHHHHHHHH; in classes also \\- and \\])."""
    if text[i] != "\\":
        return ord(text[i]), i + 1
    if i + 1 >= len(text):
        raise _Unknown("a trailing backslash")
    c = text[i + 1]
    if c in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[c], i + 2
    width = _HEX_WIDTH.get(c)
    digits = text[i + 2 : i + 2 + width] if width else ""
    if not width or len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
        raise _Unknown(f"escape {text[i:i + 4]!r}")
    return int(digits, 16), i + 2 + width


def class_is_empty(body: str) -> bool:
    """body: a character class without its brackets ("^a-z", "\\0-\\x1f"); True when no code point is in it."""
    negated = body.startswith("^")
    i, ranges = (1 if negated else 0), []
    while i < len(body):
        lo, i = _codepoint(body, i)
        hi = lo
        if i < len(body) - 1 and body[i] == "-":
            hi, i = _codepoint(body, i + 1)
        ranges.append((lo, hi))
    if not negated:
        return not any(lo <= hi for lo, hi in ranges)
    covered = 0  # the complement is empty iff the ranges cover [0, MAX_CODEPOINT] without a gap
    for lo, hi in sorted(ranges):
        if lo > covered:
            return False
        covered = max(covered, hi + 1)
    return covered > MAX_CODEPOINT


def _closing(text: str, i: int, close: str, what: str) -> int:
    """Index of the unescaped `close` ending the class ('[', close ']') or string ('"') opened at text[i]."""
    j = i + 1
    while j < len(text) and text[j] != close:
        j += 2 if text[j] == "\\" else 1
    if j >= len(text):
        raise _Unknown(f"an unclosed {what}")
    return j


def _class_end(text: str, i: int) -> int:
    return _closing(text, i, "]", "character class")


def _string_end(text: str, i: int) -> int:
    return _closing(text, i, '"', "string")


class _BodyParser:
    """alt := seq ('|' seq)*;  seq := atom*;  atom := string | class | class* | name | name{m, n} | (alt) | (= alt)"""

    def __init__(self, text: str):
        self.text, self.i = text, 0

    def _skip(self) -> None:
        while self.i < len(self.text) and self.text[self.i] == " ":
            self.i += 1

    def _peek(self) -> str:
        self._skip()
        return self.text[self.i] if self.i < len(self.text) else ""

    def parse(self) -> Expr:
        expr = self.alt()
        if self._peek():
            raise _Unknown(f"unexpected {self.text[self.i:self.i + 20]!r}")
        return expr

    def alt(self) -> Expr:
        seqs = [self.seq()]
        while self._peek() == "|":
            self.i += 1
            seqs.append(self.seq())
        return seqs[0] if len(seqs) == 1 else ("alt", seqs)

    def seq(self) -> Expr:
        atoms: List[Expr] = []
        while self._peek() not in ("", "|", ")"):
            atoms.append(self.atom())
        return ("seq", atoms)

    def atom(self) -> Expr:
        t, i = self.text, self.i
        if t[i] == '"':
            self.i = _string_end(t, i) + 1
            return True
        if t[i] == "[":
            end = _class_end(t, i)
            self.i = end + 1
            if t[self.i : self.i + 1] == "*":
                self.i += 1
                return True
            try:
                return not class_is_empty(t[i + 1 : end])
            except _Unknown:
                return True  # unread: counted as non-empty, which can only keep a grammar
        if t[i] == "(":
            lookahead = t.startswith("(=", i)
            self.i = i + (2 if lookahead else 1)
            inner = self.alt()
            if self._peek() != ")":
                raise _Unknown("an unclosed group")
            self.i += 1
            return True if lookahead else inner
        m = _NAME.match(t, i)
        if m is None:
            raise _Unknown(f"element {t[i:i + 20]!r}")
        if t[m.end() : m.end() + 1] == "(":  # Regex("..."), Token(...): counted as productive, their text unread
            self.i = self._call_end(m.end())
            return True
        self.i = m.end()
        rep = _REPEAT.match(t, self.i)
        if rep is None:
            return ("ref", m.group(0), 1)
        self.i = rep.end()
        return ("ref", m.group(0), int(rep.group(1)))


    def _call_end(self, i: int) -> int:
        """Index after the ')' closing the '(' at text[i] (strings inside skipped)."""
        depth, t = 0, self.text
        while i < len(t):
            if t[i] == '"':
                i = _string_end(t, i)
            elif t[i] == "(":
                depth += 1
            elif t[i] == ")":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        raise _Unknown("an unclosed call")


def _derives(expr: Expr, productive: set, rules: Dict[str, Expr]) -> bool:
    if isinstance(expr, bool):
        return expr
    if expr[0] == "ref":
        if expr[1] not in rules:
            raise _Unknown(f"rule {expr[1]!r} is not defined")
        return expr[2] == 0 or expr[1] in productive
    parts = (_derives(e, productive, rules) for e in expr[1])
    return all(parts) if expr[0] == "seq" else any(parts)


def parse_rules(printed: str) -> Dict[str, Expr]:
    rules: Dict[str, Expr] = {}
    for line in printed.splitlines():
        if not line.strip():
            continue
        m = _RULE_LINE.match(line)
        if m is None:
            raise _Unknown(f"line {line[:40]!r}")
        rules[m.group(1)] = _BodyParser(m.group(2)).parse()
    return rules


def productive_rules(rules: Dict[str, Expr]) -> set:
    productive: set = set()
    changed = True
    while changed:
        changed = False
        for name, body in rules.items():
            if name not in productive and _derives(body, productive, rules):
                productive.add(name)
                changed = True
    return productive


def root_is_productive(printed: str, root: str = "root") -> Optional[bool]:
    """True / False: whether some finite string matches the printed grammar; None when this cannot be told."""
    try:
        rules = parse_rules(printed)
        if root not in rules:
            return None
        return root in productive_rules(rules)
    except (_Unknown, RecursionError):
        return None
