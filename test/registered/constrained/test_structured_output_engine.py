"""Constrained decoding end to end through sglang.Engine on the default model: 20 JSON schemas x 5 prompts at
temperature 0 and 0.8 (checked by `jsonschema`), regex full matches, EBNF output checked by an independent parser,
logit_bias against the unbiased logprobs, n > 1, chunked prefill + prefix cache, compiles off the critical path,
invalid grammars, aborts mid-grammar, and retraction under a tiny pool."""

import json
import re
import threading
import time

import jsonschema
import pytest

from sglang import Engine
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import assert_idle_and_intact, shutdown

from schemas import PROMPTS, SCHEMAS  # noqa: E402  (test/registered/constrained/schemas.py)

register_cpu_ci(est_time=200, suite="cpu")

# schemas.py bounds every string at 16 characters, but a character is up to 4 UTF-8 bytes, each up to a token of the
# default model's byte-level BPE: its longest schema (two items of a 16-character sku) then needs up to 2 x 16 x 4
# tokens of strings and ~30 of JSON around them. At 80, a sampled run of 2-byte characters ran out (finish 'length').
MAX_NEW = 160


@pytest.fixture(scope="module")
def engine():
    e = Engine(chunked_prefill_size=64, log_level="warning")
    yield e
    shutdown(e)


@pytest.fixture(autouse=True)
def intact_after(request):
    yield
    if "engine" in request.fixturenames:
        e = request.getfixturevalue("engine")
        assert_idle_and_intact(e)
        assert e.scheduler.get_stats()["num_live_grammar_matchers"] == 0


def live_matchers(engine):
    return engine.scheduler.grammar_backend.num_live_matchers


def test_20_schemas_x_5_prompts_all_validate_at_t0_and_t08(engine):
    prompts, params, schemas = [], [], []
    for temperature in (0.0, 0.8):
        for schema in SCHEMAS:
            for p in PROMPTS:
                prompts.append(p)
                params.append({"json_schema": json.dumps(schema), "max_new_tokens": MAX_NEW,
                               "temperature": temperature})
                schemas.append(schema)
    outs = engine.generate(prompts, params)  # one batch of 200 requests through one engine
    failures = []
    for o, schema in zip(outs, schemas):
        try:
            jsonschema.validate(json.loads(o["text"]), schema)
            assert o["meta_info"]["finish_reason"]["type"] == "stop"
        except Exception as e:  # noqa: BLE001 - collect every failure for the message
            failures.append((o["text"], o["meta_info"]["finish_reason"], str(e)[:120]))
    assert not failures, f"{len(failures)} of {len(outs)} invalid: {failures[:5]}"
    stats = engine.scheduler.get_stats()
    assert stats["grammar_compiles"] <= 20 + 1 and stats["grammar_cache_entries"] >= 20  # one compile per schema


@pytest.mark.parametrize("pattern", [r"\d{3}-\d{4}", r"(cat|dog|bird)s?", r"[A-Z][a-z]{2,8} [A-Z][a-z]{2,8}",
                                     r"(true|false)", r"-?[0-9]{1,4}\.[0-9]{2}"])
def test_regex_outputs_full_match(engine, pattern):
    outs = engine.generate(PROMPTS, {"regex": pattern, "temperature": 0.8, "max_new_tokens": 32})
    for o in outs:
        assert re.fullmatch(pattern, o["text"]), (pattern, o["text"])


EBNF = r'''
root ::= "[" item ("," item)? ("," item)? "]"
item ::= number | word
number ::= [1-9] [0-9]? [0-9]?
word ::= "\"" [a-z] [a-z]? [a-z]? [a-z]? "\""
'''


def parse_list(text):
    """Independent recursive-descent parser of the EBNF above: a list of 1 to 3 items, each a 1..3 digit number or a
    1..4 letter word."""
    pos = 0

    def expect(ch):
        nonlocal pos
        assert text[pos] == ch, (text, pos)
        pos += 1

    def item():
        nonlocal pos
        m = re.compile(r'[1-9][0-9]{0,2}|"[a-z]{1,4}"').match(text, pos)
        assert m, (text, pos)
        pos = m.end()
        return json.loads(m.group())

    expect("[")
    items = [item()]
    while text[pos] == ",":
        pos += 1
        items.append(item())
    expect("]")
    assert pos == len(text) and len(items) <= 3, text
    return items


