"""A real server started with --grammar-backend none (and a tool-call parser, so tool_choice reaches the grammar
question): every way of asking for a grammar gets a 400 naming the field and the flag, through the `openai` client
and raw HTTP, and plain requests, tools included, keep working afterwards with nothing left behind."""

import json

import openai
import pytest
import requests

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import DEFAULT_SMALL_SERVER_ARGS, openai_client, popen_launch_server

register_cpu_ci(est_time=25, suite="cpu")

MSG = [{"role": "user", "content": "Say hello."}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}
FLAG = "--grammar-backend none"


@pytest.fixture(scope="module")
def server():
    srv = popen_launch_server(other_args=[*DEFAULT_SMALL_SERVER_ARGS, "--grammar-backend", "none",
                                          "--tool-call-parser", "qwen25"])
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server.base_url)


def server_info(server) -> dict:
    return requests.get(f"{server.base_url}/server_info", timeout=30).json()


@pytest.mark.parametrize("kwargs, param", [
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}),
     "response_format"),
    (dict(response_format={"type": "json_object"}), "response_format"),
    (dict(extra_body={"json_schema": json.dumps(SCHEMA)}), "json_schema"),
    (dict(extra_body={"regex": "[0-9]+"}), "regex"),
    (dict(extra_body={"ebnf": 'root ::= "yes" | "no"'}), "ebnf"),
    (dict(tools=[TOOL], tool_choice="required"), "tool_choice"),
    (dict(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get_time"}}), "tool_choice"),
])
def test_chat_grammars_are_400_naming_the_flag(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model="default", messages=MSG, max_tokens=8, **kwargs)
    err = ei.value.body
    assert ei.value.status_code == 400 and err["param"] == param and FLAG in err["message"], err


@pytest.mark.parametrize("sp", [{"json_schema": json.dumps(SCHEMA)}, {"regex": "[0-9]+"},
                                {"ebnf": 'root ::= "yes" | "no"'}])
def test_generate_and_completions_grammars_are_400(server, sp):
    (param,) = sp
    r = requests.post(f"{server.base_url}/generate", timeout=60,
                      json={"text": "Hi", "sampling_params": {**sp, "max_new_tokens": 4}})
    assert r.status_code == 400 and r.json()["error"]["param"] == param and FLAG in r.json()["error"]["message"], r.text
    r = requests.post(f"{server.base_url}/v1/completions", timeout=60,
                      json={"prompt": "Hi", "max_tokens": 4, "response_format": {
                          "type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
    assert FLAG in r.json()["error"]["message"]


def test_plain_requests_keep_working(server, client):
    """Run last in the module: after every refusal above, text, logit_bias and tool_choice auto still serve."""
    chat = client.chat.completions.create(model="default", messages=MSG, max_tokens=8, temperature=0)
    assert chat.choices[0].finish_reason in ("stop", "length") and chat.choices[0].message.content
    auto = client.chat.completions.create(model="default", messages=MSG, max_tokens=8, tools=[TOOL],
                                          tool_choice="auto", temperature=0)
    assert auto.choices[0].finish_reason in ("stop", "length", "tool_calls")
    r = requests.post(f"{server.base_url}/generate", timeout=60,
                      json={"text": "Hi", "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 4, r.text
    info = server_info(server)
    stats = info["internal_states"][0]
    assert "num_live_grammar_matchers" not in stats  # no backend was built
    assert info["memory_integrity"] == "ok" and stats["num_used_tokens"] == 0 and stats["num_running_reqs"] == 0
