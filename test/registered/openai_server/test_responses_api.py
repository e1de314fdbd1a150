"""POST /v1/responses through a launched server (default model, --tool-call-parser qwen25) with the real `openai`
client's `client.responses.create`: plain, streamed, with a tool, with a JSON schema, and bad requests.

References independent of the Responses code: the same conversation through /v1/chat/completions (the text at
temperature 0 and the prompt's token count must be equal), jsonschema for the structured output and the call
arguments, and OpenAI's own event and response models (the client parses every event into its typed class).
The bundled 135M model was never trained to call tools, so tool calls are forced with tool_choice "required" /
a named function (the grammar the server builds), and a `regex` makes it think, as in test_tool_calling_server.py.
"""

import json
import time

import jsonschema
import openai
import pydantic
import pytest
import requests

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import DEFAULT_SMALL_SERVER_ARGS, openai_client, popen_launch_server

register_cpu_ci(est_time=80, suite="cpu")

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Current weather of a city", "parameters": WEATHER}]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer", "minimum": 0,
                                                                        "maximum": 120}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


class Person(pydantic.BaseModel):
    name: str
    age: int


INSTRUCTIONS = "You are a helpful assistant. Answer briefly."
QUESTION = "What is the capital of France?"
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def resp_server():
    # float32: the text comparisons at temperature 0 (streamed vs not, /v1/responses vs the chat API) meet prefix
    # cache hits and other batch shapes, where bf16 kernels may round a near-tie the other way
    # --reasoning-parser qwen3 reads an output without <think> as all answer: only the reasoning test writes one
    srv = popen_launch_server(other_args=[*DEFAULT_SMALL_SERVER_ARGS, "--tool-call-parser", "qwen25",
                                          "--reasoning-parser", "qwen3", "--dtype", "float32"])
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def client(resp_server):
    return openai_client(resp_server.base_url)


def create(client, **kw):
    return client.responses.create(model="default", **{"max_output_tokens": MAX_TOKENS, "temperature": 0, **kw})


def chat_reference(client, messages):
    return client.chat.completions.create(model="default", messages=messages, max_tokens=MAX_TOKENS, temperature=0)


def collect(stream):
    """The events of a stream, after checking their numbering and the item events' order."""
    events = list(stream)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert events[-1].type in ("response.completed", "response.incomplete")
    return events


def test_plain_equals_chat(client):
    resp = create(client, instructions=INSTRUCTIONS, input=QUESTION)
    assert resp.object == "response" and resp.id.startswith("resp") and resp.status in ("completed", "incomplete")
    assert resp.instructions == INSTRUCTIONS and resp.max_output_tokens == MAX_TOKENS and resp.store is False
    [msg] = resp.output
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    [part] = msg.content
    assert part.type == "output_text" and part.text == resp.output_text
    ref = chat_reference(client, [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}])
    assert part.text == ref.choices[0].message.content and part.text
    assert resp.usage.input_tokens == ref.usage.prompt_tokens
    assert resp.usage.output_tokens == ref.usage.completion_tokens
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    finished = ref.choices[0].finish_reason
    assert resp.status == ("incomplete" if finished == "length" else "completed")
    if finished == "length":
        assert resp.incomplete_details.reason == "max_output_tokens"


def test_input_items_equal_string_input(client):
    """A list of messages with input_text parts is the same prompt as the string with instructions."""
    items = [{"role": "developer", "content": [{"type": "input_text", "text": INSTRUCTIONS}]},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is the capital "},
                                                             {"type": "input_text", "text": "of France?"}]}]
    a = create(client, input=items)
    b = create(client, instructions=INSTRUCTIONS, input=QUESTION)
    assert a.output_text == b.output_text and a.usage.input_tokens == b.usage.input_tokens


