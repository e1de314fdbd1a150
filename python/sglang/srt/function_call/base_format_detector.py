"""The shape every supported tool-call format shares, and one scanner for all of them.

A model that calls tools writes free text (the message content) and, somewhere, a tool-call section:

    section := start? ws ("[" ws)? call (ws separator ws call)* (ws "]")? (ws end)?  ("[" "]" when `array`)
    call    := call_begin ws OBJECT ws call_end
    OBJECT  := {"name": "<function>", "arguments" | "parameters": {...}}        (keys in any order)
    call    := call_begin NAME name_end ws ARGUMENTS ws call_end                 (when `name_end` is set: the
                                                                                  name outside, DeepSeek V3)

A format (one subclass per model family) fills in the literals. `parse(text, final)` reads a whole output, or a
prefix of one that is still arriving (`final=False`): it then commits only what no later text can change -- content
that cannot be the start of a marker, a call's name once its string is closed, its arguments as far as they go --
so the deltas between successive parses are exactly what a stream may send, and the last parse equals the
non-streamed one. Arguments are kept as the model wrote them (raw JSON text), which is what OpenAI's `arguments`
string carries. A section that stops being well-formed ends there; what follows is content again.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from sglang.srt.function_call.json_scan import INCOMPLETE, INVALID, scan_object, skip_ws

ARGUMENT_KEYS = ("arguments", "parameters")
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # a function name written outside JSON (tool_types.py, and dots)
_WAIT = -1  # the scanner needs more text to decide


@dataclass
class ParsedCall:
    name: Optional[str]  # None until the name's string has closed
    arguments: str  # raw JSON text of the arguments, as far as it has arrived


@dataclass
class ParseState:
    content: str = ""
    calls: List[ParsedCall] = field(default_factory=list)
    # text[:settled_pos] is final: it produced content[:settled_content] and calls[:settled_calls]; a stream resumes
    # parsing there (in content mode) instead of rereading the whole output
    settled_pos: int = 0
    settled_content: int = 0
    settled_calls: int = 0


def held_prefix(text: str, start: int, marker: str) -> int:
    """How many characters at the end of text[start:] could be the beginning of `marker` (held back)."""
    for k in range(min(len(marker) - 1, len(text) - start), 0, -1):
        if marker.startswith(text[len(text) - k:]):
            return k
    return 0


class BaseFormatDetector:
    name = ""
    start = ""  # opens the section ("" : each call_begin opens one)
    call_begin = ""
    call_end = ""
    separator = ""  # between calls ("" : whitespace only)
    array = False  # the calls are the elements of a JSON array
    bare_json_start = False  # an output whose first non-blank character is '{' is a section
    end = ""  # closes the section after its last call ("" : none; optional in a cut-off output)
    name_end = ""  # set: the call is call_begin NAME name_end {arguments} (the name is not in the object)
    supports_grammar = True  # tool_choice required / named can be enforced with a grammar in this format
    # what the grammar of tool_choice="required"/named makes the model write (see grammar.py)
    grammar_start = ""  # the start marker as the grammar writes it ("" : the parser reads the section without it)
    grammar_arguments_key = "arguments"
    grammar_call_prefix = ""  # before {"name": ...
    grammar_call_suffix = ""  # after the arguments' closing } and the object's }
    grammar_separator = "\n"
    grammar_end = ""  # written after the last call

    def grammar_call_begin(self, name: str) -> str:
        """What the grammar writes before a call's arguments object."""
        if self.name_end:
            return f"{self.grammar_call_prefix}{name}{self.name_end}"
        return f'{self.grammar_call_prefix}{{"name": {json.dumps(name)}, "{self.grammar_arguments_key}": '

    def grammar_call_end(self) -> str:
        """... and after it."""
        return ("" if self.name_end else "}") + self.grammar_call_suffix

    def grammar_head(self, write_markers: bool) -> str:
        """Before the first call. write_markers: the section's markers are ordinary text for this tokenizer (a
        special token cannot be matched by a grammar; the parser then reads the section without them)."""
        return (self.grammar_start if write_markers else "") + ("[" if self.array else "")

    def grammar_tail(self, write_markers: bool) -> str:
        """After the last call."""
        return ("]" if self.array else "") + (self.grammar_end if write_markers else "")

    @property
    def trigger(self) -> str:
        return self.start or self.call_begin

    # ------------------------------------------------------------------ parsing
    def parse(self, text: str, pos: int = 0, final: bool = True, forced: bool = False) -> ParseState:
        """Parse text[pos:] (pos: a previous parse's settled_pos). `forced`: the output is known to be a tool-call
        section from its first character (a grammar made it one), start marker optional."""
        st = ParseState(settled_pos=pos)
        content: List[str] = []
        n = len(text)
        i = pos
        section_at: Optional[int] = None
        if pos == 0:
            lead = skip_ws(text, 0)
            if forced or (self.bare_json_start and lead < n and text[lead] == "{"):
                section_at = lead
            elif self.bare_json_start and lead == n and not final:
                return st  # only blanks so far: a bare JSON call may still follow
        while True:
            if section_at is None:
                t = text.find(self.trigger, i)
                if t < 0:
                    end = n if final else n - held_prefix(text, i, self.trigger)
                    content.append(text[i:end])
                    self._settle(st, end, content)
                    break
                content.append(text[i:t])
                section_at = t
                self._settle(st, t, content)
            optional_start = pos == 0 and section_at == skip_ws(text, 0) and (forced or self.bare_json_start)
            status, resume, raw = self._scan_section(text, section_at, final, st.calls, optional_start)
            section_at = None
            if status == _WAIT:
                break
            content.append(raw)
            i = resume
            self._settle(st, i, content)
            if i >= n:
                break
        st.content = "".join(content)
        return st

    @staticmethod
    def _settle(st: ParseState, pos: int, content: List[str]) -> None:
        st.settled_pos, st.settled_content, st.settled_calls = pos, sum(map(len, content)), len(st.calls)

    def _scan_section(
        self, text: str, i: int, final: bool, calls: List[ParsedCall], optional_start: bool
    ) -> Tuple[int, int, str]:
        """Scan the section at text[i]. Returns (status, resume, raw): status _WAIT (more text needed) or 0, with
        `resume` where content mode continues and `raw` the text that turned out not to be calls (-> content)."""
        n, section_start = len(text), i

        def expect(literal: str, at: int) -> int:
            """Index after `literal` at text[at], _WAIT, or INVALID."""
            if text.startswith(literal, at):
                return at + len(literal)
            if not final and at + len(literal) > n and literal.startswith(text[at:]):
                return _WAIT
            return INVALID

        if self.start:
            j = expect(self.start, i)
            if j == _WAIT or (j == INVALID and not optional_start):
                return (_WAIT, i, "") if j == _WAIT else (0, i + 1, text[i:i + 1])
            i = i if j == INVALID else j
        if self.array:
            i = skip_ws(text, i)
            if i >= n and not final:
                return _WAIT, i, ""
            if i >= n or text[i] != "[":
                return 0, i, text[section_start:i]
            i += 1
        while True:
            i = skip_ws(text, i)
            call_start = i
            j = expect(self.call_begin, i) if self.call_begin else i
            if j == _WAIT:
                return _WAIT, i, ""
            if j == INVALID:
                return 0, max(i, section_start + 1), text[section_start:max(i, section_start + 1)]
            outside_name = None
            if self.name_end:
                status, j, outside_name = self._outside_name(text, j, final)
                if status == _WAIT:
                    return _WAIT, call_start, ""
                if status == INVALID:  # not a call after all: text, as far as it went
                    return 0, j, text[call_start:j]
            i = skip_ws(text, j)
            if i >= n:
                if final and outside_name is None:
                    return 0, n, text[call_start:]
                if final:  # cut off after the name: the call, without arguments
                    calls.append(ParsedCall(outside_name, ""))
                    return 0, n, ""
                return _WAIT, i, ""
            if text[i] != "{":
                return 0, i, text[call_start:i]
            scan = scan_object(text, i)
            if outside_name is not None:  # the object is the arguments
                name, args = outside_name, text[i:(n if scan.end in (INCOMPLETE, INVALID) else scan.end)]
                if scan.end == INVALID:
                    args = text[i:scan.error_at]
            else:
                name = self._name(text, scan.members.get("name"))
                args = ""
                for key in ARGUMENT_KEYS:
                    if key in scan.members:
                        vs, ve = scan.members[key]
                        args = text[vs:(n if ve == INCOMPLETE else ve)]
                        break
            if scan.end == INVALID or (scan.end >= 0 and name is None):
                if name is None:  # nothing of it was sent: it is text
                    at = scan.error_at if scan.end == INVALID else scan.end
                    return 0, at, text[call_start:at]
                calls.append(ParsedCall(name, args))
                return 0, scan.error_at, ""
            calls.append(ParsedCall(name, args))
            if scan.end == INCOMPLETE:
                if not final:
                    return _WAIT, i, ""
                if name is None:  # cut off before its name: text
                    calls.pop()
                    return 0, n, text[call_start:]
                return 0, n, ""  # cut off (max_tokens): the call keeps what arrived
            i = skip_ws(text, scan.end)
            if self.call_end:
                j = expect(self.call_end, i)
                if j == _WAIT or (j == INVALID and i >= n and not final):
                    return _WAIT, i, ""
                if j == INVALID and final and self.call_end.startswith(text[i:]):
                    return 0, n, ""  # cut off inside the end marker (max_tokens): the call is whole
                if j == INVALID:
                    return 0, i, ""
                i = j
            j = skip_ws(text, i)
            if j >= n:
                return (0, n, "") if final else (_WAIT, j, "")
            if self.array and text[j] == "]":
                k = skip_ws(text, j + 1)
                if self.end and (k < n or not final):
                    e = expect(self.end, k)
                    if e == _WAIT:
                        return _WAIT, k, ""
                    k = k if e == INVALID else e
                return (_WAIT, k, "") if k >= n and not final else (0, k, "")
            if self.end:
                e = expect(self.end, j)
                if e == _WAIT:
                    return _WAIT, j, ""
                if e != INVALID:
                    return 0, e, ""
            nxt = self.separator or self.call_begin
            k = expect(nxt, j)
            if k == _WAIT:
                return _WAIT, j, ""
            if k == INVALID:
                return 0, j, ""
            i = k if self.separator else j

    def _outside_name(self, text: str, j: int, final: bool) -> Tuple[int, int, Optional[str]]:
        """The function name at text[j] up to name_end: (0, index after name_end, name), (_WAIT, j, None) while it
        may still arrive, or (INVALID, where it failed, None)."""
        k = text.find(self.name_end, j)
        if k >= 0:
            ok = _NAME.fullmatch(text, j, k) is not None
            return (0, k + len(self.name_end), text[j:k]) if ok else (INVALID, j, None)
        m = _NAME.match(text, j)
        stop = m.end() if m else j
        if not final and (stop == len(text) or self.name_end.startswith(text[stop:])):
            return _WAIT, j, None
        return INVALID, stop, None

    @staticmethod
    def _name(text: str, span: Optional[Tuple[int, int]]) -> Optional[str]:
        if span is None or span[1] < 0:
            return None
        try:
            name = json.loads(text[span[0]:span[1]])
        except ValueError:
            return None
        return name if isinstance(name, str) else None
