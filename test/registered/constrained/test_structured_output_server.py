"""Structured output through the HTTP server: the real `openai` client's `chat.completions.parse` with a pydantic
model, response_format json_object / json_schema on chat and completions (streamed too), SGLang's json_schema /
regex / ebnf in extra_body and in /generate's sampling_params, logit_bias, and 400s for bad grammars and biases
with the server still serving: grammars no string matches (at arrival), and a grammar the tokenizer cannot spell
to its end (mid-generation, streamed or not), none of them counted as a fault."""

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

register_cpu_ci(est_time=75, suite="cpu")

from structured_requests import scheduler_stats  # noqa: E402

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
    # 16 tokens: enough for the longest answer (11 bytes) spelled a byte a token, which sampling at the default
    # temperature may do (8 ran out of tokens at "answer: ye" in a fresh-clone CI run)
    r = requests.post(f"{server.base_url}/generate", timeout=60,
                      json={"text": "Is the sky blue?", "sampling_params": {"ebnf": ebnf, "max_new_tokens": 16}})
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


REQUIRED_CYCLE = {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"],
                  "$defs": {"a": {"$ref": "#/$defs/a"}}}
NEVER_FINISH = [("ebnf", 'root ::= "a" rest\nrest ::= rest'), ("regex", r"a[^\s\S]"),
                ("json_schema", json.dumps(REQUIRED_CYCLE))]


def chat_constraint(kind: str, text: str) -> dict:
    if kind == "json_schema":
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": json.loads(text)}}}
    return {"extra_body": {kind: text}}


def assert_still_serving_without_a_fault(base_url: str, faults: int, log: str) -> None:
    ok = requests.post(f"{base_url}/generate", timeout=60,
                       json={"text": "hi", "sampling_params": {"max_new_tokens": 4, "regex": "(yes|no)"}})
    assert ok.status_code == 200 and ok.json()["text"] in ("yes", "no"), ok.text
    assert scheduler_stats(base_url)["num_faults"] == faults
    assert " ERROR " not in log and "Traceback" not in log, log[-3000:]


@pytest.mark.parametrize("kind, text", NEVER_FINISH)
def test_a_grammar_that_can_begin_but_never_finish_is_a_400_at_arrival(client, model, server, kind, text):
    """An output of each can begin ("a", '{"x": ') but no continuation ever completes it: the reference is xgrammar's
    matcher on the byte vocabulary -- a first byte is allowed, and an exhaustive search of the (finite) tree of
    accepted byte prefixes finds none where the output may end. /generate and chat both get a 400 naming the field."""
    from byte_reference import allowed_bytes, byte_compiler, compile_kind, end_reachable

    compiled = compile_kind(byte_compiler(), kind, text)
    assert allowed_bytes(xgr_matcher(compiled)) and end_reachable(compiled, max_nodes=300) is False
    faults = scheduler_stats(server.base_url)["num_faults"]
    r = requests.post(f"{server.base_url}/generate", timeout=60,
                      json={"text": "hi", "sampling_params": {"max_new_tokens": 8, kind: text}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == kind and "no continuation of it ever completes" in r.json()["message"], r.text
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model=model, messages=MSG, max_tokens=8, **chat_constraint(kind, text))
    err = ei.value.body
    assert err["param"] == ("response_format" if kind == "json_schema" else kind), err
    assert "matches no string" in err["message"] and "no continuation" in err["message"], err
    assert_still_serving_without_a_fault(server.base_url, faults, server.log())


def xgr_matcher(compiled):
    import xgrammar

    return xgrammar.GrammarMatcher(compiled)


# SmolLM2's tokenizer has no token for the byte 0x04 (checked through /v1/tokenize below): a grammar that needs it
# after a prefix matches a byte string, so the arrival checks keep it, but sampling runs out of tokens after "a"
UNSPELLABLE_REGEX = "a\\x04"
UNSPELLABLE_SCHEMA = {"type": "string", "pattern": "^a\u0004$"}  # '"' then 'a' then nothing


def sse_events(resp) -> list:
    return [line[len("data: "):] for line in resp.iter_lines(decode_unicode=True) if line.startswith("data: ")]


def test_a_grammar_the_tokenizer_cannot_finish_ends_with_a_400_mid_generation(client, model, server):
    url = server.base_url
    tokenize = lambda s: requests.post(f"{url}/v1/tokenize", json={"prompt": s}, timeout=30).json()["tokens"]  # noqa
    assert tokenize("a\x04") == tokenize("a")  # the independent reason: no token spells 0x04
    faults = scheduler_stats(url)["num_faults"]
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 8, "regex": UNSPELLABLE_REGEX}}
    r = requests.post(f"{url}/generate", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "regex", r.text
    assert "the grammar admits no continuation after 1 tokens" in r.json()["message"], r.text
    with requests.post(f"{url}/generate", json={**body, "stream": True}, stream=True, timeout=60) as s:
        events = sse_events(s)
    assert events[-1] == "[DONE]" and len(events) >= 2, events
    error = json.loads(events[-2])
    assert error["error"]["param"] == "regex" and "no continuation after 1 tokens" in error["message"], events

    rf = {"type": "json_schema", "json_schema": {"name": "s", "schema": UNSPELLABLE_SCHEMA}}
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model=model, messages=MSG, max_tokens=8, response_format=rf)
    err = ei.value.body
    # a 400 raised during generation names the field as chat calls it (serving_base.api_param_errors)
    assert err["param"] == "response_format" and "no continuation after 2 tokens" in err["message"], err
    assert "json_schema" not in err["message"].split(":")[0], err
    chat = {"model": model, "messages": MSG, "max_tokens": 8, "response_format": rf, "stream": True}
    with requests.post(f"{url}/v1/chat/completions", json=chat, stream=True, timeout=60) as s:
        events = sse_events(s)
    assert events[-1] == "[DONE]", events
    error = json.loads(events[-2])
    assert error["error"]["param"] == "response_format" and "no continuation after 2" in error["message"], events
    assert_still_serving_without_a_fault(url, faults, server.log())
