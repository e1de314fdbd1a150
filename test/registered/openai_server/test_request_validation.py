"""Every request field is checked at the edge by one set of rules (srt/sampling/validation.py) on
/v1/chat/completions, /v1/completions and /generate: a bad value is a 400 whose error.param names the field and whose
message states the allowed range, with the same sentence the offline Engine raises. Each repro of issue 9 finding 2
(which used to crash the scheduler or the sampler, or answer 500) is a case here. After every case the server still
serves a normal request, and the KV allocator is intact with nothing left in use."""

import json

import pytest
import requests

from sglang.srt.sampling import validation as v
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=45, suite="cpu")

MSG = [{"role": "user", "content": "Hi"}]
ENDPOINTS = ["/v1/chat/completions", "/v1/completions", "/generate"]
# SamplingParams name -> the OpenAI routes' name, where they differ
OPENAI_NAMES = {"min_new_tokens": "min_tokens", "max_new_tokens": "max_tokens"}


def post(base_url, headers, path, body):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return requests.post(f"{base_url}{path}", data=data, headers={**headers, "Content-Type": "application/json"},
                         timeout=60)


def body_for(path: str, sampling: dict, top: dict = None) -> dict:
    """A request to `path` with the given sampling fields (SamplingParams names) and top-level fields."""
    top = top or {}
    if path == "/generate":
        return {"text": "Hi", "sampling_params": {"max_new_tokens": 2, **sampling}, **top}
    fields = {OPENAI_NAMES.get(k, k): val for k, val in sampling.items()}
    fields.setdefault("max_tokens", 2)
    prompt = {"messages": MSG} if path == "/v1/chat/completions" else {"prompt": "Hi"}
    return {**prompt, **fields, **top}


def param_for(path: str, name: str) -> str:
    return f"sampling_params.{name}" if path == "/generate" else OPENAI_NAMES.get(name, name)


def server_state(base_url, headers):
    info = requests.get(f"{base_url}/server_info", headers=headers, timeout=30).json()
    return info["memory_integrity"], info["internal_states"][0]["num_used_tokens"]


@pytest.fixture(scope="module", autouse=True)
def leave_the_cache_empty(base_url, headers):
    """The server is shared with the other files of this directory: leave it as found (the seeded-sampling test of
    test_openai_server.py compares outputs that depend on what the radix cache holds)."""
    yield
    assert requests.post(f"{base_url}/flush_cache", headers=headers, timeout=30).status_code == 200


@pytest.fixture(autouse=True)
def still_serving(base_url, headers):
    yield
    ok = post(base_url, headers, "/v1/chat/completions", {"messages": MSG, "max_tokens": 2})
    assert ok.status_code == 200, ok.text
    assert server_state(base_url, headers) == ("ok", 0)


def assert_400(resp, param, *fragments):
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    for f in fragments:
        assert f in err["message"], err["message"]
    return err["message"]


