"""Tool-call parsers on recorded model-style outputs: the non-streamed parse against hand-written expectations, and
the text split into stream chunks at every position (in two; in three with a short middle chunk; one character at
a time) against that parse: the content
deltas and the tool_calls deltas must add up to exactly the non-streamed message. The grammar of
tool_choice="required"/named must accept what each parser reads, and only that."""

import json

import pytest
import xgrammar
from xgrammar.testing import _is_grammar_accept_string

from sglang.srt.function_call.detectors import TOOL_CALL_PARSERS, make_detector
from sglang.srt.function_call.grammar import tool_call_ebnf
from sglang.srt.function_call.json_scan import INCOMPLETE, INVALID, value_end
from sglang.srt.function_call.tool_call_stream import ToolCallStream, parse_tool_calls
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="cpu")

NAMES = {"get_weather", "get_time", "search"}
WEATHER = '{"location": "Paris, France", "unit": "celsius"}'
NESTED = '{"query": "caf\\u00e9 \\"best\\" {x}", "filters": {"tags": ["a", "b]"], "limit": 5, "exact": false}}'

DS_BEGIN, DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>"


def ds_call(name, args):
    return f"{DS_CALL}{name}\n```json\n{args}\n```<｜tool▁call▁end｜>"


# (parser, model output, expected content, expected [(name, arguments)])
CASES = [
    # Qwen2.5 / Qwen3 (hermes): one <tool_call> block per call, text before them is content
    ("qwen25", f'<tool_call>\n{{"name": "get_weather", "arguments": {WEATHER}}}\n</tool_call>', "",
     [("get_weather", WEATHER)]),
    ("qwen25", f'I will look that up.\n<tool_call>\n{{"name": "get_weather", "arguments": {WEATHER}}}\n</tool_call>\n'
               f'<tool_call>\n{{"name": "search", "arguments": {NESTED}}}\n</tool_call>',
     "I will look that up.\n", [("get_weather", WEATHER), ("search", NESTED)]),
    ("qwen3", '<tool_call>\n{"arguments": {"tz": "UTC"}, "name": "get_time"}\n</tool_call>\nChecking the clock.',
     "Checking the clock.", [("get_time", '{"tz": "UTC"}')]),
    ("qwen25", "The <tool_ tag is only text here, 2 < 3.", "The <tool_ tag is only text here, 2 < 3.", []),
    ("qwen25", '<tool_call>\nnot json\n</tool_call>', "<tool_call>\nnot json\n</tool_call>", []),
    # a call to a function that was not offered is dropped
    ("qwen25", '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>', "", []),
    # cut off by max_tokens: the call keeps what arrived
    ("qwen25", '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Par', "",
     [("get_weather", '{"location": "Par')]),
    ("qwen25", '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_c', "", [("get_weather", "{}")]),
    # Llama 3.x: bare JSON with "parameters", or after <|python_tag|>; ";" between calls
    ("llama3", f'{{"name": "get_weather", "parameters": {WEATHER}}}', "", [("get_weather", WEATHER)]),
    ("llama3", f'<|python_tag|>{{"name": "get_weather", "parameters": {WEATHER}}}; '
               '{"name": "get_time", "parameters": {"tz": "CET"}}', "",
     [("get_weather", WEATHER), ("get_time", '{"tz": "CET"}')]),
    ("llama3", 'The JSON {"name": "get_time"} is just an example.', 'The JSON {"name": "get_time"} is just an example.',
     []),
    ("llama3", "  \n", "  \n", []),
    # Mistral: [TOOL_CALLS] then a JSON array of calls
    ("mistral", f'[TOOL_CALLS] [{{"name": "get_weather", "arguments": {WEATHER}}}, '
                f'{{"name": "search", "arguments": {NESTED}}}]', "",
     [("get_weather", WEATHER), ("search", NESTED)]),
    ("mistral", 'Sure.[TOOL_CALLS][{"name": "get_time", "arguments": {}}]', "Sure.", [("get_time", "{}")]),
    ("mistral", "[TOOL_CALLS is not the marker", "[TOOL_CALLS is not the marker", []),
    # DeepSeek V3: the name outside the JSON, the arguments in a json fence, newline between calls
    ("deepseekv3", f"I'll check.{DS_BEGIN}{ds_call('get_weather', WEATHER)}\n{ds_call('search', NESTED)}{DS_END}",
     "I'll check.", [("get_weather", WEATHER), ("search", NESTED)]),
    ("deepseekv3", f"{DS_BEGIN}{ds_call('get_time', '{}')}{DS_END}\nDone.", "\nDone.", [("get_time", "{}")]),
    ("deepseekv3", f"{DS_BEGIN}{DS_CALL}get weather\n```json\n{{}}", f"{DS_CALL}get weather\n```json\n{{}}", []),
    ("deepseekv3", f"{DS_BEGIN}{DS_CALL}get_weather\n```json\n{{\"location\": \"Os", "",
     [("get_weather", '{"location": "Os')]),  # cut off by max_tokens
    ("deepseekv3", "A <｜tool▁call is not a marker.", "A <｜tool▁call is not a marker.", []),
    # pythonic: a Python list of keyword calls anywhere in the text, read with ast (never evaluated)
    ("pythonic", '[get_weather(location="Paris, France", unit=\'celsius\'), get_time(tz="UTC")]', "",
     [("get_weather", WEATHER), ("get_time", '{"tz": "UTC"}')]),
    ("pythonic", 'Searching [x] first: [search(query="a]b(", filters={"tags": ["a", (1, 2)], "exact": True}, '
                 'limit=-5, note=None, ok=false)] now.',
     "Searching [x] first:  now.",
     [("search", '{"query": "a]b(", "filters": {"tags": ["a", [1, 2]], "exact": true}, "limit": -5, '
                 '"note": null, "ok": false}')]),
    ("pythonic", "[1, 2] and [get_time(tz=__import__('os').name)] and [get_time(", 
     "[1, 2] and [get_time(tz=__import__('os').name)] and [get_time(", []),
    ("pythonic", "[get_time('UTC')] [get_time(**kw)] [get_time(tz={1, 2})]",
     "[get_time('UTC')] [get_time(**kw)] [get_time(tz={1, 2})]", []),
]


