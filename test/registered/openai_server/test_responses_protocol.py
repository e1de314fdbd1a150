"""/v1/responses without a server: the request -> chat messages conversion (hand-written expected messages), the
chat request it becomes, the output items and stream events built from parser deltas, and the error field names."""

import pytest

from sglang.srt.entrypoints.openai.protocol import validate_request_body
from sglang.srt.entrypoints.openai.protocol_responses import ResponsesRequest, chat_messages, to_chat_request
from sglang.srt.entrypoints.openai.response_items import OutputItems
from sglang.srt.entrypoints.openai.serving_responses import final_status, responses_param
from sglang.srt.managers.request_error import RequestError
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="cpu")


def parse(body):
    return validate_request_body(body, ResponsesRequest)


def messages_of(body):
    req = parse(body)
    return chat_messages(req.instructions, req.input)


def test_string_input_and_instructions():
    assert messages_of({"input": "hi"}) == [{"role": "user", "content": "hi"}]
    assert messages_of({"input": "hi", "instructions": "be brief"}) == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def test_a_whole_conversation():
    items = [
        {"role": "developer", "content": [{"type": "input_text", "text": "Use "},
                                          {"type": "input_text", "text": "tools."}]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Look:"},
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}]},
        {"type": "function_call", "call_id": "call_a", "name": "f", "arguments": '{"x": 1}', "id": "fc_1"},
        {"type": "function_call", "call_id": "call_b", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_a", "output": "1"},
        {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "two"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "again"}]},
        {"type": "function_call", "call_id": "call_c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_c", "output": "3"},
        {"role": "user", "content": "thanks"},
    ]
    assert messages_of({"input": items, "instructions": "sys"}) == [
        {"role": "system", "content": "sys"},
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": [{"type": "text", "text": "Look:"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA",
                                                                         "detail": "low"}}]},
        {"role": "assistant", "content": "Let me check.", "reasoning_content": "hmm", "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
            {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "1"},
        {"role": "tool", "tool_call_id": "call_b", "content": "two"},
        {"role": "assistant", "content": None, "reasoning_content": "again", "tool_calls": [
            {"id": "call_c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_c", "content": "3"},
        {"role": "user", "content": "thanks"},
    ]


def test_chat_request_fields():
    chat = to_chat_request(parse({
        "input": "hi", "max_output_tokens": 7, "temperature": 0.5, "top_p": 0.9, "stream": True, "seed": 3,
        "top_k": 5, "parallel_tool_calls": False,
        "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "f"},
    }))
    assert chat.max_tokens == 7 and chat.max_output_tokens == 7 and chat.max_tokens_param == "max_output_tokens"
    assert (chat.temperature, chat.top_p, chat.stream, chat.seed, chat.top_k) == (0.5, 0.9, True, 3, 5)
    assert chat.parallel_tool_calls is False and chat.n == 1 and chat._responses.input == "hi"
    assert [t.model_dump(exclude_none=True) for t in chat.tools] == [
        {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}]
    assert chat.tool_choice.function.name == "f"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = to_chat_request(parse({"input": "hi", "text": {"format": {"type": "json_schema", "name": "n",
                                                                     "schema": schema}}}))
    assert chat.response_format.json_schema == {"name": "n", "schema": schema}
    assert chat.constraint() == {"json_schema": '{"type": "object", "properties": {"a": {"type": "integer"}}}'}
    assert to_chat_request(parse({"input": "hi", "text": {"format": {"type": "json_object"}}})).constraint() == {
        "json_schema": '{"type": "object"}'}
    assert to_chat_request(parse({"input": "hi", "text": {"format": {"type": "text"}}})).constraint() == {}


@pytest.mark.parametrize("body,param", [
    ({"input": []}, "input"),
    ({"input": [{"role": "assistant", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content"),
])
def test_conversion_errors_name_the_item(body, param):
    with pytest.raises(RequestError) as e:
        to_chat_request(parse(body))
    assert e.value.status_code == 400 and e.value.param == param


@pytest.mark.parametrize("body,param", [
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "include": ["reasoning.encrypted_content"]}, "include"),
    ({"input": "x", "reasoning": {"effort": "low"}}, "reasoning"),
])
def test_stateful_and_unserved_fields_refused(body, param):
    assert parse(body).unsupported()[0] == param
    for store in (False, True, None):  # true is answered "store": false (nothing is stored), not refused
        assert parse({"input": "x", "store": store, "reasoning": {"effort": None}}).unsupported() is None


def test_output_items_and_events():
    items = OutputItems()
    events = items.feed([{"reasoning_content": "think"}, {"content": "Hel"}, {"content": "lo"},
                         {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                          "function": {"name": "f", "arguments": ""}}]},
                         {"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]},
                         {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}])
    events += items.close("incomplete")
    assert [e["type"] for e in events] == [
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done"]
    assert [e["output_index"] for e in events] == [0] * 6 + [1] * 7 + [2] * 5
    reasoning, message, call = items.output
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "think"}] and reasoning["status"] == "completed"
    assert message["content"][0]["text"] == "Hello" and message["status"] == "completed"
    assert (call["call_id"], call["name"], call["arguments"], call["status"]) == ("call_1", "f", '{"a": 1}',
                                                                                  "incomplete")
    assert events[-1]["item"] is call and items.has_function_calls
    empty = OutputItems()
    assert [e["type"] for e in empty.close()][0] == "response.output_item.added"
    assert empty.output[0]["content"][0]["text"] == "" and empty.output[0]["type"] == "message"


def test_status_and_param_names():
    assert final_status({"type": "stop"})[0] == "completed"
    assert final_status({"type": "length"})[:2] == ("incomplete", {"reason": "max_output_tokens"})
    assert final_status({"type": "abort", "message": "boom"})[2] == {"code": "server_error", "message": "boom"}
    assert responses_param("tools[2].function.parameters") == "tools[2].parameters"
    assert responses_param("tool_choice.function.name") == "tool_choice.name"
    assert responses_param("max_tokens") == "max_output_tokens"
    assert responses_param("response_format") == "text.format"
    assert responses_param("messages[3].content") == "input"
    assert responses_param("temperature") == "temperature" and responses_param(None) is None
