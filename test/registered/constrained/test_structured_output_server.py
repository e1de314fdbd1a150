"""Structured output through the HTTP server: the real `openai` client's `chat.completions.parse` with a pydantic
model, response_format json_object / json_schema on chat and completions (streamed too), SGLang's json_schema /
regex / ebnf in extra_body and in /generate's sampling_params, logit_bias, and 400s for bad grammars and biases
with the server still serving."""

import json
import re
from typing import List, Literal

import jsonschema
import openai
import pytest
import requests
from pydantic import BaseModel, Field

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import DEFAULT_SMALL_SERVER_ARGS, openai_client, popen_launch_server

register_cpu_ci(est_time=60, suite="cpu")

MSG = [{"role": "user", "content": "Give me the weather in a European capital as JSON."}]


class Weather(BaseModel):
    city: Literal["Paris", "Rome", "Berlin"]
    temperature_c: int = Field(ge=-30, le=50)
    sunny: bool
    tags: List[Literal["wind", "rain", "sun"]] = Field(max_length=2)


@pytest.fixture(scope="module")
def server():
    srv = popen_launch_server(other_args=DEFAULT_SMALL_SERVER_ARGS)
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server.base_url)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


@pytest.fixture(autouse=True)
def server_intact(request):
    yield
    if "server" in request.fixturenames:
        info = requests.get(f"{request.getfixturevalue('server').base_url}/server_info", timeout=30).json()
        stats = info["scheduler"]["stats"] if "scheduler" in info else info["stats"]
        assert stats["num_live_grammar_matchers"] == 0 and stats["num_grammar_waiting_reqs"] == 0


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_openai_parse_returns_a_pydantic_object(client, model, temperature):
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    resp = parse(model=model, messages=MSG, response_format=Weather, max_tokens=64, temperature=temperature)
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Weather)
    assert Weather.model_validate_json(choice.message.content) == choice.message.parsed


def assert_json_object(text: str, finish_reason: str) -> None:
    """A finished output is a JSON object; one cut by max_tokens (greedy text differs between CPUs' bf16 kernels,
    and a small model may write long strings) is a prefix xgrammar's own JSON grammar still accepts."""
    if finish_reason == "stop":
        assert isinstance(json.loads(text), dict), text
        return
    assert finish_reason == "length" and text.startswith("{"), (finish_reason, text)
    xgr = pytest.importorskip("xgrammar")
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(xgr.TokenizerInfo([])).compile_builtin_json_grammar())
    assert matcher.accept_string(text), text


def test_json_object_on_chat_and_completions_streamed_and_not(client, model):
    chat = client.chat.completions.create(model=model, messages=MSG, response_format={"type": "json_object"},
                                          max_tokens=128, temperature=0)
    assert_json_object(chat.choices[0].message.content, chat.choices[0].finish_reason)
    comp = client.completions.create(model=model, prompt="A JSON object describing a cat:", max_tokens=128,
                                     extra_body={"response_format": {"type": "json_object"}}, temperature=0)
    assert_json_object(comp.choices[0].text, comp.choices[0].finish_reason)
    chunks = client.chat.completions.create(model=model, messages=MSG, response_format={"type": "json_object"},
                                            max_tokens=128, temperature=0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat.choices[0].message.content


def test_json_schema_on_completions_with_n(server):
    schema = Weather.model_json_schema()
    body = {"prompt": "Weather report as JSON:", "max_tokens": 64, "n": 3, "temperature": 0.8,
            "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": schema, "strict": True}}}
    r = requests.post(f"{server.base_url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    for c in r.json()["choices"]:
        jsonschema.validate(json.loads(c["text"]), schema)


def test_native_grammars_in_extra_body_and_generate(client, model, server):
    pattern = r"[A-Z]{3}-[0-9]{3}"
    chat = client.chat.completions.create(model=model, messages=MSG, max_tokens=16, temperature=0.8,
                                          extra_body={"regex": pattern})
    assert re.fullmatch(pattern, chat.choices[0].message.content)
    ebnf = 'root ::= "answer: " ("yes" | "no")'
    r = requests.post(f"{server.base_url}/generate", timeout=60,
                      json={"text": "Is the sky blue?", "sampling_params": {"ebnf": ebnf, "max_new_tokens": 8}})
    assert r.status_code == 200 and r.json()["text"] in ("answer: yes", "answer: no"), r.text
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 3, "maxItems": 3}
    r = requests.post(f"{server.base_url}/generate", timeout=60, json={
        "text": "Three digits:", "sampling_params": {"json_schema": json.dumps(schema), "max_new_tokens": 16}})
    jsonschema.validate(json.loads(r.json()["text"]), schema)