def assembled(deltas):
    """OpenAI client-side accumulation of tool_calls deltas."""
    calls = {}
    for d in deltas:
        if "id" in d:
            assert d["index"] not in calls and d["type"] == "function" and d["function"]["arguments"] == ""
            assert d["id"].startswith("call_")
            calls[d["index"]] = [d["function"]["name"], ""]
        else:
            assert set(d) == {"index", "function"} and set(d["function"]) == {"arguments"}
            calls[d["index"]][1] += d["function"]["arguments"]
    assert sorted(calls) == list(range(len(calls)))
    return [tuple(calls[k]) for k in sorted(calls)]


def stream(fmt, pieces):
    s = ToolCallStream(make_detector(fmt), NAMES)
    content, deltas = "", []
    for k, piece in enumerate(pieces):
        c, d = s.feed(piece, final=k == len(pieces) - 1)
        content += c
        deltas += d
    return content, assembled(deltas)


@pytest.mark.parametrize("fmt,text,content,calls", CASES)
def test_parse_complete_output(fmt, text, content, calls):
    got_content, got_calls = parse_tool_calls(make_detector(fmt), text, NAMES)
    assert got_content == content
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in got_calls] == calls
    for c in got_calls:
        if not text.endswith(("Par", "</tool_c", '"Os')):
            json.loads(c["function"]["arguments"])  # arguments are the model's JSON text


@pytest.mark.parametrize("fmt,text,content,calls", CASES)
def test_every_stream_split_adds_up_to_the_parse(fmt, text, content, calls):
    for a in range(len(text) + 1):  # every cut in two, and every short middle chunk (markers split 3 ways)
        for b in range(a, min(a + 12, len(text) + 1)):
            assert stream(fmt, [text[:a], text[a:b], text[b:]]) == (content, calls), (a, b)
    assert stream(fmt, list(text)) == (content, calls)


