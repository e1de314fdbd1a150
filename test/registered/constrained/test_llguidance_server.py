"""--grammar-backend llguidance through the HTTP server with the real `openai` client: the structured-output requests
the xgrammar server test also sends (structured_requests.py) give valid outputs, ebnf also takes Lark, tool_choice
"required" / named functions are enforced with llguidance's own grammar (Lark with %json) in the format of the
server's parser (deepseekv3 here: the name outside the JSON; its HTTP test in the family of parser tests),
bad grammars and tool schemas are 400s naming the field without internal source locations (a GBNF form llguidance
cannot translate too), and the server keeps serving throughout."""

import json
import re

import jsonschema
import openai
import pytest
import requests

from sglang.srt.function_call.detectors import make_detector
from sglang.srt.function_call.tool_call_stream import parse_tool_calls
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import DEFAULT_SMALL_SERVER_ARGS, openai_client, popen_launch_server

register_cpu_ci(est_time=45, suite="cpu")

pytest.importorskip("llguidance")

from structured_requests import MSG, check_structured_requests, scheduler_stats  # noqa: E402

INTERNAL_LOCATION = re.compile(r"\.(cc|cpp|h|rs):\d+|\[\d+:\d+:\d+\]")
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"tz": {"type": "string", "maxLength": 8}}, "required": ["tz"]}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server():
    srv = popen_launch_server(other_args=[*DEFAULT_SMALL_SERVER_ARGS, "--grammar-backend", "llguidance",
                                          "--tool-call-parser", "deepseekv3"])
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server.base_url)


@pytest.fixture(autouse=True)
def server_intact(request):
    yield
    if "server" in request.fixturenames:
        info = requests.get(f"{request.getfixturevalue('server').base_url}/server_info", timeout=30).json()
        stats = info["scheduler"]["stats"] if "scheduler" in info else info["stats"]
        assert stats["num_live_grammar_matchers"] == 0 and stats["num_grammar_waiting_reqs"] == 0


def test_structured_requests_give_valid_outputs(client, server):
    info = requests.get(f"{server.base_url}/server_info", timeout=30).json()
    assert info["grammar_backend"] == "llguidance"
    check_structured_requests(client, server.base_url, "default")


def test_ebnf_in_lark(server):
    lark = 'start: "code: " /[0-9]{3}/ ("-" /[A-Z]{2}/)?'
    r = requests.post(f"{server.base_url}/generate", timeout=60, json={
        "text": "The code is", "sampling_params": {"ebnf": lark, "max_new_tokens": 12, "temperature": 0.8}})
    assert r.status_code == 200 and re.fullmatch(r"code: [0-9]{3}(-[A-Z]{2})?", r.json()["text"]), r.text


def test_tool_choice_required_and_named_streamed_and_not(client):
    for choice, names in [("required", {"get_weather", "get_time"}),
                          ({"type": "function", "function": {"name": "get_time"}}, {"get_time"})]:
        kw = dict(model="default", messages=ASK, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False,
                  max_tokens=160, temperature=0)
        resp = client.chat.completions.create(**kw)
        assert resp.choices[0].finish_reason == "tool_calls"
        got = [(c.function.name, c.function.arguments) for c in resp.choices[0].message.tool_calls]
        assert len(got) == 1 and got[0][0] in names, got
        schema = WEATHER if got[0][0] == "get_weather" else TOOLS[1]["function"]["parameters"]
        jsonschema.validate(json.loads(got[0][1]), schema)
        calls, finish = {}, None
        for ch in client.chat.completions.create(**kw, stream=True):
            for tc in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
                calls.setdefault(tc.index, ["", ""])
                calls[tc.index][0] += tc.function.name or ""
                calls[tc.index][1] += tc.function.arguments or ""
            finish = (ch.choices[0].finish_reason if ch.choices else None) or finish
        assert finish == "tool_calls" and [tuple(calls[k]) for k in sorted(calls)] == got


def test_the_grammar_writes_deepseek_v3s_format(server):
    """The raw text llguidance's tool-call grammar makes the model write (the chat endpoint's plan, sent to /generate
    so the text comes back unparsed): DeepSeek V3's markers around one call, which the parser reads back."""
    from sglang.srt.function_call.tool_plan import plan_tools
    from sglang.srt.function_call.tool_types import Tool

    plan = plan_tools([Tool.model_validate(t) for t in TOOLS], "required", False, "deepseekv3", (), "llguidance")
    r = requests.post(f"{server.base_url}/generate", timeout=60, json={
        "text": "Call a tool:", "sampling_params": {"ebnf": plan.ebnf, "max_new_tokens": 160, "temperature": 0}})
    raw = r.json()["text"]
    assert raw.startswith("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"), raw
    assert raw.endswith("```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"), raw
    content, calls = parse_tool_calls(make_detector("deepseekv3"), raw, {"get_weather", "get_time"})
    assert content == "" and len(calls) == 1


