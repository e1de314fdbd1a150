"""What tools + tool_choice mean for one request (function_call/tool_plan.py): template tools, parser, grammar, and the
400s -- the cases the test server (started with a parser and a grammar backend) cannot reach."""

import pytest

from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, validate_request_body
from sglang.srt.function_call.tool_plan import plan_tools, template_tool_calls
from sglang.srt.managers.request_error import RequestError
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=8, suite="cpu")

TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


def plan(tool_choice=None, tools=(TOOL,), parser="qwen25", backend="xgrammar", parallel=None, special=()):
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": list(tools) or None}
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    req = validate_request_body(body, ChatCompletionRequest)
    return plan_tools(req.tools, req.tool_choice, parallel, parser, special, backend)


def test_none_auto_required_named():
    assert plan("none").template_tools is None and plan("none").detector is None
    auto = plan("auto")
    assert auto.template_tools == [TOOL] and auto.detector.name == "qwen25" and not auto.forced and auto.ebnf is None
    assert plan("auto", parser=None).detector is None  # no parser: calls stay in content, as upstream
    required = plan("required")
    assert required.forced and "get_time" in required.ebnf and required.function_names == {"get_time"}
    named = plan({"type": "function", "function": {"name": "get_time"}})
    assert named.forced and named.function_names == {"get_time"}


@pytest.mark.parametrize("kwargs,param,words", [
    (dict(tool_choice="required", parser=None), "tool_choice", "--tool-call-parser"),
    (dict(tool_choice={"type": "function", "function": {"name": "get_time"}}, parser=None), "tool_choice",
     "--tool-call-parser"),
    (dict(tool_choice="required", backend="none"), "tool_choice", "--grammar-backend none"),
    (dict(tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice.function.name", "get_time"),
    (dict(tool_choice="required", tools=()), "tool_choice", "requires `tools`"),
])
def test_refusals_name_the_field(kwargs, param, words):
    with pytest.raises(RequestError) as e:
        plan(**kwargs)
    assert e.value.status_code == 400 and e.value.param == param and words in e.value.message


def tool_with_defs(name, defs):
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": {"x": {"$ref": "#/$defs/Item"}}, "required": ["x"], "$defs": defs}}}


def test_conflicting_defs_are_refused_with_required_only():
    """Upstream merges the tools' $defs for tool_choice='required' and refuses one name with two schemas."""
    a, b = tool_with_defs("a", {"Item": {"type": "string"}}), tool_with_defs("b", {"Item": {"type": "integer"}})
    with pytest.raises(RequestError) as e:
        plan("required", tools=(a, b))
    assert e.value.status_code == 400 and e.value.param == "tools[1].function.parameters.$defs.Item"
    assert "tools[0] ('a') and tools[1] ('b')" in e.value.message and "'Item'" in e.value.message
    same = plan("required", tools=(a, tool_with_defs("c", {"Item": {"type": "string"}})))  # identical: one schema
    assert same.forced and same.function_names == {"a", "c"}
    assert plan("auto", tools=(a, b)).function_names == {"a", "b"}  # nothing merged: nothing to refuse
    assert plan({"type": "function", "function": {"name": "b"}}, tools=(a, b)).function_names == {"b"}


def test_start_marker_written_only_when_it_is_plain_text():
    assert "[TOOL_CALLS] [" in plan("required", parser="mistral").ebnf
    assert "[TOOL_CALLS]" not in plan("required", parser="mistral", special=("[TOOL_CALLS]",)).ebnf


def test_assistant_tool_calls_reach_templates_as_objects():
    calls = [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
             {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "not json"}}]
    out = template_tool_calls(calls)
    assert out[0]["function"]["arguments"] == {"a": 1} and out[1]["function"]["arguments"] == "not json"
    assert calls[0]["function"]["arguments"] == '{"a": 1}'  # the request is not modified