def test_name_goes_out_before_arguments_and_arguments_stream():
    s = ToolCallStream(make_detector("qwen25"), NAMES)
    assert s.feed('<tool_call>\n{"name": "get_weath', False) == ("", [])
    content, deltas = s.feed('er", "arguments": {"loc', False)
    assert deltas[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert deltas[1] == {"index": 0, "function": {"arguments": '{"loc'}}
    last = s.feed('ation": "Rome"}}\n</tool_call>', True)[1]
    assert last == [{"index": 0, "function": {"arguments": 'ation": "Rome"}'}}]


def test_forced_section_reads_without_the_start_marker():
    # a grammar-forced Mistral section when [TOOL_CALLS] is a special token (stripped from the text)
    content, calls = parse_tool_calls(make_detector("mistral"), '[{"name": "get_time", "arguments": {}}]', NAMES,
                                      forced=True)
    assert content == "" and calls[0]["function"]["name"] == "get_time"


@pytest.mark.parametrize("text,expected", [
    ('{"a": [1, {"b": "}"}]} tail', 22), ('"x\\"y"', 6), ("-1.5e3,", 6), ("true]", 4),
    ('{"a": [1, 2', INCOMPLETE), ('"abc\\', INCOMPLETE), ("12", INCOMPLETE), ("nul", INCOMPLETE),
    ('{"a" 1}', INVALID), ("[1, 2}", INVALID), ("nope", INVALID), ("1.2.3,", INVALID),
])
def test_json_value_end(text, expected):
    assert value_end(text, 0)[0] == expected
    if expected >= 0:
        json.loads(text[:expected])


FUNCTIONS = [
    (0, "get_weather", {"type": "object", "properties": {"location": {"type": "string"},
                                                         "unit": {"enum": ["celsius", "fahrenheit"]}},
                        "required": ["location", "unit"]}),
    (1, "get_time", None),
]


def canonical_call(det, name, args):
    return det.grammar_call_begin(name) + args + det.grammar_call_end()


def test_canonical_calls_are_the_formats_documented_shapes():
    det = make_detector("qwen25")
    assert canonical_call(det, "f", "{}") == '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    assert canonical_call(make_detector("deepseekv3"), "f", "{}") == ds_call("f", "{}")


@pytest.mark.parametrize("fmt", sorted(f for f, d in TOOL_CALL_PARSERS.items() if d.supports_grammar))
def test_grammar_accepts_what_the_parser_reads(fmt):
    det = make_detector(fmt)
    grammar = xgrammar.Grammar.from_ebnf(tool_call_ebnf(det, FUNCTIONS, one_call=False, write_start_marker=True))
    one = xgrammar.Grammar.from_ebnf(tool_call_ebnf(det, FUNCTIONS, one_call=True, write_start_marker=True))
    calls = [canonical_call(det, "get_weather", '{"location": "Oslo", "unit": "celsius"}'),
             canonical_call(det, "get_time", "{}")]
    head, tail = det.grammar_head(True), det.grammar_tail(True)
    two = head + det.grammar_separator.join(calls) + tail
    assert _is_grammar_accept_string(grammar, two)
    assert all(_is_grammar_accept_string(one, head + call + tail) for call in calls)
    assert not _is_grammar_accept_string(one, two)  # named choice: exactly one call
    missing_unit = canonical_call(det, "get_weather", '{"location": "Oslo"}')
    assert not _is_grammar_accept_string(grammar, head + missing_unit + tail)
    assert not _is_grammar_accept_string(grammar, head + canonical_call(det, "other", "{}") + tail)
    assert not _is_grammar_accept_string(grammar, "")  # at least one call
    _, parsed = parse_tool_calls(det, two, {"get_weather", "get_time"}, forced=True)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed] == [
        ("get_weather", {"location": "Oslo", "unit": "celsius"}), ("get_time", {})]


def test_pythonic_cannot_be_enforced_and_says_why():
    from sglang.srt.function_call.tool_plan import plan_tools
    from sglang.srt.function_call.tool_types import Tool
    from sglang.srt.managers.request_error import RequestError

    tools = [Tool.model_validate({"type": "function", "function": {"name": "get_time"}})]
    assert plan_tools(tools, "auto", None, "pythonic").detector.name == "pythonic"
    for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        from sglang.srt.function_call.tool_types import NamedToolChoice

        choice = NamedToolChoice.model_validate(choice) if isinstance(choice, dict) else choice
        with pytest.raises(RequestError) as ei:
            plan_tools(tools, choice, None, "pythonic")
        assert ei.value.param == "tool_choice" and "pythonic" in ei.value.message and "'auto'" in ei.value.message


def test_pythonic_never_evaluates():
    import builtins

    called = []
    real = builtins.__import__
    try:
        builtins.__import__ = lambda *a, **k: called.append(a) or real(*a, **k)
        content, calls = parse_tool_calls(make_detector("pythonic"), "[get_time(tz=__import__('os').getcwd())]",
                                          NAMES)
    finally:
        builtins.__import__ = real
    assert calls == [] and not [a for a in called if a and a[0] == "os"]
