"""Tool calling and reasoning through a launched server (default model, --tool-call-parser qwen25 --reasoning-parser
qwen3) with the real `openai` client.

The bundled 135M model was never trained to call tools or to think, so the tests make it: tool_choice "required"
or a named function is enforced by the grammar the server builds, and a `regex` constraint makes it write a
<think> block. What is checked is the server's side: the calls parse and match their schemas, streamed deltas add
up to the non-streamed shape and to an independent re-parse of the raw tokens, bad requests are 400s naming the
field, and the server keeps serving with its KV memory intact.
"""

import json
import re
import time

import jsonschema
import pytest
import requests

from sglang.srt.function_call.detectors import make_detector
from sglang.srt.function_call.tool_call_stream import parse_tool_calls
from sglang.srt.parser.reasoning_parser import ReasoningParser
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import DEFAULT_SMALL_SERVER_ARGS, openai_client, popen_launch_server

register_cpu_ci(est_time=110, suite="cpu")

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
TIME = {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 12}}, "required": ["timezone"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Current time in a timezone",
                                      "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


@pytest.fixture(scope="module")
def server():
    srv = popen_launch_server(other_args=[*DEFAULT_SMALL_SERVER_ARGS, "--tool-call-parser", "qwen25",
                                          "--reasoning-parser", "qwen3"])
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server.base_url)


def chat(client, **kw):
    return client.chat.completions.create(model="default", **{"messages": ASK, "max_tokens": 96, **kw})


def check_call(name, arguments):
    assert name in SCHEMAS
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def streamed(chunks):
    """(content, [(id, name, arguments)], finish_reason, raw text of the logprobs tokens) of choice 0."""
    content, calls, finish, raw = "", {}, None, ""
    for ch in chunks:
        if not ch.choices:
            continue
        c = ch.choices[0]
        content += c.delta.content or ""
        for tc in c.delta.tool_calls or []:
            if tc.id is not None:
                assert tc.type == "function" and tc.function.name and tc.function.arguments == ""
                calls[tc.index] = [tc.id, tc.function.name, ""]
            else:
                assert tc.function.name is None
                calls[tc.index][2] += tc.function.arguments
        if c.logprobs and c.logprobs.content:
            raw += "".join(t.token for t in c.logprobs.content)
        finish = c.finish_reason or finish
    raw = raw.removesuffix("<|im_end|>")  # the EOS token has a logprob too; the text never shows it
    return content, [tuple(calls[k]) for k in sorted(calls)], finish, raw


def assert_idle_and_intact(server):
    deadline = time.time() + 30
    while True:
        info = requests.get(f"{server.base_url}/server_info", timeout=10).json()
        stats = info["internal_states"][0]
        if stats["num_used_tokens"] == 0 and stats["num_running_reqs"] == 0 or time.time() > deadline:
            break
        time.sleep(0.2)
    assert info["memory_integrity"] == "ok" and stats["num_used_tokens"] == 0


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_required_returns_parseable_calls(client, server, temperature):
    resp = chat(client, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=temperature,
                n=3 if temperature else 1, seed=7 if temperature else None)
    for choice in resp.choices:
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None and len(choice.message.tool_calls) == 1
        call = choice.message.tool_calls[0]
        assert call.type == "function" and call.id.startswith("call_")
        check_call(call.function.name, call.function.arguments)
    assert_idle_and_intact(server)


def test_required_streamed(client, server):
    chunks = list(chat(client, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=0,
                       stream=True, logprobs=True))
    content, calls, finish, raw = streamed(chunks)
    assert finish == "tool_calls" and content == "" and len(calls) == 1
    _, name, arguments = calls[0]
    check_call(name, arguments)
    # an independent re-parse of the tokens the model produced gives the same call
    recontent, reparsed = parse_tool_calls(make_detector("qwen25"), raw, set(SCHEMAS), forced=True)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in reparsed] == [(name, arguments)]
    assert recontent == ""
    assert raw.startswith("<tool_call>\n{")  # the parser's own format, written by the grammar


def test_named_function(client):
    choice = {"type": "function", "function": {"name": "get_time"}}
    resp = chat(client, tools=TOOLS, tool_choice=choice, temperature=0)
    calls = resp.choices[0].message.tool_calls
    assert resp.choices[0].finish_reason == "tool_calls" and [c.function.name for c in calls] == ["get_time"]
    check_call("get_time", calls[0].function.arguments)
    _, streamed_calls, finish, _ = streamed(chat(client, tools=TOOLS, tool_choice=choice, temperature=0, stream=True))
    assert finish == "tool_calls" and [c[1] for c in streamed_calls] == ["get_time"]
    check_call("get_time", streamed_calls[0][2])


