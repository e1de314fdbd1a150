"""One reply as Responses API output items, and the stream events that build them.

The chat output parser (srt/parser/chat_output.py) turns the model's text into deltas: {"reasoning_content"},
{"content"}, and per tool call a first {"tool_calls": [{id, function.name}]} then argument fragments. OutputItems
reads those deltas in order and keeps the output list OpenAI's Responses API returns:

    reasoning_content   a "reasoning" item       reasoning_text part      response.reasoning_text.delta / .done
    content             a "message" item         output_text part         response.output_text.delta / .done
    a tool call         a "function_call" item   (arguments)              response.function_call_arguments.delta / .done

A delta of another kind than the open item's closes it (content_part.done, output_item.done) and opens a new one
(output_item.added, content_part.added). The streamed and the non-streamed reply go through the same class: the
non-streamed one feeds the whole text's deltas at once and keeps only `output`, so the two cannot differ.
Events are dicts without sequence_number (the stream numbers them as it sends them).
"""

from __future__ import annotations

import uuid
from typing import Dict, List, Optional


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


PART_TYPES = {"message": "output_text", "reasoning": "reasoning_text"}
TEXT_EVENTS = {"message": "response.output_text", "reasoning": "response.reasoning_text"}


class OutputItems:
    def __init__(self):
        self.output: List[dict] = []  # every item, the open one last
        self.open: Optional[dict] = None
        self.text = ""  # the open item's text (message, reasoning) or arguments (function_call)

    @property
    def has_function_calls(self) -> bool:
        return any(item["type"] == "function_call" for item in self.output)

    def feed(self, deltas: List[dict]) -> List[dict]:
        events: List[dict] = []
        for delta in deltas:
            if "reasoning_content" in delta:
                events += self._text("reasoning", delta["reasoning_content"])
            elif "content" in delta:
                events += self._text("message", delta["content"])
            else:
                for call in delta.get("tool_calls", ()):
                    events += self._call(call)
        return events

    def close(self, status: str = "completed") -> List[dict]:
        """Close the open item with `status` ("completed", or "incomplete" when the output was cut off). A reply
        with no output at all still gets its (empty) message, as OpenAI's does."""
        events = [] if self.output else self._open("message")
        return events + self._close(status)

    # ------------------------------------------------------------------ items
    def _index(self) -> int:
        return len(self.output) - 1

    def _open(self, kind: str, call: Optional[dict] = None) -> List[dict]:
        events = self._close("completed")
        if kind == "message":
            item = {"id": new_item_id("msg"), "type": "message", "role": "assistant", "status": "in_progress",
                    "content": []}
        elif kind == "reasoning":
            item = {"id": new_item_id("rs"), "type": "reasoning", "summary": [], "content": [],
                    "status": "in_progress"}
        else:
            item = {"id": new_item_id("fc"), "type": "function_call", "call_id": call["id"],
                    "name": call["function"]["name"], "arguments": "", "status": "in_progress"}
        self.output.append(item)
        self.open, self.text = item, ""
        events.append({"type": "response.output_item.added", "output_index": self._index(), "item": dict(item)})
        if kind in PART_TYPES:
            events.append({"type": "response.content_part.added", **self._where(), "part": self._part("")})
        return events

    def _where(self) -> Dict[str, object]:
        where = {"item_id": self.open["id"], "output_index": self._index()}
        if self.open["type"] in PART_TYPES:
            where["content_index"] = 0
        return where

    def _part(self, text: str) -> dict:
        if self.open["type"] == "message":
            return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        return {"type": "reasoning_text", "text": text}

    def _text(self, kind: str, text: str) -> List[dict]:
        events = [] if self.open is not None and self.open["type"] == kind else self._open(kind)
        self.text += text
        delta = {"type": f"{TEXT_EVENTS[kind]}.delta", **self._where(), "delta": text}
        if kind == "message":
            delta["logprobs"] = []
        return events + [delta]

    def _call(self, call: dict) -> List[dict]:
        events = self._open("function_call", call) if call.get("id") is not None else []
        fragment = call.get("function", {}).get("arguments") or ""
        if fragment:
            self.text += fragment
            events.append({"type": "response.function_call_arguments.delta", **self._where(), "delta": fragment})
        return events

    def _close(self, status: str) -> List[dict]:
        item = self.open
        if item is None:
            return []
        where = self._where()
        events = []
        if item["type"] in PART_TYPES:
            part = self._part(self.text)
            done = {"type": f"{TEXT_EVENTS[item['type']]}.done", **where, "text": self.text}
            if item["type"] == "message":
                done["logprobs"] = []
            events += [done, {"type": "response.content_part.done", **where, "part": part}]
            item["content"] = [part]
        else:
            item["arguments"] = self.text
            events.append({"type": "response.function_call_arguments.done", **where, "name": item["name"],
                           "arguments": self.text})
        item["status"] = status
        events.append({"type": "response.output_item.done", "output_index": where["output_index"], "item": item})
        self.open, self.text = None, ""
        return events
