"""StreamChunks (the per-stream SSE template) against the chunk dicts it replaces: byte for byte the same as
orjson.dumps of the whole chunk, and the same object when the real `openai` client's pydantic models parse it."""

import json

import orjson
import pytest
from openai._models import construct_type
from openai.types import Completion
from openai.types.chat import ChatCompletionChunk

from sglang.srt.entrypoints.openai.sse_chunks import StreamChunks
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="cpu")

TEXTS = ["Hello", " world", "", 'quote " backslash \\ slash /', "tab\tnewline\n\r\x00\x1f\x7f", "naïve 東京 🚀",
         "\u2028\u2029 separators", "</script><!--"]
HEAD = {"id": "chatcmpl-0123abcd", "created": 1764100000, "model": "SmolLM2-135M-Instruct"}


def reference(obj: str, choices: list, usage_key: bool, usage=None) -> bytes:
    """The chunk as the serving code built it before: a dict, one orjson.dumps."""
    c = {"id": HEAD["id"], "object": obj, "created": HEAD["created"], "model": HEAD["model"], "choices": choices}
    if usage_key:
        c["usage"] = usage
    return b"data: " + orjson.dumps(c) + b"\n\n"


def payload(chunk: bytes) -> str:
    assert chunk.startswith(b"data: ") and chunk.endswith(b"\n\n")
    return chunk[6:-2].decode()


@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_chunks_are_the_dicts_bytes(include_usage):
    w = StreamChunks(HEAD["id"], "chat.completion.chunk", HEAD["created"], HEAD["model"], include_usage)
    for i in (0, 3, 12):
        for text in TEXTS:
            choice = {"index": i, "delta": {"content": text, "reasoning_content": None}, "logprobs": None,
                      "finish_reason": None}
            want = reference("chat.completion.chunk", [choice], include_usage)
            got = w.chat_content(i, text)
            assert got == want
            parsed = ChatCompletionChunk.model_validate_json(payload(got))
            assert parsed.choices[0].delta.content == text and parsed.choices[0].index == i
            assert parsed.choices[0].delta.reasoning_content is None  # an attribute, as upstream's clients read it
            assert parsed.model_dump(mode="json", exclude_unset=True) == json.loads(payload(want))
        others = [
            {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None},
            {"index": i, "delta": {"reasoning_content": "hmm"}, "logprobs": None, "finish_reason": None},
            {"index": i, "delta": {"content": "a"}, "logprobs": {"content": [
                {"token": "a", "logprob": -0.25, "bytes": [97], "top_logprobs": []}]}, "finish_reason": None},
            {"index": i, "delta": {}, "logprobs": None, "finish_reason": "stop", "matched_stop": 2},
            {"index": i, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                   "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
             "logprobs": None, "finish_reason": None},
        ]
        for choice in others:
            got = w.choice(choice)
            assert got == reference("chat.completion.chunk", [choice], include_usage)
            ChatCompletionChunk.model_validate_json(payload(got))
    usage = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12,
             "prompt_tokens_details": {"cached_tokens": 1}}
    got = w.usage(usage)
    assert got == reference("chat.completion.chunk", [], True, usage)
    assert ChatCompletionChunk.model_validate_json(payload(got)).usage.total_tokens == 12


@pytest.mark.parametrize("include_usage", [False, True])
def test_completion_chunks_are_the_dicts_bytes(include_usage):
    w = StreamChunks("cmpl-1", "text_completion", HEAD["created"], HEAD["model"], include_usage)
    for i in (0, 1, 10):
        for text in TEXTS:
            choice = {"index": i, "text": text, "logprobs": None, "finish_reason": None, "matched_stop": None}
            c = {"id": "cmpl-1", "object": "text_completion", "created": HEAD["created"], "model": HEAD["model"],
                 "choices": [choice]}
            if include_usage:
                c["usage"] = None
            want = b"data: " + orjson.dumps(c) + b"\n\n"
            got = w.completion_text(i, text)
            assert got == want
            # how the client reads a streamed completion chunk (its finish_reason type has no null, so no validation)
            parsed = construct_type(type_=Completion, value=json.loads(payload(got)))
            assert isinstance(parsed, Completion) and parsed.choices[0].text == text and parsed.choices[0].index == i
            assert parsed.model_dump(mode="json", exclude_unset=True) == json.loads(payload(want))
