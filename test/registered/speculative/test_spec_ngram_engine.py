"""NGRAM speculative decoding through sglang.Engine changes no token: the same engine (float32) decodes with its
SpecDecoder and with it swapped out (scheduler.runner.spec = None while idle) and gives the same tokens, text,
finish reasons and target logprobs (within 1e-4) on 8 prompts that repeat text -- so proposals are made, and some
rejected -- under a 32-token chunked prefill and a pool small enough to force retraction, with stop strings, a JSON
schema, a prefix hit (the same prompt twice), the overlap schedule, and at tp=2 (a random-weight Qwen3). Memory is intact and
idle after each run, and the counters add up (proposed > accepted > 0; meta_info spec_verify_ct)."""

import pytest

from sglang import Engine
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import assert_idle_and_intact, make_random_qwen3, shutdown
from sglang.test.spec_fixtures import spec_off

register_cpu_ci(est_time=60, suite="cpu")

PROMPTS = [
    "Copy the line twice.\nLine: the red fox jumps over the lazy dog.\nCopy 1: the red fox jumps over the lazy dog.\n"
    "Copy 2:",
    "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n    return a + b\n\n\ndef",
    'Echo the JSON.\n{"name": "Ada", "age": 36, "city": "London"}\nEcho: {"name": "Ada",',
    "one two three four five six seven. one two three four five six seven. one two three",
    "A B C D A B C D A B C D A B",
    "Quote: 'To be, or not to be, that is the question.' Again: 'To be, or not to",
    "for i in range(10):\n    print(i)\nfor i in range(10):\n    print(i)\nfor",
    "Monday Tuesday Wednesday Thursday Friday. Monday Tuesday Wednesday",
]
NEW_TOKENS = 24
JSON_SCHEMA = ('{"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, '
               '"city": {"type": "string"}}, "required": ["name", "age", "city"]}')


def params():
    base = {"temperature": 0, "max_new_tokens": NEW_TOKENS}
    ps = [dict(base, ignore_eos=True) for _ in PROMPTS]
    ps[1]["stop"] = ["\n    return"]  # stop strings the continuations reach (after a few verified tokens)
    ps[4]["stop"] = ["The answer"]
    # structured output: the grammar advances over accepted tokens only (proposals come from the prompt's JSON)
    ps[2] = dict(base, json_schema=JSON_SCHEMA)
    return ps


@pytest.fixture(scope="module")
def engine():
    # 256 tokens hold a few of the 8 requests (~30 prompt + 24 new tokens each), and a low conservativeness admits
    # them without reserving room for their new tokens: every run retracts
    e = Engine(dtype="float32", speculative_algorithm="NGRAM", chunked_prefill_size=32, max_total_tokens=256,
               schedule_conservativeness=0.05, log_level="warning")
    yield e
    shutdown(e)


_reference = []  # the 8 prompts decoded without speculation, computed once (after the first speculative run)


def reference(engine):
    if not _reference:
        with spec_off(engine):
            _reference.append(run(engine))
    return _reference[0]


def run(engine, prompts=PROMPTS, ps=None, **kw):
    outs = engine.generate(prompts, ps or params(), return_logprob=True, top_logprobs_num=2, **kw)
    assert_idle_and_intact(engine)
    return outs


def close(x, y):
    return x == y or abs(x - y) <= 1e-4  # equal covers -inf (a token the grammar masks)


def assert_same(got, want):
    for a, b in zip(got, want):
        assert a["output_ids"] == b["output_ids"]
        assert a["text"] == b["text"]
        assert a["meta_info"]["finish_reason"] == b["meta_info"]["finish_reason"]
        for (lp_a, tok_a, _), (lp_b, tok_b, _) in zip(a["meta_info"]["output_token_logprobs"],
                                                      b["meta_info"]["output_token_logprobs"]):
            assert tok_a == tok_b and close(lp_a, lp_b), (lp_a, lp_b)
        for ta, tb in zip(a["meta_info"]["output_top_logprobs"], b["meta_info"]["output_top_logprobs"]):
            assert [t[1] for t in ta] == [t[1] for t in tb]
            assert all(close(x[0], y[0]) for x, y in zip(ta, tb)), (ta, tb)


