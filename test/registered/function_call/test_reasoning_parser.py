"""Reasoning parsers on recorded model-style outputs: the split into (reasoning_content, content) against hand-written
expectations, every stream split against that split, and reasoning + tool calls through one ChatOutputParser."""

import pytest

from sglang.srt.function_call.detectors import make_detector
from sglang.srt.function_call.tool_call_stream import ToolCallStream
from sglang.srt.parser.chat_output import ChatOutputParser, finish_reason_with_calls
from sglang.srt.parser.reasoning_parser import REASONING_PARSERS, ReasoningParser
from sglang.srt.parser.reasoning_tokens import count_reasoning_tokens
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=3, suite="cpu")

CASES = [
    # DeepSeek-R1: the template opened <think>, so the output starts inside it
    ("deepseek-r1", "Okay, the user wants 2+2.\nThat is 4.\n</think>\n\nThe answer is **4**.",
     "Okay, the user wants 2+2.\nThat is 4.", "The answer is **4**."),
    ("deepseek-r1", "<think>\nFirst, recall < and > signs.\n</think>\n\nUse `a < b`.",
     "First, recall < and > signs.", "Use `a < b`."),
    ("deepseek-r1", "Still thinking when max_tokens hit  \n", "Still thinking when max_tokens hit", ""),
    ("deepseek-r1", "</think>Straight to the answer.", "", "Straight to the answer."),
    ("qwen3-thinking", "Let me think about </thin and more.\n</think>\n\nDone.", "Let me think about </thin and more.",
     "Done."),
    # Qwen3 (hybrid): reasoning only when the output opens the block
    ("qwen3", "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?", "The user greets me.",
     "Hello! How can I help?"),
    ("qwen3", "<think>\n\n</think>\n\nNo thoughts (enable_thinking=false).", "",
     "No thoughts (enable_thinking=false)."),
    ("qwen3", "Plain answer that mentions <think> later.", "", "Plain answer that mentions <think> later."),
    ("qwen3", "<thinking> is not the tag", "", "<thinking> is not the tag"),
]


@pytest.mark.parametrize("name,text,reasoning,content", CASES)
def test_split(name, text, reasoning, content):
    assert ReasoningParser(name).split(text) == (reasoning, content)


@pytest.mark.parametrize("name,text,reasoning,content", CASES)
def test_every_stream_split_adds_up_to_the_split(name, text, reasoning, content):
    for a in range(len(text) + 1):
        for b in range(a, len(text) + 1):
            p, r, c = ReasoningParser(name), "", ""
            for k, piece in enumerate((text[:a], text[a:b], text[b:])):
                dr, dc = p.feed(piece, final=k == 2)
                r, c = r + dr, c + dc
            assert (r, c) == (reasoning, content), (a, b)


def test_unknown_parser_is_refused():
    with pytest.raises(ValueError, match="deepseek-r1"):
        ReasoningParser("nope")
    assert {"deepseek-r1", "qwen3"} <= set(REASONING_PARSERS)


THINK_THEN_CALL = ("The user wants the weather; call the tool.\n</think>\n\n<tool_call>\n"
                   '{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')


def chat_parser(stream_reasoning=True):
    return ChatOutputParser(ReasoningParser("deepseek-r1"), ToolCallStream(make_detector("qwen25"), {"get_weather"}),
                            stream_reasoning=stream_reasoning)


def test_reasoning_then_tool_call_message():
    p = chat_parser()
    msg = p.message(THINK_THEN_CALL)
    assert msg["reasoning_content"] == "The user wants the weather; call the tool."
    assert msg["content"] is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]] == [
        ("get_weather", '{"city": "Oslo"}')]
    assert finish_reason_with_calls("stop", p) == "tool_calls" and finish_reason_with_calls("length", p) == "length"


@pytest.mark.parametrize("stream_reasoning", [True, False])
def test_reasoning_then_tool_call_stream(stream_reasoning):
    ref = chat_parser().message(THINK_THEN_CALL)
    for cut in range(len(THINK_THEN_CALL) + 1):
        p = chat_parser(stream_reasoning)
        deltas = p.feed(THINK_THEN_CALL[:cut], False) + p.feed(THINK_THEN_CALL[cut:], True)
        reasoning = [d["reasoning_content"] for d in deltas if "reasoning_content" in d]
        assert "".join(reasoning) == ref["reasoning_content"]
        if not stream_reasoning:
            assert len(reasoning) == 1  # in one piece, once the thoughts ended
        assert not any("content" in d for d in deltas)
        args = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas if "tool_calls" in d)
        assert args == ref["tool_calls"][0]["function"]["arguments"]
        # the order a client sees: all reasoning before the first call delta
        kinds = [next(iter(d)) for d in deltas]
        assert kinds.index("tool_calls") > max(i for i, k in enumerate(kinds) if k == "reasoning_content")


def test_no_parsers_is_plain_content():
    p = ChatOutputParser()
    assert p.feed("<think>x</think>", False) == [{"content": "<think>x</think>"}]
    assert ChatOutputParser().message("<tool_call>") == {"role": "assistant", "content": "<tool_call>",
                                                         "reasoning_content": None}  # always there, as upstream


@pytest.mark.parametrize("name, text, want", [
    ("qwen3", "<think>\nab</think>\n\nanswer", len("<think>\nab</think>")),  # through the tag's last token
    ("qwen3", "plain answer", 0),  # qwen3 reads reasoning only after an opening <think>
    ("qwen3", "<think>never ends", len("<think>never ends")),  # cut off inside: all reasoning
    ("deepseek-r1", "thoughts</think>answer", len("thoughts</think>")),  # the template opened the block
    ("deepseek-r1", "", 0),
])
def test_reasoning_token_count(name, text, want):
    # one "token" per character: the reference is where the tag ends in the text
    assert count_reasoning_tokens(name, list(range(len(text))), lambda ids: "".join(text[i] for i in ids)) == want
    # two characters per token: the token holding the tag's last character ends the reasoning
    pairs = [text[i:i + 2] for i in range(0, len(text), 2)]
    assert count_reasoning_tokens(name, list(range(len(pairs))), lambda ids: "".join(pairs[i] for i in ids)) == (
        -(-want // 2))


def test_upstream_detector_attributes():
    # upstream code reads the tags as ReasoningParser(name).detector.think_end_token
    for name, forced in (("deepseek-r1", True), ("qwen3", False)):
        d = ReasoningParser(name).detector
        assert (d.think_start_token, d.think_end_token, d.force_reasoning) == ("<think>", "</think>", forced)
        want = ("a", "b") if forced else ("", f"a{d.think_end_token}b")
        assert ReasoningParser(name).split(f"a{d.think_end_token}b") == want