def test_logit_bias_on_chat_and_completions(client, model, server):
    tok = requests.post(f"{server.base_url}/v1/tokenize", json={"prompt": " banana"}, timeout=30).json()["tokens"]
    forced = tok[0]
    chat = client.chat.completions.create(model=model, messages=MSG, max_tokens=3, temperature=0,
                                          logit_bias={str(forced): 100})
    comp = client.completions.create(model=model, prompt="Hello", max_tokens=3, temperature=0.7,
                                     logit_bias={str(forced): 100})
    ids = requests.post(f"{server.base_url}/v1/tokenize", json={"prompt": comp.choices[0].text},
                        timeout=30).json()["tokens"]
    assert ids == [forced] * 3
    assert chat.choices[0].message.content.strip().startswith("banana")


@pytest.mark.parametrize("extra, param, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objec"}}}},
     "response_format", 'Unsupported type "objec"'),
    ({"extra_body": {"regex": "[0-9"}}, "regex", "Regex parsing error"),
    ({"extra_body": {"ebnf": "root ::= missing"}}, "ebnf", 'Rule "missing" is not defined'),
    ({"extra_body": {"regex": "a", "json_schema": "{}"}}, "regex", "Only one constraint"),
    ({"logit_bias": {"5": 250}}, "logit_bias", "[-100, 100]"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias", "outside the vocabulary"),
    ({"logit_bias": {"abc": 1}}, "logit_bias", "not a token id"),
])
def test_bad_constraints_are_400_and_server_keeps_serving(client, model, extra, param, words):
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model=model, messages=MSG, max_tokens=8, **extra)
    err = ei.value.body
    assert ei.value.status_code == 400 and err["param"] == param and words in err["message"], err
    assert not re.search(r"\.(cc|cpp|h|rs):\d+|\[\d+:\d+:\d+\]", err["message"]), err  # no internal locations
    ok = client.chat.completions.create(model=model, messages=MSG, max_tokens=4, extra_body={"regex": "ok"})
    assert ok.choices[0].message.content == "ok"


def test_the_requests_llguidance_is_checked_with(client, model, server):
    """The request set test_llguidance_server.py sends, here under xgrammar: both backends give valid outputs."""
    from structured_requests import check_structured_requests

    check_structured_requests(client, server.base_url, model)


SELF_REF_SCHEMA = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}
EMPTY_LANGUAGE = [("ebnf", "root ::= root"), ("regex", r"[^\s\S]"), ("json_schema", json.dumps(SELF_REF_SCHEMA))]


def scheduler_stats(base_url: str) -> dict:
    info = requests.get(f"{base_url}/server_info", timeout=30).json()
    return info["scheduler"]["stats"] if "scheduler" in info else info["stats"]


@pytest.mark.parametrize("kind, text", EMPTY_LANGUAGE)
def test_a_grammar_no_string_matches_is_a_400_not_a_fault(client, model, server, kind, text):
    """Each of these matches no string (checked independently below with xgrammar's own matcher on a byte
    vocabulary): the client gets a 400 naming its field on /generate, chat (extra_body, or response_format for
    the schema); nothing reaches the scheduler's fault count or its ERROR log, and valid grammars are still served."""
    faults = scheduler_stats(server.base_url)["num_faults"]
    r = requests.post(f"{server.base_url}/generate", timeout=60,
                      json={"text": "hi", "sampling_params": {"max_new_tokens": 4, kind: text}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == kind and "matches no string" in r.json()["message"], r.text
    extra = ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SELF_REF_SCHEMA}}}
             if kind == "json_schema" else {"extra_body": {kind: text}})
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model=model, messages=MSG, max_tokens=4, **extra)
    err = ei.value.body
    assert err["param"] == ("response_format" if kind == "json_schema" else kind), err
    assert "matches no string" in err["message"], err
    ok = requests.post(f"{server.base_url}/generate", timeout=60,
                       json={"text": "hi", "sampling_params": {"max_new_tokens": 4, "regex": "(yes|no)"}})
    assert ok.status_code == 200 and ok.json()["text"] in ("yes", "no"), ok.text
    assert scheduler_stats(server.base_url)["num_faults"] == faults
    assert " ERROR " not in server.log(), server.log()[-3000:]

    xgr = pytest.importorskip("xgrammar")  # the reference: no byte and no end can start an output
    info = xgr.TokenizerInfo([bytes([b]) for b in range(256)] + [b"</s>"], xgr.VocabType.RAW, stop_token_ids=[256])
    compiler = xgr.GrammarCompiler(info)
    grammar = {"ebnf": compiler.compile_grammar, "regex": compiler.compile_regex,
               "json_schema": compiler.compile_json_schema}[kind](text)
    matcher = xgr.GrammarMatcher(grammar)
    assert not any(matcher.accept_string(bytes([b]).decode("latin-1")) for b in range(128))
    assert not matcher.is_terminated() and not matcher.accept_token(256)