def test_streamed_equals_plain(client):
    events = collect(create(client, instructions=INSTRUCTIONS, input=QUESTION, stream=True))
    types = [e.type for e in events]
    body = [t for t in types if t != "response.output_text.delta"]
    assert body == ["response.created", "response.in_progress", "response.output_item.added",
                    "response.content_part.added", "response.output_text.done", "response.content_part.done",
                    "response.output_item.done", types[-1]]
    first_delta = types.index("response.output_text.delta")
    assert types.index("response.content_part.added") < first_delta < types.index("response.output_text.done")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    final = events[-1].response
    plain = create(client, instructions=INSTRUCTIONS, input=QUESTION)
    assert deltas == done.text == final.output_text == plain.output_text
    item_id = final.output[0].id
    assert all(e.item_id == item_id for e in events if hasattr(e, "item_id"))
    assert final.usage.output_tokens == plain.usage.output_tokens and final.status == plain.status
    # the client's stream helper rebuilds the response from the events alone (indices, item ids, part order)
    with client.responses.stream(model="default", instructions=INSTRUCTIONS, input=QUESTION,
                                 max_output_tokens=MAX_TOKENS, temperature=0) as helper:
        rebuilt = helper.get_final_response()
    assert rebuilt.output_text == plain.output_text and rebuilt.output[0].content[0].text == plain.output_text


