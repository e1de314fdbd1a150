"""--tool-call-parser llama3 / mistral / pythonic through the HTTP server with the real `openai` client, one server
per parser (deepseekv3 is served by test_llguidance_server.py, qwen25 by test_tool_calling_server.py).

The bundled 135M model was never trained to call tools, so its output is steered: tool_choice "required" / a named
function makes the JSON formats' grammar write the parser's own format; for pythonic, which cannot be enforced
(a 400 that says why), an `ebnf` constraint with tool_choice "auto" makes the model write a Python list of calls.
Checked on the client side: the calls parse, match their schemas and the offered names, and the streamed deltas add
up to the non-streamed message and to an independent re-parse of the raw tokens."""

import json

import jsonschema
import openai
import pytest

from sglang.srt.function_call.detectors import make_detector
from sglang.srt.function_call.tool_call_stream import parse_tool_calls
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import DEFAULT_SMALL_SERVER_ARGS, openai_client, popen_launch_server

register_cpu_ci(est_time=60, suite="cpu")

TIME = {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 8}}, "required": ["tz"]}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"]}
TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": TIME}},
         {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
SCHEMAS = {"get_time": TIME, "get_weather": WEATHER}
ASK = [{"role": "user", "content": "What time is it in Tokyo, and the weather in Rome for 3 days?"}]
PYTHONIC_EBNF = ('root ::= "[get_time(tz=\\"" [A-Z] [A-Z] [A-Z] "\\"), get_weather(city=\\"" [A-Z] [a-z] [a-z] [a-z] '
                 '"\\", days=" [1-7] ")]"')


@pytest.fixture(scope="module", params=["llama3", "mistral", "pythonic"])
def served(request):
    srv = popen_launch_server(other_args=[*DEFAULT_SMALL_SERVER_ARGS, "--tool-call-parser", request.param])
    yield request.param, openai_client(srv.base_url)
    srv.kill()


def ask(client, stream=False, **kw):
    return client.chat.completions.create(model="default", messages=ASK, tools=TOOLS, max_tokens=64, temperature=0,
                                          stream=stream, **kw)


def streamed(chunks):
    """(content, [(name, arguments)], finish_reason, raw text of the tokens) of choice 0."""
    content, calls, finish, raw = "", {}, None, ""
    for ch in chunks:
        if not ch.choices:
            continue
        c = ch.choices[0]
        content += c.delta.content or ""
        for tc in c.delta.tool_calls or []:
            if tc.id is not None:
                calls[tc.index] = [tc.function.name, ""]
            calls[tc.index][1] += tc.function.arguments or ""
        if c.logprobs and c.logprobs.content:
            raw += "".join(t.token for t in c.logprobs.content)
        finish = c.finish_reason or finish
    return content, [tuple(calls[k]) for k in sorted(calls)], finish, raw


def checked(calls, names):
    assert calls and all(name in names for name, _ in calls), calls
    for name, arguments in calls:
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])
    return calls


def test_calls_are_parsed_streamed_and_not(served):
    parser, client = served
    if parser == "pythonic":
        with pytest.raises(openai.BadRequestError) as ei:
            ask(client, tool_choice="required")
        assert ei.value.body["param"] == "tool_choice" and "pythonic" in ei.value.body["message"]
        kw = {"tool_choice": "auto", "extra_body": {"ebnf": PYTHONIC_EBNF}}
        names, count = set(SCHEMAS), 2
    else:
        kw = {"tool_choice": "required", "parallel_tool_calls": False}
        names, count = set(SCHEMAS), 1
    msg = ask(client, **kw).choices[0]
    assert msg.finish_reason == "tool_calls" and not msg.message.content, msg
    whole = checked([(c.function.name, c.function.arguments) for c in msg.message.tool_calls], names)
    assert len(whole) == count and all(c.id.startswith("call_") for c in msg.message.tool_calls)
    content, calls, finish, raw = streamed(ask(client, stream=True, logprobs=True, **kw))
    assert (content, calls, finish) == ("", whole, "tool_calls")
    raw = raw.removesuffix("<|im_end|>")
    recontent, reparsed = parse_tool_calls(make_detector(parser), raw, names, forced=parser != "pythonic")
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in reparsed] == whole and recontent == ""
    if parser == "pythonic":
        assert raw.startswith("[get_time(tz=\"") and raw.endswith(")]")


def test_named_function(served):
    parser, client = served
    if parser == "pythonic":
        pytest.skip("pythonic cannot be enforced; its 400 is checked above")
    choice = {"type": "function", "function": {"name": "get_weather"}}
    msg = ask(client, tool_choice=choice).choices[0]
    assert msg.finish_reason == "tool_calls"
    checked([(c.function.name, c.function.arguments) for c in msg.message.tool_calls], {"get_weather"})
