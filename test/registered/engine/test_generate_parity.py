"""One request pipeline (issue 10): `Engine.generate` and POST /generate build requests with the same builder and
answer with the same accumulator. For the same requests, an in-process fp32 Engine and an fp32 server with the same
limits return the same keys, token ids and logprob format ([logprob, token_id, None], values within 1e-4); for bad
input, the Engine's ValueError carries the exact message and param of the server's 400 error body."""

import pytest
import requests

from sglang import Engine
from sglang.srt.sampling.validation import ParamError
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import shutdown
from sglang.test.test_utils import popen_launch_server

register_cpu_ci(est_time=15, suite="cpu")

CONTEXT_LEN, MAX_TOTAL_TOKENS = 128, 2048
TIMING_FIELDS = {"e2e_latency"}  # differ run to run
LOGPROB_TOL = 1e-4


@pytest.fixture(scope="module")
def engine():
    e = Engine(dtype="float32", context_length=CONTEXT_LEN, max_total_tokens=MAX_TOTAL_TOKENS, log_level="warning")
    yield e
    shutdown(e)


@pytest.fixture(scope="module")
def server():
    srv = popen_launch_server(other_args=["--dtype", "float32", "--context-length", str(CONTEXT_LEN),
                                          "--max-total-tokens", str(MAX_TOTAL_TOKENS)])
    yield srv
    srv.kill()


def both(engine, server, prompt=None, input_ids=None, **kw):
    """The same request through both paths, each from an empty prefix cache (cached_tokens must agree)."""
    body = {k: v for k, v in {"text": prompt, "input_ids": input_ids, **kw}.items() if v is not None}
    engine.flush_cache()
    assert requests.post(f"{server.base_url}/flush_cache", timeout=30).status_code == 200
    got = engine.generate(prompt=prompt, input_ids=input_ids, **kw)
    resp = requests.post(f"{server.base_url}/generate", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return got, resp.json()


def assert_same_shape(a, b, path="response"):
    """Same keys and types all the way down; values equal except ids, timings and logprobs (compared by tolerance)."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        assert a.keys() == b.keys(), f"{path}: {sorted(a)} vs {sorted(b)}"
        for k in a:
            if k not in ("id", *TIMING_FIELDS):
                assert_same_shape(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), f"{path}: {len(a)} vs {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_shape(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert abs(a - b) <= LOGPROB_TOL, f"{path}: {a} vs {b}"
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


def check_logprob_entries(entries):
    for lp, tid, text in entries:
        assert isinstance(lp, float) and lp <= 0 and isinstance(tid, int) and text is None


GREEDY = {"temperature": 0, "max_new_tokens": 6}


def test_single_prompt(engine, server):
    got, want = both(engine, server, "The capital of France is", sampling_params=GREEDY)
    assert isinstance(got, dict) and len(got["output_ids"]) == 6
    assert_same_shape(got, want)
    assert got["meta_info"].keys() >= {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens",
                                       "e2e_latency"}


def test_batch_of_texts_and_of_ids(engine, server):
    got, want = both(engine, server, ["Hello, my name is", "One, two, three,"], sampling_params=GREEDY)
    assert isinstance(got, list) and len(got) == 2
    assert_same_shape(got, want)
    got, want = both(engine, server, input_ids=[[504, 3458, 282], [1826, 28, 827]], sampling_params=GREEDY)
    assert_same_shape(got, want)


def test_n2_with_seed_gives_the_same_two_choices(engine, server):
    params = {"temperature": 1.0, "max_new_tokens": 8, "seed": 7, "n": 2}
    got, want = both(engine, server, "Once upon a time", sampling_params=params)
    assert len(got) == 2
    assert got[0]["output_ids"] != got[1]["output_ids"]  # choice i samples with seed + i
    assert_same_shape(got, want)


def test_logprobs_in_one_format(engine, server):
    got, want = both(engine, server, "The sky is", sampling_params=GREEDY, return_logprob=True, top_logprobs_num=3)
    meta = got["meta_info"]
    assert [t for _, t, _ in meta["output_token_logprobs"]] == got["output_ids"]
    check_logprob_entries(meta["output_token_logprobs"])
    assert all(len(top) == 3 for top in meta["output_top_logprobs"])
    for top in meta["output_top_logprobs"]:
        check_logprob_entries(top)
    assert_same_shape(got, want)


BAD_INPUTS = [
    ("bad temperature", {"text": "Hi", "sampling_params": {"temperature": 5}}),
    ("unknown sampling param", {"text": "Hi", "sampling_params": {"temprature": 0.5}}),
    ("too-long prompt", {"text": "word " * 400, "sampling_params": {"max_new_tokens": 4}}),
    ("max_new_tokens too large", {"text": "Hi", "sampling_params": {"max_new_tokens": 500}}),
    ("seed out of range", {"text": "Hi", "sampling_params": {"seed": -1}}),
    ("seed + n - 1 out of range", {"text": "Hi", "sampling_params": {"seed": 2**63 - 1, "n": 2}}),
    ("bad top_logprobs_num", {"text": "Hi", "return_logprob": True, "top_logprobs_num": 21}),
    ("empty prompt", {"text": "", "sampling_params": {"max_new_tokens": 4}}),
    ("empty input_ids", {"input_ids": [], "sampling_params": {"max_new_tokens": 4}}),
    ("out-of-vocab input id", {"input_ids": [1, 2, 10**6]}),
    ("stop token id outside the vocabulary", {"text": "Hi", "sampling_params": {"stop_token_ids": [10**6]}}),
    ("both text and input_ids", {"text": "Hi", "input_ids": [1, 2]}),
    ("one sampling_params too many", {"text": ["a", "b"], "sampling_params": [{}, {}, {}]}),
]


@pytest.mark.parametrize("body", [c[1] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_same_message(engine, server, body):
    resp = requests.post(f"{server.base_url}/generate", json=body, timeout=60)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    kwargs = {("prompt" if k == "text" else k): v for k, v in body.items()}
    with pytest.raises(ValueError) as e:
        engine.generate(**kwargs)
    assert isinstance(e.value, ParamError)
    assert str(e.value) == err["message"]
    assert e.value.param == err["param"]
    s = engine.scheduler
    s.check_integrity()
    assert not s.reqs and s.get_stats()["num_used_tokens"] == 0
