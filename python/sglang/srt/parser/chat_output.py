"""One chat choice's output text -> the assistant message's reasoning_content, content and tool_calls.

The text goes through the reasoning parser first (thoughts out), then the tool-call parser (calls out of what is
left). Streaming and non-streaming share the code: `feed` returns the deltas that may be sent now, in the order
they should be sent; `message` is the same parse over the whole text.
"""

from __future__ import annotations

from typing import List, Optional

from sglang.srt.function_call.tool_call_stream import ToolCallStream
from sglang.srt.parser.reasoning_parser import ReasoningParser


class ChatOutputParser:
    def __init__(
        self,
        reasoning: Optional[ReasoningParser] = None,
        tools: Optional[ToolCallStream] = None,
        stream_reasoning: bool = True,
    ):
        """stream_reasoning=False: the reasoning goes out in one delta, when it has ended (upstream's switch)."""
        self.reasoning = reasoning
        self.tools = tools
        self.stream_reasoning = stream_reasoning
        self.held_reasoning = ""

    @property
    def active(self) -> bool:
        return self.reasoning is not None or self.tools is not None

    @property
    def has_tool_calls(self) -> bool:
        return self.tools is not None and self.tools.num_tool_calls > 0

    def feed(self, text: str, final: bool) -> List[dict]:
        """Deltas ({"reasoning_content"}, {"content"}, {"tool_calls": [one]}) for the next text of the output."""
        deltas: List[dict] = []
        reasoning, content = self.reasoning.feed(text, final) if self.reasoning is not None else ("", text)
        calls: List[dict] = []
        if self.tools is not None:
            content, calls = self.tools.feed(content, final)
        if not self.stream_reasoning:
            self.held_reasoning += reasoning
            ended = final or bool(content or calls)
            reasoning, self.held_reasoning = (self.held_reasoning, "") if ended else ("", self.held_reasoning)
        if reasoning:
            deltas.append({"reasoning_content": reasoning})
        if content:
            deltas.append({"content": content})
        deltas.extend({"tool_calls": [call]} for call in calls)
        return deltas

    def message(self, text: str) -> dict:
        """The non-streamed assistant message for the whole output."""
        parts = {"reasoning_content": [], "content": []}
        for delta in self.feed(text, final=True):
            for key in parts:
                if key in delta:
                    parts[key].append(delta[key])
        msg = {"role": "assistant", "content": "".join(parts["content"])}
        if self.tools is not None and self.has_tool_calls:
            msg["tool_calls"] = self.tools.tool_calls()
            msg["content"] = msg["content"] or None
        # always present, null when there is none (as upstream), so clients may read message.reasoning_content
        msg["reasoning_content"] = "".join(parts["reasoning_content"]) or None
        return msg


def finish_reason_with_calls(finish_reason: Optional[str], parser: ChatOutputParser) -> Optional[str]:
    """OpenAI reports a reply that ends in tool calls as finish_reason "tool_calls"."""
    return "tool_calls" if finish_reason == "stop" and parser.has_tool_calls else finish_reason