def stats(engine):
    return engine.scheduler.get_stats()


def test_greedy_equal_with_chunking_retraction_and_stops(engine):
    before = stats(engine)
    got = run(engine)
    after = stats(engine)
    proposed = after["spec_proposed_tokens"] - before["spec_proposed_tokens"]
    accepted = after["spec_accepted_tokens"] - before["spec_accepted_tokens"]
    assert proposed > accepted > 0, (proposed, accepted)
    assert after["num_retractions"] > before["num_retractions"]
    assert_same(got, reference(engine))
    assert [got[i]["meta_info"]["finish_reason"]["matched"] for i in (1, 4)] == ["\n    return", "The answer"]
    assert sum(o["meta_info"]["spec_verify_ct"] for o in got) > 0
    assert got[2]["meta_info"]["spec_verify_ct"] > 0  # the JSON-schema request verified proposals too
    info = engine.get_server_info()["speculative"]
    assert info["algorithm"] == "NGRAM" and info["num_draft_tokens"] == 8
    assert info["accepted_tokens"] == after["spec_accepted_tokens"] and info["accept_length"] > 1


def test_prefix_hit_gives_same_output(engine):
    engine.flush_cache()
    p, ps = [PROMPTS[3]], [params()[3]]
    first = run(engine, p, ps)
    second = run(engine, p, ps)
    assert second[0]["meta_info"]["cached_tokens"] > 0
    with spec_off(engine):
        want = run(engine, p, ps)
    assert_same(first, want)
    assert_same(second, want)


def test_overlap_schedule(engine):
    from sglang.srt.managers.overlap_worker import OverlapSchedule

    s = engine.scheduler
    ov = OverlapSchedule(s.sink)
    s.overlap = ov
    try:
        got = run(engine)
    finally:
        s.overlap = None
        ov.shutdown()
    assert ov.num_overlapped_steps > 0
    assert_same(got, reference(engine))


def test_tp2_random_qwen3(tmp_path):
    path = make_random_qwen3(str(tmp_path / "m"))
    ids = [[5, 17, 300, 42, 9, 5, 17, 300, 42, 9, 5, 17], [7] * 12, list(range(20, 40)) * 2]
    e = Engine(model_path=path, dtype="float32", skip_tokenizer_init=True, tp_size=2, max_total_memory_gb=0.5,
               speculative_algorithm="NGRAM", log_level="warning")
    try:
        sp = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}
        got = e.generate(input_ids=ids, sampling_params=sp, return_logprob=True)
        assert_idle_and_intact(e)
        assert stats(e)["spec_verify_steps"] > 0
        with spec_off(e):
            want = e.generate(input_ids=ids, sampling_params=sp, return_logprob=True)
        for a, b in zip(got, want):
            assert a["output_ids"] == b["output_ids"]
            for x, y in zip(a["meta_info"]["output_token_logprobs"], b["meta_info"]["output_token_logprobs"]):
                assert abs(x[0] - y[0]) <= 1e-4
    finally:
        shutdown(e)


def test_refused_for_embedding_linear_and_windowed_models():
    from types import SimpleNamespace

    from sglang.srt.managers.spec_decode import check_spec_model
    from sglang.srt.server_args import ServerArgs

    a = ServerArgs(speculative_algorithm="NGRAM", is_embedding=True)
    with pytest.raises(ValueError, match="--is-embedding: an embedding server decodes nothing"):
        check_spec_model(a.speculative(), a, None, 0)
    a = ServerArgs(speculative_algorithm="NGRAM")
    hybrid = SimpleNamespace(model_type="qwen3_next", layer_kinds=("linear", "linear", "linear", "full"))
    with pytest.raises(ValueError, match="qwen3_next has linear-attention / state-space layers"):
        check_spec_model(a.speculative(), a, hybrid, 0)
    dense = SimpleNamespace(model_type="gemma3", layer_kinds=())
    with pytest.raises(ValueError, match=r"gemma3 has windowed-attention layers \(window 512 tokens\)"):
        check_spec_model(a.speculative(), a, dense, 512)
    check_spec_model(a.speculative(), a, dense, 0)  # a dense model is served
    check_spec_model(None, a, hybrid, 512)  # without speculation everything is