# (sampling fields, the field at fault, fragments of the message: what was wrong and what is allowed)
SAMPLING_CASES = [
    ({"skip_special_tokens": "no"}, "skip_special_tokens", "valid boolean", "Allowed: true or false"),
    ({"spaces_between_special_tokens": 0}, "spaces_between_special_tokens", "valid boolean", "true or false"),
    ({"ignore_eos": "true"}, "ignore_eos", "valid boolean", "true or false"),
    ({"no_stop_trim": 1}, "no_stop_trim", "valid boolean", "true or false"),
    ({"temperature": 1e39, "min_new_tokens": 1}, "temperature", "less than or equal to 2",
     "Allowed: a finite number in [0, 2]"),
    ({"temperature": "hot"}, "temperature", "valid number", "[0, 2]"),
    ({"repetition_penalty": 1e-300}, "repetition_penalty", "greater than or equal to 0.01", "in [0.01, 2]"),
    ({"frequency_penalty": 2.5}, "frequency_penalty", "less than or equal to 2", "in [-2, 2]"),
    ({"presence_penalty": -3}, "presence_penalty", "greater than or equal to -2", "in [-2, 2]"),
    ({"top_p": 1.5}, "top_p", "less than or equal to 1", "in (0, 1]"),
    ({"top_k": 0}, "top_k", "should not be 0", "-1 (no top-k cut) or an integer in [1, 2^31-1]"),
    ({"min_p": -0.1}, "min_p", "greater than or equal to 0", "in [0, 1]"),
    ({"seed": 2**64 - 1, "n": 2}, "seed", "less than or equal to 9223372036854775807", "[0, 2^63-1]"),
    ({"seed": 2**63 - 1, "n": 2}, "seed", "exceeds 2^63-1", "[0, 9223372036854775806]"),
    ({"seed": -1}, "seed", "greater than or equal to 0", "[0, 2^63-1]"),
    ({"n": 129}, "n", "less than or equal to 128", "an integer in [1, 128]"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4 items", "at most 4 strings, each of 1 to 512 characters"),
    ({"stop": "x" * 600}, "stop", "at most 512 characters", "1 to 512 characters"),
    ({"stop_token_ids": [10**6]}, "stop_token_ids", "outside the vocabulary", "[0, 49152)"),
    ({"stop_token_ids": list(range(300))}, "stop_token_ids", "at most 256 items", "at most 256 token ids"),
    ({"min_new_tokens": 5}, "min_new_tokens", "should not exceed", "an integer in [0,"),
    ({"max_new_tokens": 2**31}, "max_new_tokens", "less than or equal to 2147483647", "[0, 2^31-1]"),
]


@pytest.mark.parametrize("path", ENDPOINTS)
@pytest.mark.parametrize("sampling,field,fragments", [(c[0], c[1], c[2:]) for c in SAMPLING_CASES],
                         ids=[f"{c[1]}-{i}" for i, c in enumerate(SAMPLING_CASES)])
def test_sampling_field_rules(base_url, headers, path, sampling, field, fragments):
    if path == "/v1/chat/completions" and field == "max_new_tokens":
        fragments = ("less than or equal to 2147483647", "[1, 2^31-1]")  # chat's max_tokens starts at 1 (OpenAI)
    resp = post(base_url, headers, path, body_for(path, sampling))
    message = assert_400(resp, param_for(path, field), f"Invalid value for {param_for(path, field)}", *fragments)
    if path == "/generate" and field not in ("stop_token_ids",):
        # the offline Engine (SamplingParams.from_dict) says the same sentence, without the sampling_params. prefix
        with pytest.raises(ValueError) as e:
            SamplingParams.from_dict({"max_new_tokens": 2, **sampling})
        assert message == str(e.value).replace(f"for {field}", f"for sampling_params.{field}", 1)


@pytest.mark.parametrize("path,top,param,fragments", [
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", ("[0, 20]",)),
    ("/v1/completions", {"logprobs": 6}, "logprobs", ("[0, 5]",)),
    ("/generate", {"return_logprob": True, "top_logprobs_num": 21}, "top_logprobs_num", ("[0, 20]",)),
    ("/generate", {"return_logprob": "yes"}, "return_logprob", ("valid boolean",)),
    ("/v1/chat/completions", {"rid": "r" * 300}, "rid", ("at most 256 characters",)),
    ("/v1/completions", {"rid": "a\nb"}, "rid", ("pattern", "without control characters")),
    ("/generate", {"rid": "r" * 300}, "rid", ("at most 256 characters",)),
    ("/v1/completions", {"prompt": [10**6]}, "prompt", ("out of range", "[0, 49152)")),
    ("/generate", {"input_ids": [10**6], "text": None}, "input_ids", ("out of range", "[0, 49152)")),
    ("/generate", {"input_ids": [-1], "text": None}, "input_ids", ("greater than or equal to 0",)),
    # upstream's words, which its clients match on
    ("/generate", {"return_logprob": True, "token_ids_logprob": [[0]]}, "token_ids_logprob",
     ("flat list of integers",)),
    ("/generate", {"return_logprob": True, "token_ids_logprob": [-1]}, "token_ids_logprob", ("out-of-vocabulary",)),
    ("/generate", {"return_logprob": True, "token_ids_logprob": [10**6]}, "token_ids_logprob", ("out-of-vocabulary",)),
])
def test_request_field_rules(base_url, headers, path, top, param, fragments):
    body = body_for(path, {}, top)
    if body.get("text", "") is None:
        del body["text"]
    assert_400(post(base_url, headers, path, body), param, *fragments)


@pytest.mark.parametrize("path", ENDPOINTS)
def test_deeply_nested_json_is_400_before_parsing(base_url, headers, path):
    depth = 1000
    nested = b"[" * depth + b"]" * depth
    base = json.dumps(body_for(path, {})).encode()
    resp = post(base_url, headers, path, base[:-1] + b', "stop": ' + nested + b"}")
    assert_400(resp, "body", f"nests {depth + 1} levels deep", f"at most {v.MAX_JSON_DEPTH} levels")
    # brackets inside strings do not count: a prompt full of them is fine
    ok = post(base_url, headers, path, body_for(path, {}, {"prompt": "[" * 200} if path == "/v1/completions" else {}))
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("path", ENDPOINTS)
def test_non_finite_numbers_are_400(base_url, headers, path):
    base = json.dumps(body_for(path, {})).encode()
    resp = post(base_url, headers, path, base[:-1] + b', "temperature": 1e999}')
    assert resp.status_code == 400 and "infinity" in resp.json()["error"]["message"], resp.text


@pytest.mark.parametrize("path", ENDPOINTS)
def test_values_at_the_limits_generate(base_url, headers, path):
    """The bounds are where the sampler stays finite: the extreme allowed values produce tokens, and the last
    choice's seed of an n=2 request may be 2^63-1."""
    sampling = {"temperature": v.MAX_TEMPERATURE, "min_new_tokens": 2, "max_new_tokens": 3,
                "repetition_penalty": v.MIN_REPETITION_PENALTY, "frequency_penalty": 2.0, "seed": v.MAX_SEED - 1,
                "n": 2, "skip_special_tokens": False, "spaces_between_special_tokens": False, "no_stop_trim": True}
    resp = post(base_url, headers, path, body_for(path, sampling))
    assert resp.status_code == 200, resp.text
    out = resp.json()
    choices = out if path == "/generate" else out["choices"]
    assert len(choices) == 2
    if path == "/generate":
        assert all(len(c["output_ids"]) >= 2 for c in choices)
    else:
        assert out["usage"]["completion_tokens"] >= 4


def test_openapi_documents_every_request_body(base_url, headers):
    spec = requests.get(f"{base_url}/openapi.json", headers=headers, timeout=30).json()
    schemas = spec["components"]["schemas"]
    expected = {
        ("post", "/v1/chat/completions"): "ChatCompletionRequest", ("post", "/v1/completions"): "CompletionRequest",
        ("post", "/generate"): "GenerateRequest", ("put", "/generate"): "GenerateRequest",
        ("post", "/v1/tokenize"): "TokenizeRequest", ("post", "/tokenize"): "TokenizeRequest",
        ("post", "/v1/detokenize"): "DetokenizeRequest", ("post", "/detokenize"): "DetokenizeRequest",
        ("post", "/abort_request"): "AbortRequest",
        ("post", "/v1/responses"): "ResponsesRequest", ("post", "/v1/embeddings"): "EmbeddingRequest",
        ("post", "/v1/score"): "ScoreRequest",
    }
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            if method not in ("post", "put") or path in ("/flush_cache", "/get_memory_pool_size"):  # no body
                continue
            assert (method, path) in expected, f"{method} {path} is not covered by this test"
            ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            assert ref == f"#/components/schemas/{expected[(method, path)]}"
            assert schemas[expected[(method, path)]]["properties"], ref
    assert set(expected) <= {(m, p) for p, ops in spec["paths"].items() for m in ops}
    # /generate's sampling_params is a typed model, with the limits of validation.py
    gen = schemas["GenerateRequest"]["properties"]["sampling_params"]
    assert "SamplingParamsModel" in json.dumps(gen)
    sp = schemas["SamplingParamsModel"]["properties"]
    assert sp["temperature"]["maximum"] == v.MAX_TEMPERATURE and sp["skip_special_tokens"]["type"] == "boolean"
    assert sp["repetition_penalty"]["minimum"] == v.MIN_REPETITION_PENALTY
    chat = schemas["ChatCompletionRequest"]["properties"]
    assert chat["seed"]["anyOf"][0]["maximum"] == v.MAX_SEED
    assert chat["temperature"]["description"] == sp["temperature"]["description"]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
