"""One choice's output -> content and OpenAI `tool_calls`, fed as it arrives.

`feed(text, final)` returns what may be sent now: a content delta and tool-call deltas, OpenAI's shapes --
first {"index", "id", "type": "function", "function": {"name", "arguments": ""}} once a call's name is known, then
{"index", "function": {"arguments": <fragment>}} as its arguments arrive. The non-streamed response feeds the whole
text once with final=True; since every parse only commits what later text cannot change, the deltas of a stream
add up to exactly that response. Calls to functions that were not offered are dropped (logged).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Collection, List, Optional, Tuple

from sglang.srt.function_call.base_format_detector import BaseFormatDetector

logger = logging.getLogger(__name__)


def new_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class _SentCall:
    index: Optional[int]  # index in the response's tool_calls; None: dropped (unknown function)
    id: str
    name: str
    arguments: str = ""


class ToolCallStream:
    def __init__(self, detector: BaseFormatDetector, function_names: Collection[str], forced: bool = False):
        """forced: a grammar made the whole output a tool-call section (tool_choice required or named)."""
        self.detector = detector
        self.names = frozenset(function_names)
        self.forced = forced
        self.text = ""
        self.pos = 0  # text[:pos] is settled
        self.settled_content_chars = 0
        self.settled_calls = 0
        self.sent_content_chars = 0
        self.calls: List[_SentCall] = []  # per parsed call, in order
        self.num_tool_calls = 0

    def feed(self, text: str, final: bool) -> Tuple[str, List[dict]]:
        self.text += text
        st = self.detector.parse(self.text, self.pos, final, self.forced)
        content_delta = st.content[self.sent_content_chars - self.settled_content_chars:]
        self.sent_content_chars = self.settled_content_chars + len(st.content)
        deltas: List[dict] = []
        for k, call in enumerate(st.calls):
            g = self.settled_calls + k
            if call.name is None:
                break  # only the call still arriving can lack its name
            if g == len(self.calls):
                self.calls.append(self._start_call(call.name))
                sent = self.calls[g]
                if sent.index is not None:
                    deltas.append({"index": sent.index, "id": sent.id, "type": "function",
                                   "function": {"name": sent.name, "arguments": ""}})
            sent = self.calls[g]
            if sent.index is not None and len(call.arguments) > len(sent.arguments):
                fragment = call.arguments[len(sent.arguments):]
                if call.arguments.startswith(sent.arguments):
                    deltas.append({"index": sent.index, "function": {"arguments": fragment}})
                sent.arguments = call.arguments
        self.pos = st.settled_pos
        self.settled_content_chars += st.settled_content
        self.settled_calls += st.settled_calls
        return content_delta, deltas

    def _start_call(self, name: str) -> _SentCall:
        if name not in self.names:
            logger.warning("The model called function %r, which the request did not offer; the call is dropped.", name)
            return _SentCall(None, "", name)
        self.num_tool_calls += 1
        return _SentCall(self.num_tool_calls - 1, new_tool_call_id(), name)

    def tool_calls(self) -> List[dict]:
        """The calls so far as a message's `tool_calls`."""
        return [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in self.calls if c.index is not None
        ]


def parse_tool_calls(
    detector: BaseFormatDetector, text: str, function_names: Collection[str], forced: bool = False
) -> Tuple[str, List[dict]]:
    """A complete output -> (content, tool_calls)."""
    stream = ToolCallStream(detector, function_names, forced)
    content, _ = stream.feed(text, final=True)
    return content, stream.tool_calls()
