"""The two grammar engines (--grammar-backend xgrammar / llguidance) on the served model's real tokenizer, without a
model: an output drawn token by token from one engine's masks is accepted, token for token, by the other engine's
matcher, and independently checked (the JSON parses and validates with `jsonschema`, the regex fullmatches); both
terminate on the stop token. Then llguidance's ebnf (Lark, GBNF translated, forms it refuses), the tool_choice
grammar it gets (Lark with %json), bad grammars' messages without internal source locations under both engines,
and the launch refusal of outlines."""

import json
import random
import re

import jsonschema
import pytest
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="cpu")

pytest.importorskip("xgrammar")
pytest.importorskip("llguidance")

from schemas import SCHEMAS  # noqa: E402  (test/registered/constrained/schemas.py)

from sglang.srt.constrained.backend_table import WORKING_BACKENDS, engine_class, grammar_backend_refusal  # noqa
from sglang.srt.constrained.grammar_check import check_request_grammar  # noqa: E402
from sglang.srt.sampling.validation import ParamError  # noqa: E402

REGEXES = [r"[A-Z]{3}-[0-9]{3}", r"(yes|no|maybe)", r"[a-z]{2,6}@[a-z]{2,5}\.(com|org)", r"-?[1-9][0-9]{0,3}"]
EBNF = 'root ::= "answer: " ("yes" | "no")'
INTERNAL_LOCATION = re.compile(r"\.(cc|cpp|h|rs):\d+|\[\d+:\d+:\d+\]")


@pytest.fixture(scope="module")
def tokenizer():
    from sglang.srt.model_loader.model_path import resolve_model_path
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    return get_tokenizer(resolve_model_path(ServerArgs(), dense_linears=False))


@pytest.fixture(scope="module")
def engines(tokenizer):
    vocab = len(tokenizer)
    return {name: engine_class(name)(tokenizer, vocab, [tokenizer.eos_token_id]) for name in WORKING_BACKENDS}


def allowed(matcher, vocab):
    words = torch.zeros(2, (vocab + 31) // 32, dtype=torch.int32)
    matcher.fill_next_token_bitmask(words, 1)  # row 1: the row index is honoured
    assert not words[0].any()
    bits = ((words[1].unsqueeze(1) >> torch.arange(32)) & 1).reshape(-1)[:vocab]
    return torch.nonzero(bits).flatten().tolist()


_COMPILED = {}


def compiled(engine, kind, text):
    """Each grammar compiled once per engine for the module (the compile against 49k tokens is the slow part)."""
    key = (engine.name, kind, text)
    if key not in _COMPILED:
        _COMPILED[key] = engine.compile(kind, text)
    return _COMPILED[key]


def walk(tokenizer, engines, driver, kind, text, seed, max_steps=160):
    """Tokens drawn uniformly from `driver`'s masks (the stop token whenever allowed, with probability 1/2); every
    token is fed to both engines' matchers. Returns the tokens before the stop token. One known difference is left
    out: xgrammar bounds the fraction digits of a number with a range (~6), llguidance does not."""
    rng, eos, vocab = random.Random(seed), tokenizer.eos_token_id, len(tokenizer)
    if driver == "llguidance" and '"number"' in text:
        engines = {driver: engines[driver]}
    matchers = {name: e.matcher(compiled(e, kind, text)) for name, e in engines.items()}
    out = []
    for _ in range(max_steps):
        choices = allowed(matchers[driver], vocab)
        assert choices, (driver, kind, text, out)
        tok = eos if eos in choices and rng.random() < 0.5 else rng.choice(choices)
        for name, m in matchers.items():
            assert m.accept_token(tok), (name, "rejected", tokenizer.decode([tok]), "after", tokenizer.decode(out),
                                         driver, kind, text)
        if tok == eos:
            assert all(m.is_terminated() for m in matchers.values())
            return out
        assert not any(m.is_terminated() for m in matchers.values())
        out.append(tok)
    pytest.fail(f"{kind} {text!r}: no stop token within {max_steps} tokens under {driver}")


@pytest.mark.parametrize("driver", ["xgrammar", "llguidance"])
def test_each_engines_outputs_are_accepted_by_the_other_and_valid(engines, tokenizer, driver):
    for i, schema in enumerate(SCHEMAS[::2]):  # ten of the twenty: nested objects, arrays, enums, ranges, null
        text = tokenizer.decode(walk(tokenizer, engines, driver, "json_schema", json.dumps(schema), seed=i))
        jsonschema.validate(json.loads(text), schema)
        assert ": " in text or not isinstance(schema.get("properties"), dict)  # the compact layout, both engines
    for i, pattern in enumerate(REGEXES):
        assert re.fullmatch(pattern, tokenizer.decode(walk(tokenizer, engines, driver, "regex", pattern, seed=i)))
    assert tokenizer.decode(walk(tokenizer, engines, driver, "ebnf", EBNF, seed=0)) in ("answer: yes", "answer: no")


def test_llguidance_ebnf_takes_lark_and_translatable_gbnf_and_refuses_the_rest(engines, tokenizer):
    only = {"llguidance": engines["llguidance"]}
    lark = 'start: "id=" NUM ("," NUM)?\nNUM: /[0-9]{1,3}/\n'
    text = tokenizer.decode(walk(tokenizer, only, "llguidance", "ebnf", lark, seed=3))
    assert re.fullmatch(r"id=[0-9]{1,3}(,[0-9]{1,3})?", text), text
    gbnf = 'root ::= item ("," item){0,2}\nitem ::= [a-c]+'
    text = tokenizer.decode(walk(tokenizer, only, "llguidance", "ebnf", gbnf, seed=4))
    assert re.fullmatch(r"[a-c]+(,[a-c]+){0,2}", text), text
    check_request_grammar(("ebnf", lark), "llguidance")
    for refused, words in [('root ::= "a" (= "b") "b"', "Expected ')'"), ('root ::= [^\\0-\\x1f]', "\\0"),
                           ("root ::= missing", "missing")]:
        with pytest.raises(ParamError) as ei:
            check_request_grammar(("ebnf", refused), "llguidance")
        msg = str(ei.value)
        assert ei.value.param == "ebnf" and "llguidance could not compile it" in msg and words in msg, msg
        assert "Lark" in msg  # what to send instead


BAD = [("json_schema", '{"type": "objec"}'), ("json_schema", '{"type": "object", "required": "a"}'),
       ("json_schema", '{"type": "object", "properties": {"a": {"$ref": "#/defs/x"}}}'),
       ("regex", "[0-9"), ("ebnf", "root ::= missing")]


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
@pytest.mark.parametrize("kind,text", BAD)
def test_bad_grammars_are_param_errors_without_internal_locations(backend, kind, text):
    with pytest.raises(ParamError) as ei:
        check_request_grammar((kind, text), backend)
    msg = str(ei.value)
    assert ei.value.param == kind and f"{backend} could not compile it: " in msg, msg
    assert not INTERNAL_LOCATION.search(msg), msg


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_compile_errors_on_the_scheduler_side_have_no_internal_locations(engines, backend):
    from sglang.srt.constrained.grammar_check import invalid_grammar_error

    for kind, text in BAD:
        with pytest.raises(Exception) as ei:
            engines[backend].compile(kind, text)
        msg = str(invalid_grammar_error(kind, text, ei.value, backend))
        assert not INTERNAL_LOCATION.search(msg) and "could not compile it: " in msg, msg


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "ping"}}]