def test_ebnf_outputs_parse(engine):
    outs = engine.generate(PROMPTS * 2, [{"ebnf": EBNF, "temperature": t, "max_new_tokens": 48}
                                         for t in (0.0, 0.8) for _ in PROMPTS])
    for o in outs:
        items = parse_list(o["text"])
        assert items == json.loads(o["text"])  # and it is the JSON list it looks like


def test_logit_bias_forces_and_bans_against_unbiased_logprobs(engine):
    prompt = "The capital of France is"
    base = engine.generate(prompt, {"temperature": 0, "max_new_tokens": 1}, return_logprob=True, top_logprobs_num=5)
    top = [tid for _, tid, _ in base["meta_info"]["output_top_logprobs"][0]]
    assert base["output_ids"][0] == top[0]
    banned = engine.generate(prompt, {"temperature": 0, "max_new_tokens": 1, "logit_bias": {str(top[0]): -100}})
    assert banned["output_ids"][0] == top[1]  # the runner-up of the unbiased logits
    forced_id = 12345
    assert forced_id not in top
    for temperature in (0.0, 0.8):
        forced = engine.generate(prompt, {"temperature": temperature, "max_new_tokens": 3,
                                          "logit_bias": {str(forced_id): 100}})
        assert forced["output_ids"] == [forced_id] * 3


