"""The SSE chunks of one streamed OpenAI response, serialised around a template made once per stream.

Every chunk of a stream repeats its id, object, created and model, and with stream_options.include_usage ends in
"usage": null; only the choice changes. Those bytes are serialised once; the chunk sent for almost every token (a
content delta: chat's {"content": text, "reasoning_content": null}, or a completion's text, without logprobs or a finish) is the template around
the token's JSON-escaped text, with no dict built and no other field serialised. Any other choice is one
orjson.dumps of the choice alone.

The bytes are exactly those of orjson.dumps over the whole chunk dict, key order included:

    {"id", "object", "created", "model", "choices": [choice], ["usage": null]}
    chat choice        {"index", "delta", "logprobs", "finish_reason"[, "matched_stop"]}
    completion choice  {"index", "text", "logprobs", "finish_reason", "matched_stop"}
    usage chunk        {"id", "object", "created", "model", "choices": [], "usage": {...}}
"""

from __future__ import annotations

from typing import Any

import orjson


class StreamChunks:
    def __init__(self, chunk_id: str, obj: str, created: int, model: str, include_usage: bool):
        head = orjson.dumps({"id": chunk_id, "object": obj, "created": created, "model": model})
        self.head = b"data: " + head[:-1] + b',"choices":['  # the object without its closing brace
        self.tail = b'],"usage":null}\n\n' if include_usage else b"]}\n\n"
        self.index_bytes: dict = {}

    def _index(self, index: int) -> bytes:
        b = self.index_bytes.get(index)
        if b is None:
            b = self.index_bytes[index] = str(index).encode()
        return b

    def choice(self, choice: Any) -> bytes:
        """A chunk carrying one choice, given as the dict it serialises."""
        return b"".join((self.head, orjson.dumps(choice), self.tail))

    def chat_content(self, index: int, text: str) -> bytes:
        """== choice({"index": index, "delta": {"content": text, "reasoning_content": None}, "logprobs": None,
        "finish_reason": None})."""
        return b"".join((self.head, b'{"index":', self._index(index), b',"delta":{"content":', orjson.dumps(text),
                         b',"reasoning_content":null},"logprobs":null,"finish_reason":null}', self.tail))

    def completion_text(self, index: int, text: str) -> bytes:
        """== choice({"index": index, "text": text, "logprobs": None, "finish_reason": None, "matched_stop": None})."""
        return b"".join((self.head, b'{"index":', self._index(index), b',"text":', orjson.dumps(text),
                         b',"logprobs":null,"finish_reason":null,"matched_stop":null}', self.tail))

    def usage(self, usage: dict) -> bytes:
        """The last chunk with stream_options.include_usage: no choices, the usage."""
        return b"".join((self.head, b'],"usage":', orjson.dumps(usage), b"}\n\n"))