@pytest.mark.parametrize("parser,one_call", [("qwen25", True), ("llama3", False), ("mistral", False),
                                             ("deepseekv3", True), ("deepseekv3", False)])
def test_llguidance_tool_call_grammar_gives_calls_the_parser_reads(engines, tokenizer, parser, one_call):
    from sglang.srt.function_call.detectors import make_detector
    from sglang.srt.function_call.tool_call_stream import parse_tool_calls
    from sglang.srt.function_call.tool_plan import plan_tools
    from sglang.srt.function_call.tool_types import Tool

    tools = [Tool.model_validate(t) for t in TOOLS]
    plan = plan_tools(tools, "required", not one_call, parser, (), "llguidance")
    assert plan.forced and "%json" in plan.ebnf and plan.ebnf.startswith("start:")
    only = {"llguidance": engines["llguidance"]}
    for seed in range(2):
        text = tokenizer.decode(walk(tokenizer, only, "llguidance", "ebnf", plan.ebnf, seed, 400))
        content, calls = parse_tool_calls(make_detector(parser), text, {"get_weather", "ping"}, forced=True)
        assert content == "" and calls and (len(calls) == 1 or not one_call), text
        for call in calls:
            args = json.loads(call["function"]["arguments"])
            jsonschema.validate(args, WEATHER if call["function"]["name"] == "get_weather" else {"maxProperties": 0})


def test_bad_tool_schema_is_a_400_naming_the_field_under_both_engines():
    from sglang.srt.function_call.tool_plan import plan_tools
    from sglang.srt.function_call.tool_types import Tool
    from sglang.srt.managers.request_error import RequestError

    bad = [Tool.model_validate({"type": "function", "function": {"name": "f", "parameters": {"type": "objectx"}}})]
    for backend in WORKING_BACKENDS:
        with pytest.raises(RequestError) as ei:
            plan_tools(bad, "required", None, "qwen25", (), backend)
        e = ei.value
        assert e.status_code == 400 and e.param == "tools[0].function.parameters" and "'f'" in e.message, e.message
        assert "objectx" in e.message and not INTERNAL_LOCATION.search(e.message), e.message


def test_outlines_is_refused_at_launch_naming_the_backends_that_work():
    from types import SimpleNamespace

    from sglang.srt.constrained.backend import build_grammar_backend
    from sglang.srt.server_args import GRAMMAR_BACKEND_CHOICES

    assert {"xgrammar", "llguidance", "outlines", "none"} <= set(GRAMMAR_BACKEND_CHOICES)
    reason = grammar_backend_refusal("outlines")
    assert "xgrammar" in reason and "llguidance" in reason and "bitmask" in reason
    assert grammar_backend_refusal("llguidance") is None and grammar_backend_refusal("none") is None
    args = SimpleNamespace(grammar_backend="outlines", grammar_cache_mb=1, is_embedding=False)
    with pytest.raises(ValueError, match="outlines is not supported.*xgrammar.*llguidance"):
        build_grammar_backend(args, None, 100, [0], 4)


def test_a_missing_package_is_refused_with_the_install_command(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "llguidance" else real(n, *a))
    assert "needs the llguidance package" in grammar_backend_refusal("llguidance")