BAD = [
    ({"extra_body": {"regex": "[0-9"}}, "regex", "llguidance could not compile it"),
    ({"extra_body": {"ebnf": 'root ::= "a" (= "b") "b"'}}, "ebnf", "Lark"),
    ({"extra_body": {"ebnf": "root ::= missing"}}, "ebnf", "missing"),
    ({"extra_body": {"json_schema": '{"type": "object", "required": "a"}'}}, "json_schema", "required"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objec"}}}},
     "response_format", "objec"),
    # xgrammar (the arrival check) accepts it, llguidance's compile refuses it: the 400 still names response_format
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"not": {"type": "string"}}}}}}},
     "response_format", 'Invalid value for response_format: llguidance could not compile it: Unimplemented keys: ["not"]'),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objectx"}}}],
      "tool_choice": "required"}, "tools[0].function.parameters", "objectx"),
    ({"tools": [TOOLS[0], TOOLS[0]], "tool_choice": "required"}, "tools[1].function.name", "'get_weather'"),
]


@pytest.mark.parametrize("extra,param,words", BAD)
def test_bad_grammars_are_400_naming_the_field_and_the_server_keeps_serving(client, extra, param, words):
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model="default", messages=MSG, max_tokens=8, **extra)
    err = ei.value.body
    assert ei.value.status_code == 400 and err["param"] == param and words in err["message"], err
    assert not INTERNAL_LOCATION.search(err["message"]), err["message"]
    ok = client.chat.completions.create(model="default", messages=MSG, max_tokens=4, extra_body={"regex": "ok"})
    assert ok.choices[0].message.content == "ok"


EMPTY_LANGUAGE = [("ebnf", "root ::= root"), ("regex", r"[^\s\S]"),
                  ("json_schema", json.dumps({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}))]


def test_a_grammar_no_string_matches_is_a_400_after_its_compile(server):
    """llguidance's grammars are checked after their compile (the edge reads only xgrammar's): its matcher then
    allows only the stop token while not accepting. A 400 naming the field, no fault, no ERROR logged."""
    before = scheduler_stats(server.base_url)["num_faults"]
    for kind, text in EMPTY_LANGUAGE:
        r = requests.post(f"{server.base_url}/generate", timeout=60,
                          json={"text": "hi", "sampling_params": {"max_new_tokens": 4, kind: text}})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == kind and "matches no string" in r.json()["message"], r.text
    ok = requests.post(f"{server.base_url}/generate", timeout=60,
                       json={"text": "hi", "sampling_params": {"max_new_tokens": 4, "regex": "(yes|no)"}})
    assert ok.status_code == 200 and ok.json()["text"] in ("yes", "no"), ok.text
    assert scheduler_stats(server.base_url)["num_faults"] == before and " ERROR " not in server.log(), server.log()[-3000:]


# each can begin ("a") but llguidance's matcher then allows only the stop token, where the output may not end: a
# never-finishing grammar (the edge's analysis reads only xgrammar's grammars) and one SmolLM2's tokenizer cannot spell
DEAD_AFTER_A = [("ebnf", 'root ::= "a" rest\nrest ::= rest'), ("regex", "a\\x04")]


def test_a_grammar_that_stalls_after_a_prefix_is_a_400_mid_generation(server):
    before = scheduler_stats(server.base_url)["num_faults"]
    for kind, text in DEAD_AFTER_A:
        r = requests.post(f"{server.base_url}/generate", timeout=60,
                          json={"text": "hi", "sampling_params": {"max_new_tokens": 8, kind: text}})
        assert r.status_code == 400 and r.json()["error"]["param"] == kind, r.text
        assert "the grammar admits no continuation after 1 tokens" in r.json()["message"], r.text
    ok = requests.post(f"{server.base_url}/generate", timeout=60,
                       json={"text": "hi", "sampling_params": {"max_new_tokens": 4, "regex": "(yes|no)"}})
    assert ok.status_code == 200 and ok.json()["text"] in ("yes", "no"), ok.text
    assert scheduler_stats(server.base_url)["num_faults"] == before and " ERROR " not in server.log(), server.log()[-3000:]


def test_outlines_is_refused_at_launch_naming_the_backends_that_work():
    """An upstream launch line with --grammar-backend outlines stops with the reason and the two that work."""
    import subprocess
    import sys

    from sglang.test.test_utils import find_free_port

    out = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--grammar-backend", "outlines",
                          "--port", str(find_free_port()), *DEFAULT_SMALL_SERVER_ARGS],
                         capture_output=True, text=True, timeout=300)
    log = out.stdout + out.stderr
    assert out.returncode != 0, log[-3000:]
    assert "--grammar-backend outlines is not supported" in log and "bitmask" in log, log[-3000:]
    assert "--grammar-backend xgrammar" in log and "--grammar-backend llguidance" in log
