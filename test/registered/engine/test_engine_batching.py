"""Continuous batching, prefix caching, retraction under a tiny KV pool, streaming and stop handling."""

import pytest

from sglang import Engine
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import PROMPTS, shutdown

register_cpu_ci(est_time=250, suite="cpu")

GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine():
    e = Engine(dtype="float32", max_total_memory_gb=3, chunked_prefill_size=256, log_level="warning")
    yield e
    shutdown(e)


def alone(engine, prompts, max_new):
    outs = []
    for p in prompts:
        engine.flush_cache()
        outs.append(engine.generate(p, dict(GREEDY, max_new_tokens=max_new))["output_ids"])
    engine.flush_cache()
    return outs


def unretracted(engine, prompts, max_new):
    """The batch's greedy tokens on the module's engine, whose pool holds it whole: no retraction (batched equals
    each alone: the test below), the reference for the tiny-pool engines' retracted runs."""
    engine.flush_cache()
    before = engine.scheduler.num_retractions
    outs = engine.generate(prompts, dict(GREEDY, max_new_tokens=max_new))
    assert engine.scheduler.num_retractions == before
    engine.flush_cache()
    return [o["output_ids"] for o in outs]


def test_16_concurrent_equal_each_alone(engine):
    prompts = [PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)) + str(i) for i in range(16)]
    ref = alone(engine, prompts, 12)  # 16 runs alone are most of this module's time: 12 tokens each
    outs = engine.generate(prompts, dict(GREEDY, max_new_tokens=12))
    assert [o["output_ids"] for o in outs] == ref
    engine.scheduler.check_integrity()


def test_shared_prefix_hits_cache_and_keeps_output(engine):
    system = "You are a helpful assistant who answers briefly and precisely. " * 6
    prompts = [system + q for q in ("What is 2+2?", "Name a color.", "Say hello.", "Count to three.")]
    ref = alone(engine, prompts, 12)
    before = engine.scheduler.total_cached_tokens
    engine.generate(prompts[0], dict(GREEDY, max_new_tokens=1))  # warm the cache with the shared prefix
    outs = engine.generate(prompts, dict(GREEDY, max_new_tokens=12))
    hits = [o["meta_info"]["cached_tokens"] for o in outs]
    assert all(h > 50 for h in hits), hits
    assert engine.scheduler.total_cached_tokens - before >= sum(hits)
    assert [o["output_ids"] for o in outs] == ref
    engine.scheduler.check_integrity()


def test_long_prompt_is_chunked_and_correct(engine):
    long_prompt = "Here is a long story about a cat. " * 40  # ~360 tokens > chunked_prefill_size 256
    n = len(engine.tokenizer.encode(long_prompt))
    assert n > engine.scheduler.chunked_prefill_size
    ref = alone(engine, [long_prompt], 8)[0]
    # alongside short requests: the chunked request must not disturb them or itself
    outs = engine.generate([long_prompt, PROMPTS[0], PROMPTS[1]], dict(GREEDY, max_new_tokens=8))
    assert outs[0]["output_ids"] == ref
    engine.scheduler.check_integrity()


def test_streaming_matches_non_streaming(engine):
    params = {"temperature": 0, "max_new_tokens": 30}
    full = engine.generate("Write a haiku about the sea:", params)
    chunks = list(engine.generate("Write a haiku about the sea:", params, stream=True))
    # cumulative chunks, like /generate's SSE events: each extends the one before
    for prev, cur in zip(chunks, chunks[1:]):
        assert cur["text"].startswith(prev["text"])
        assert cur["output_ids"][: len(prev["output_ids"])] == prev["output_ids"]
    assert chunks[-1]["text"] == full["text"] and chunks[-1]["output_ids"] == full["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"] == full["meta_info"]["finish_reason"]
    assert len(chunks) > 3
    engine.scheduler.check_integrity()