def test_max_output_tokens_incomplete(client):
    resp = create(client, input="Count from one to one hundred in words.", max_output_tokens=3)
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage.output_tokens == 3 and resp.output[0].status == "incomplete"
    events = collect(create(client, input="Count from one to one hundred in words.", max_output_tokens=3,
                            stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.output_text == resp.output_text


def test_json_schema(client):
    fmt = {"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}}
    resp = create(client, input="Invent a person. Reply in JSON.", text=fmt, max_output_tokens=48)
    assert resp.status == "completed"
    jsonschema.validate(json.loads(resp.output_text), PERSON)
    assert resp.text.format.type == "json_schema" and resp.text.format.name == "person"
    streamed = collect(create(client, input="Invent a person. Reply in JSON.", text=fmt, max_output_tokens=48,
                              stream=True))
    assert streamed[-1].response.output_text == resp.output_text
    jsonschema.validate(json.loads(streamed[-1].response.output_text), PERSON)
    # the client's parse helper: its pydantic model's schema in, a parsed instance out
    parsed = client.responses.parse(model="default", input="Invent a person. Reply in JSON.", text_format=Person,
                                    max_output_tokens=48, temperature=0)
    assert isinstance(parsed.output_parsed, Person) and isinstance(parsed.output_parsed.age, int)


def check_call(item):
    assert item.type == "function_call" and item.name == "get_weather" and item.call_id.startswith("call_")
    jsonschema.validate(json.loads(item.arguments), WEATHER)


def test_tool_call_and_result(client):
    ask = "What is the weather in Paris right now?"
    resp = create(client, input=ask, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                  max_output_tokens=128)
    assert resp.status == "completed" and [o.type for o in resp.output] == ["function_call"]
    call = resp.output[0]
    check_call(call)
    assert resp.tools[0].name == "get_weather" and resp.tool_choice == "required"
    # streamed: the argument deltas add up to the done event and to the non-streamed call
    events = collect(create(client, input=ask, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                            max_output_tokens=128, stream=True))
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.type == "function_call" and added.item.name == "get_weather"
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert args == done.arguments == call.arguments
    assert events[-1].response.output[0].arguments == call.arguments
    # the call and its result fed back: the model answers in text
    named = create(client, input=[{"role": "user", "content": ask}, call.model_dump(exclude_none=True),
                                  {"type": "function_call_output", "call_id": call.call_id,
                                   "output": json.dumps({"temp_c": 21})}],
                   tools=TOOLS, tool_choice="none")
    assert [o.type for o in named.output] == ["message"] and named.output_text
    # == the chat API given the same conversation
    ref = client.chat.completions.create(
        model="default", max_tokens=MAX_TOKENS, temperature=0, messages=[
            {"role": "user", "content": ask},
            {"role": "assistant", "content": None, "tool_calls": [{"id": call.call_id, "type": "function", "function": {
                "name": call.name, "arguments": call.arguments}}]},
            {"role": "tool", "tool_call_id": call.call_id, "content": json.dumps({"temp_c": 21})}])
    assert named.output_text == ref.choices[0].message.content
    assert named.usage.input_tokens == ref.usage.prompt_tokens


def test_named_tool_choice(client):
    resp = create(client, input="Weather in Rome?", tools=TOOLS, max_output_tokens=128,
                  tool_choice={"type": "function", "name": "get_weather"})
    assert [o.type for o in resp.output] == ["function_call"]
    check_call(resp.output[0])


THINK_REGEX = r"<think>\n[A-Za-z ]{4,40}\n</think>\n\n[A-Za-z ]{4,40}"


def test_reasoning_item(client):
    """With --reasoning-parser the thoughts are a reasoning item before the message, streamed as reasoning_text."""
    kw = dict(input=QUESTION, extra_body={"regex": THINK_REGEX}, max_output_tokens=64)
    resp = create(client, **kw)
    assert [o.type for o in resp.output] == ["reasoning", "message"]
    thoughts = resp.output[0].content[0].text
    # the chat API's split of the same output is the reference
    ref = client.chat.completions.create(model="default", messages=[{"role": "user", "content": QUESTION}],
                                         max_tokens=64, temperature=0, extra_body={"regex": THINK_REGEX})
    assert thoughts == ref.choices[0].message.reasoning_content and thoughts.strip()
    assert resp.output_text == ref.choices[0].message.content
    events = collect(create(client, stream=True, **kw))
    types = [e.type for e in events if not e.type.endswith(".delta")]
    assert types[2:-1] == ["response.output_item.added", "response.content_part.added", "response.reasoning_text.done",
                           "response.content_part.done", "response.output_item.done",
                           "response.output_item.added", "response.content_part.added", "response.output_text.done",
                           "response.content_part.done", "response.output_item.done"]
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == thoughts
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == resp.output_text


@pytest.mark.parametrize("kw,param", [
    ({"previous_response_id": "resp_123"}, "previous_response_id"),
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"input": [{"type": "input_file", "file_id": "f"}]}, "input"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "bogus"}}}}, "text.format.schema"),
    ({"tools": TOOLS, "tool_choice": "required", "text": {"format": {"type": "json_object"}}}, "text.format"),
])
def test_bad_requests_name_the_field(client, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        create(client, **{"input": "hi", **kw})
    assert e.value.body["param"] == param
    assert create(client, input="hi", max_output_tokens=2).status in ("completed", "incomplete")


def test_no_stored_responses(client):
    """store: true (OpenAI's default) is served and answered "store": false, as a server without storage does;
    retrieving or deleting the response is a 404 saying why."""
    resp = create(client, input="hi", max_output_tokens=2, store=True)
    assert resp.store is False and resp.status in ("completed", "incomplete") and resp.output_text
    for call in (client.responses.retrieve, client.responses.delete):
        with pytest.raises(openai.NotFoundError) as e:
            call(resp.id)
        assert "stores no responses" in e.value.message and e.value.body["param"] == "response_id"


def test_stream_disconnect_aborts(resp_server):
    """A client that leaves mid-stream: the request is aborted and its KV memory freed."""
    body = {"model": "default", "input": "Count to a thousand.", "stream": True, "max_output_tokens": 4000}
    with requests.post(f"{resp_server.base_url}/v1/responses", json={**body, "ignore_eos": True}, stream=True,
                       timeout=60) as r:
        deltas = 0
        for line in r.iter_lines():  # leave after a few tokens
            deltas += line.startswith(b"event: response.output_text.delta")
            if deltas == 3:
                break
    assert deltas == 3
    deadline = time.time() + 5  # far less than the 4000 tokens would take
    while True:
        info = requests.get(f"{resp_server.base_url}/server_info", timeout=10).json()
        stats = info["internal_states"][0]
        if (stats["num_used_tokens"] == 0 and stats["num_running_reqs"] == 0) or time.time() > deadline:
            break
        time.sleep(0.2)
    assert stats["num_running_reqs"] == 0 and stats["num_used_tokens"] == 0 and info["memory_integrity"] == "ok"