def test_logit_bias_with_a_grammar_never_leaves_it(engine):
    digit_ids = [engine.tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    bias = {str(t): -100 for t in digit_ids[:9]}  # everything but 9 pushed down; the regex still holds
    o = engine.generate("Number:", {"regex": "[0-9]{4}", "temperature": 0, "max_new_tokens": 8, "logit_bias": bias})
    assert o["text"] == "9999"


def test_n_greater_than_1_and_chunked_prefill_with_prefix_cache(engine):
    schema = SCHEMAS[0]
    long_prompt = "Here is a long description of a person who lives in a small town by the sea. " * 12
    assert len(engine.tokenizer.encode(long_prompt)) > 64 * 2  # several prefill chunks
    params = {"json_schema": json.dumps(schema), "temperature": 0.8, "max_new_tokens": MAX_NEW, "n": 3}
    first = engine.generate(long_prompt + "JSON:", params)
    again = engine.generate(long_prompt + "JSON:", params)
    assert len(first) == 3 and len(again) == 3
    assert any(o["meta_info"]["cached_tokens"] > 0 for o in again)
    for o in first + again:
        jsonschema.validate(json.loads(o["text"]), schema)


def test_invalid_grammars_raise_with_xgrammar_message_and_engine_keeps_serving(engine):
    for sp, words in [({"json_schema": '{"type": "objec"}'}, "Unsupported type"),
                      ({"regex": "(a"}, "Regex parsing error"), ({"ebnf": "root ::= bar"}, 'Rule "bar"')]:
        with pytest.raises(ValueError, match=words) as ei:
            engine.generate("Hi", dict(sp, max_new_tokens=4))
        assert ei.value.param == next(iter(sp))
    assert engine.generate("Hi", {"regex": "ok", "max_new_tokens": 4})["text"] == "ok"


def add(engine, rid, prompt, **sp):
    ids = engine.tokenizer.encode(prompt)
    engine.scheduler.add_request(TokenizedGenerateReqInput(rid, prompt, ids, SamplingParams.from_dict(sp)))


def test_compile_failure_in_scheduler_fails_only_that_request(engine, monkeypatch):
    cache = engine.scheduler.grammar_backend.cache

    def failing(kind, text):
        raise RuntimeError("[12:00:00] /x/y.cc:1: injected compile failure")

    monkeypatch.setattr(cache, "_compile_fn", failing)
    add(engine, "bad", "Hi", regex="never-compiled-[a-z]", max_new_tokens=4)
    add(engine, "good", "Hi", max_new_tokens=4, temperature=0)
    outs = {}
    while engine.scheduler.has_work():
        for out in engine.scheduler.step():
            outs.setdefault(out.rid, []).append(out)
    bad = outs["bad"][-1].finish_reason
    assert bad["status_code"] == 400 and "injected compile failure" in bad["message"] and "/x/y.cc" not in bad["message"]
    assert outs["good"][-1].finish_reason["type"] in ("stop", "length")


def test_slow_compile_does_not_stall_other_requests(engine, monkeypatch):
    cache = engine.scheduler.grammar_backend.cache
    real, release = cache._compile_fn, threading.Event()

    def slow(kind, text):
        release.wait(600)
        return real(kind, text)

    monkeypatch.setattr(cache, "_compile_fn", slow)
    add(engine, "slow", "Pick:", regex="(yes|no)", max_new_tokens=4)
    add(engine, "free", "Count to ten:", max_new_tokens=4, temperature=0, ignore_eos=True)
    finished = []
    while "free" not in finished:
        finished += [o.rid for o in engine.scheduler.step() if o.finished]
    assert "slow" not in finished and len(engine.scheduler.grammar_backend) == 1  # still compiling, others ran
    release.set()
    while engine.scheduler.has_work():
        finished += [o.rid for o in engine.scheduler.step() if o.finished]
    assert "slow" in finished


def test_abort_mid_grammar_and_while_compiling_leaves_nothing(engine, monkeypatch):
    schema = json.dumps(SCHEMAS[10])
    for i in range(4):
        add(engine, f"a{i}", PROMPTS[i], json_schema=schema, max_new_tokens=MAX_NEW, temperature=0.8)
    deadline = time.time() + 600
    while not all(len(engine.scheduler.reqs[f"a{i}"].output_ids) >= 3 for i in range(4)):  # mid-JSON
        assert time.time() < deadline
        engine.scheduler.step()
    assert live_matchers(engine) == 4 and all(len(engine.scheduler.reqs[f"a{i}"].output_ids) > 0 for i in range(4))
    for i in range(4):
        engine.scheduler.abort_request(f"a{i}")
    cache, release = engine.scheduler.grammar_backend.cache, threading.Event()
    real = cache._compile_fn
    monkeypatch.setattr(cache, "_compile_fn", lambda k, t: (release.wait(600), real(k, t))[1])
    add(engine, "compiling", "Hi", regex="[a-z]{3}-waiting", max_new_tokens=8)
    engine.scheduler.step()
    engine.scheduler.abort_request("compiling")
    release.set()
    while engine.scheduler.has_work():
        engine.scheduler.step()
    assert live_matchers(engine) == 0 and len(engine.scheduler.grammar_backend) == 0


def test_retraction_with_grammars_keeps_outputs_valid():
    """A tiny pool forces retraction: a retracted request re-prefills its output and keeps its matcher (its state is
    a function of output_ids alone), so every output still validates and the pools come back whole."""
    e = Engine(max_total_tokens=256, chunked_prefill_size=128, log_level="warning")
    try:
        # ~64 output tokens each (16 three-digit numbers, one token per digit): 8 of them cannot fit at once
        schemas = [{"type": "array", "items": {"type": "integer", "minimum": 100 + 100 * i, "maximum": 199 + 100 * i},
                    "minItems": 16, "maxItems": 16} for i in range(8)]
        prompts = [PROMPTS[i % len(PROMPTS)] + f" (record {i})" for i in range(len(schemas))]
        params = [{"json_schema": json.dumps(s), "temperature": t, "max_new_tokens": 96}
                  for s, t in zip(schemas, (0.0, 0.8) * 4)]
        outs = e.generate(prompts, params)
        assert e.scheduler.num_retractions > 0
        for o, s in zip(outs, schemas):
            jsonschema.validate(json.loads(o["text"]), s)
        assert_idle_and_intact(e)
        assert e.scheduler.grammar_backend.num_live_matchers == 0
    finally:
        shutdown(e)


def test_grammar_backend_none_refuses_grammars_naming_the_flag(engine, monkeypatch):
    """What Engine(grammar_backend="none") wires (no scheduler backend, the edge told): the edge answers a 400 naming
    the field and the flag; a request that reaches the scheduler anyway finishes with the same 400."""
    monkeypatch.setattr(engine.request_tokenizer, "grammar_backend", "none")
    monkeypatch.setattr(engine.scheduler, "grammar_backend", None)
    with pytest.raises(ValueError, match="--grammar-backend none") as ei:
        engine.generate("Hi", {"json_schema": "{}", "max_new_tokens": 4})
    assert ei.value.param == "json_schema"
    add(engine, "direct", "Hi", regex="a+", max_new_tokens=4)
    out = engine.scheduler.step()[-1]
    assert out.finish_reason["status_code"] == 400 and "--grammar-backend none" in out.finish_reason["message"]
    assert engine.generate("Hi", {"max_new_tokens": 2, "temperature": 0})["meta_info"]["completion_tokens"] == 2