def test_stop_string_and_stop_token(engine):
    params = dict(GREEDY, max_new_tokens=40)
    base = engine.generate(PROMPTS[1], params)
    text = base["text"]
    stop = text[len(text) // 3: len(text) // 3 + 3]
    assert stop.strip(), text
    out = engine.generate(PROMPTS[1], dict(params, stop=[stop]))
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["text"] == text[: text.index(stop)]
    # a stop token id: the 5th generated token
    tok = base["output_ids"][4]
    first = base["output_ids"].index(tok)
    out = engine.generate(PROMPTS[1], dict(params, stop_token_ids=[tok]))
    assert out["output_ids"] == base["output_ids"][: first + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": tok}
    engine.scheduler.check_integrity()


def test_seeded_sampling_reproducible_and_n(engine):
    params = {"temperature": 0.9, "top_p": 0.9, "max_new_tokens": 16, "seed": 1234}
    a = engine.generate(PROMPTS[2], params)
    b = engine.generate(PROMPTS[2], params)
    assert a["output_ids"] == b["output_ids"]
    outs = engine.generate(PROMPTS[2], {"temperature": 1.0, "max_new_tokens": 16, "n": 3})
    assert len(outs) == 3
    engine.scheduler.check_integrity()


def test_multibyte_characters_never_split(engine):
    out = engine.generate("Translate to Chinese and add emoji: I love cats ->",
                          {"temperature": 0.8, "max_new_tokens": 40, "seed": 3})
    assert "\ufffd" not in out["text"]
    chunks = list(engine.generate("Emoji party: 🎉🐱🚀", {"temperature": 0.8, "max_new_tokens": 40, "seed": 5},
                                  stream=True))
    for c in chunks[:-1]:
        assert "\ufffd" not in c["text"]


def test_retraction_under_tiny_pool(engine):
    prompts = [PROMPTS[i % len(PROMPTS)] + f" (request {i})" for i in range(8)]
    ref = unretracted(engine, prompts, 40)
    # 8 x (~11 prompt + 40 new) tokens, ~1.7x the pool: requests are retracted
    tiny = Engine(dtype="float32", max_total_tokens=240, chunked_prefill_size=128, log_level="warning")
    try:
        outs = tiny.generate(prompts, dict(GREEDY, max_new_tokens=40))
        assert tiny.scheduler.num_retractions > 0
        assert [o["output_ids"] for o in outs] == ref
        tiny.scheduler.check_integrity()
        assert tiny.scheduler.get_stats()["num_used_tokens"] == 0
    finally:
        shutdown(tiny)


def test_retraction_with_pages(engine):
    prompts = [PROMPTS[i % len(PROMPTS)] + f" #{i}" for i in range(8)]
    ref = unretracted(engine, prompts, 32)
    # 8 x (~8 prompt + 32 new) tokens in 4-token pages, ~1.25x the pool: requests are retracted
    tiny = Engine(dtype="float32", max_total_tokens=264, page_size=4, chunked_prefill_size=128,
                  log_level="warning")
    try:
        outs = tiny.generate(prompts, dict(GREEDY, max_new_tokens=32))
        assert tiny.scheduler.num_retractions > 0
        assert [o["output_ids"] for o in outs] == ref
        # shared prefixes with page-aligned caching
        outs2 = tiny.generate(prompts, dict(GREEDY, max_new_tokens=32))
        assert [o["output_ids"] for o in outs2] == ref
        tiny.scheduler.check_integrity()
    finally:
        shutdown(tiny)


def test_retraction_bf16_cpu_kernels():
    """The default bf16 path (fused CPU decode attention reading the pool through req_to_token) under retraction
    with pages: every request finishes, the pools come back whole, and a rerun of the same batch from a flushed
    cache reproduces it token for token."""
    engine = Engine(dtype="bfloat16", max_total_tokens=384, page_size=4, chunked_prefill_size=128,
                    log_level="warning")
    try:
        prompts = [PROMPTS[i % len(PROMPTS)] + f" #{i}" for i in range(8)]
        params = dict(GREEDY, max_new_tokens=50, ignore_eos=True)
        outs = engine.generate(prompts, params)
        assert engine.scheduler.num_retractions > 0
        assert all(len(o["output_ids"]) == 50 for o in outs)
        engine.scheduler.check_integrity()
        assert engine.scheduler.get_stats()["num_used_tokens"] == 0
        engine.scheduler.flush_cache()
        again = engine.generate(prompts, params)
        assert [o["output_ids"] for o in again] == [o["output_ids"] for o in outs]
        engine.scheduler.check_integrity()
    finally:
        shutdown(engine)


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