def test_agent_loop(client, server):
    """call -> the client runs the tool -> tool result message -> the model answers."""
    first = chat(client, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}},
                 temperature=0)
    call = first.choices[0].message.tool_calls[0]
    args = json.loads(call.function.arguments)
    result = {"city": args["city"], "temperature": 21, "unit": args["unit"], "sky": "sunny"}
    messages = ASK + [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)},
    ]
    answer = client.chat.completions.create(model="default", messages=messages, tools=TOOLS, tool_choice="none",
                                            max_tokens=24, temperature=0)
    msg = answer.choices[0].message
    assert msg.content and not msg.tool_calls and answer.choices[0].finish_reason in ("stop", "length")
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens + len(json.dumps(result)) // 8
    assert_idle_and_intact(server)


def test_auto_without_a_call_is_content(client):
    resp = chat(client, tools=TOOLS, tool_choice="auto", temperature=0, max_tokens=16)
    assert resp.choices[0].message.content and resp.choices[0].message.tool_calls is None
    assert resp.choices[0].finish_reason in ("stop", "length")


BAD = [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_stock"}}},
     "tool_choice.function.name", "Tool 'get_stock' not found in tools list"),  # upstream's words
    ({"tool_choice": "required"}, "tool_choice", "requires `tools`"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "sometimes"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools", "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools", "tools[0].function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools", "tools[0]"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools[1].function.name", "unique"),
    ({"tools": [TOOLS[0], TOOLS[0]], "tool_choice": "required"}, "tools[1].function.name", "'get_weather'"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objectx"}}}],
      "tool_choice": "required"}, "tools[0].function.parameters", "invalid 'parameters' schema"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice",
     "response_format"),
    ({"tools": [{"type": "function", "function": {"name": n, "parameters": {
        "type": "object", "properties": {"u": {"$ref": "#/$defs/Unit"}}, "$defs": {"Unit": {"enum": units}}}}}
        for n, units in (("temp", ["C", "F"]), ("dist", ["km", "mi"]))], "tool_choice": "required"},
     "tools[1].function.parameters.$defs.Unit", "tools[0] ('temp') and tools[1] ('dist') both define $defs 'Unit'"),
]


@pytest.mark.parametrize("body,param,words", BAD)
def test_bad_tool_requests_are_400_and_the_server_keeps_serving(server, client, body, param, words):
    r = requests.post(f"{server.base_url}/v1/chat/completions", timeout=60,
                      json={"messages": ASK, "max_tokens": 8, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err
    assert not re.search(r"\.(cc|cpp|h|rs):\d+|\[\d+:\d+:\d+\]", err["message"]), err  # no internal locations
    assert chat(client, max_tokens=4).choices[0].message.content is not None
    assert_idle_and_intact(server)


THINK_REGEX = r"<think>\n[A-Za-z ]{4,40}\n</think>\n\n[A-Za-z ]{4,40}"


def think(client, **kw):
    extra = {"regex": THINK_REGEX, **kw.pop("extra_body", {})}
    return chat(client, temperature=0, max_tokens=64, extra_body=extra, **kw)


def test_reasoning_split(client, server):
    msg = think(client).choices[0].message
    reasoning, content = msg.model_extra["reasoning_content"], msg.content
    assert reasoning and content and "<think>" not in content and "</think>" not in content
    assert reasoning == reasoning.strip() and content == content.lstrip()
    # the same text unsplit: separate_reasoning=false (no prefix-cache dependence: compare shapes, not bytes)
    whole = think(client, extra_body={"separate_reasoning": False}).choices[0].message
    assert whole.content.startswith("<think>\n") and "\n</think>\n\n" in whole.content
    assert whole.model_extra.get("reasoning_content") is None
    # enable_thinking=false: the parser stands down, as upstream's does
    off = think(client, extra_body={"chat_template_kwargs": {"enable_thinking": False}}).choices[0].message
    assert "</think>" in off.content
    assert_idle_and_intact(server)


@pytest.mark.parametrize("stream_reasoning", [True, False])
def test_reasoning_streamed(client, stream_reasoning):
    chunks = list(think(client, stream=True, logprobs=True, extra_body={"stream_reasoning": stream_reasoning}))
    pieces = [(ch.choices[0].delta.model_extra or {}).get("reasoning_content") for ch in chunks if ch.choices]
    reasoning = "".join(p for p in pieces if p)
    content, _, finish, raw = streamed(chunks)
    assert finish in ("stop", "length") and reasoning and content
    assert (reasoning, content) == ReasoningParser("qwen3").split(raw)  # independent re-split of the raw tokens
    num_reasoning_deltas = len([p for p in pieces if p])
    assert num_reasoning_deltas > 1 if stream_reasoning else num_reasoning_deltas == 1
