"""Prompt logprobs through sglang.Engine (upstream's logprob_start_len / top_logprobs_num / token_ids_logprob) equal
HF transformers' fp32 log_softmax for 8 prompts within 1e-4: spanning 16-token chunks, without and with a prefix-cache
hit (a request that needs rows the cache holds recomputes them; one starting past the cached part uses the cache),
with max_new_tokens 0 (a prefill only) and with generation; bad fields are refused naming the field."""

import pytest

from sglang import Engine
from sglang.srt.sampling.validation import ParamError
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import default_model_dir, shutdown
from sglang.test.prompt_logprob_reference import (LOGPROB_PROMPTS, assert_logprobs_close, hf_prompt_logprobs,
                                                   reference_token_logprobs)

register_cpu_ci(est_time=20, suite="cpu")

CHUNK = 16
TOL = 1e-4


@pytest.fixture(scope="module")
def engine():
    e = Engine(dtype="float32", max_total_memory_gb=2, chunked_prefill_size=CHUNK, log_level="warning")
    yield e
    shutdown(e)


@pytest.fixture(scope="module")
def prompt_ids(engine):
    ids = [engine.tokenizer.encode(p) for p in LOGPROB_PROMPTS]
    assert sum(len(i) > CHUNK for i in ids) >= 4 and max(len(i) for i in ids) > 2 * CHUNK  # chunk boundaries
    return ids


@pytest.fixture(scope="module")
def ref(prompt_ids):
    return hf_prompt_logprobs(default_model_dir(), prompt_ids)


def test_prompt_logprobs_equal_hf_across_chunks(engine, prompt_ids, ref):
    engine.flush_cache()
    outs = engine.generate(input_ids=prompt_ids, sampling_params={"temperature": 0, "max_new_tokens": 0},
                           return_logprob=True, logprob_start_len=0, top_logprobs_num=3, token_ids_logprob=[0, 42])
    for ids, r, o in zip(prompt_ids, ref, outs):
        m = o["meta_info"]
        assert m["finish_reason"] == {"type": "length", "length": 0} and o["output_ids"] == []
        assert [t for _, t, _ in m["input_token_logprobs"]] == ids
        assert_logprobs_close([lp for lp, _, _ in m["input_token_logprobs"]], reference_token_logprobs(r, ids, 0))
        assert m["input_top_logprobs"][0] is None and m["input_token_ids_logprobs"][0] is None
        for p in range(1, len(ids)):
            top = m["input_top_logprobs"][p]
            want_v, want_i = r[p - 1].topk(3)
            assert [t for _, t, _ in top] == want_i.tolist()
            assert_logprobs_close([lp for lp, _, _ in top], want_v.tolist())
            by_id = m["input_token_ids_logprobs"][p]
            assert [t for _, t, _ in by_id] == [0, 42]
            assert_logprobs_close([lp for lp, _, _ in by_id], [r[p - 1, 0].item(), r[p - 1, 42].item()])
    engine.scheduler.check_integrity()


def test_prefix_cache_hit_recomputes_or_uses_the_cache(engine, prompt_ids, ref):
    engine.flush_cache()
    engine.generate(input_ids=prompt_ids, sampling_params={"temperature": 0, "max_new_tokens": 1})  # cache them
    # from position 0: every row is needed, so the cached prompt is computed again (cached_tokens 0)
    outs = engine.generate(input_ids=prompt_ids, sampling_params={"temperature": 0, "max_new_tokens": 2},
                           return_logprob=True, logprob_start_len=0)
    for ids, r, o in zip(prompt_ids, ref, outs):
        assert o["meta_info"]["cached_tokens"] == 0
        assert_logprobs_close([lp for lp, _, _ in o["meta_info"]["input_token_logprobs"]], reference_token_logprobs(r, ids, 0))
        assert len(o["meta_info"]["output_token_logprobs"]) == 2
    # from a later position: the prefix before it comes from the cache, the rest is computed and equal
    for ids, r in zip(prompt_ids, ref):
        start = len(ids) // 2 + 1
        o = engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 1},
                            return_logprob=True, logprob_start_len=start)
        assert o["meta_info"]["cached_tokens"] == start - 1
        got = o["meta_info"]["input_token_logprobs"]
        assert [t for _, t, _ in got] == ids[start:]
        assert_logprobs_close([lp for lp, _, _ in got], reference_token_logprobs(r, ids, start))
        # the first generated token's logprob is HF's last row's
        lp, tok, _ = o["meta_info"]["output_token_logprobs"][0]
        assert abs(lp - r[-1, tok].item()) <= TOL and tok == int(r[-1].argmax())
    engine.scheduler.check_integrity()


@pytest.mark.parametrize("kwargs, param", [
    ({"logprob_start_len": 99}, "logprob_start_len"),
    ({"logprob_start_len": 0, "return_logprob": False}, "logprob_start_len"),
    ({"logprob_start_len": -2}, "logprob_start_len"),
    ({"token_ids_logprob": [10 ** 6]}, "token_ids_logprob"),
    ({"top_logprobs_num": 21}, "top_logprobs_num"),
])
def test_bad_logprob_fields_name_the_field(engine, kwargs, param):
    args = {"return_logprob": True, **kwargs}
    with pytest.raises(ParamError) as e:
        engine.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 1}, **args)
    assert e.value.param == param and param in str(e.value)
    assert engine.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 1})["output_ids"]


def test_retracted_requests_keep_their_prompt_logprobs(prompt_ids, ref):
    """A pool too small for the batch's decode: requests are retracted and prefill again; their prompt logprobs
    (collected once) still equal HF's and every output token has its logprob."""
    picked = range(8)  # 144 prompt tokens + 8 x 24 new ones: more than the 256-token pool holds
    e = Engine(dtype="float32", max_total_tokens=256, chunked_prefill_size=CHUNK, log_level="warning")
    try:
        outs = e.generate(input_ids=[prompt_ids[i] for i in picked],
                          sampling_params={"temperature": 0, "max_new_tokens": 24, "ignore_eos": True},
                          return_logprob=True, logprob_start_len=0)
        assert e.scheduler.num_retractions > 0, "the pool is meant to force retraction"
        for i, o in zip(picked, outs):
            want = reference_token_logprobs(ref[i], prompt_ids[i], 0)
            assert_logprobs_close([lp for lp, _, _ in o["meta_info"]["input_token_logprobs"]], want)
            assert len(o["meta_info"]["output_token_logprobs"]) == 24
        e.scheduler.check_integrity()
    finally:
        shutdown(e)
