"""Every class of bad input gets an OpenAI-style error with the right status and a message that says what to change;
the server keeps serving afterwards (checked after every case)."""

import openai
import pytest
import requests

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="cpu")

MSG = [{"role": "user", "content": "Hi"}]


@pytest.fixture(autouse=True)
def still_serving(client, model_name):
    yield
    ok = client.chat.completions.create(model=model_name, messages=MSG, max_tokens=2)
    assert ok.choices[0].finish_reason in ("stop", "length")


def post(base_url, headers, path, body=None, data=None):
    return requests.post(f"{base_url}{path}", json=body, data=data, headers=headers, timeout=60)


def assert_error(resp, status, *fragments, param=None):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    for f in fragments:
        assert f in err["message"], err["message"]
    if param is not None:
        assert err["param"] == param


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/generate"])
def test_malformed_json(base_url, headers, path):
    assert_error(post(base_url, headers, path, data=b'{"messages": [}'), 400, "could not parse the JSON body")


CHAT_CASES = [
    ({"max_tokens": "ten"}, "max_tokens", "valid integer"),
    ({"max_tokens": -5}, "max_tokens", "greater than or equal to 1"),
    ({"temperature": -0.5}, "temperature", "greater than or equal to 0"),
    ({"top_p": 0}, "top_p", "greater than 0"),
    ({"top_p": 1.5}, "top_p", "less than or equal to 1"),
    ({"n": 0}, "n", "greater than or equal to 1"),
    ({"stream": "yes"}, "stream", "valid boolean"),
    ({"frobnicate": True}, "frobnicate", "Unrecognized request argument supplied: frobnicate"),
    ({"messages": []}, "messages", "at least 1 item"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages", "role"),
    ({"top_logprobs": 3}, "top_logprobs", "requires logprobs"),
]


@pytest.mark.parametrize("extra,param,fragment", CHAT_CASES, ids=[c[1] + "-" + str(i) for i, c in enumerate(CHAT_CASES)])
def test_chat_bad_fields(base_url, headers, extra, param, fragment):
    assert_error(post(base_url, headers, "/v1/chat/completions", {"messages": MSG, **extra}), 400, fragment, param=param)


def test_absurd_max_tokens_names_the_limit(client, model_name, model_info):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_name, messages=MSG, max_tokens=10**9)
    message = e.value.body["message"]
    # the completion alone cannot fit: upstream's words (clients match on them), then the limit and the field
    assert message.startswith(f"max_completion_tokens is too large: {10**9}. This model supports at most ")
    assert "max_tokens" in message


def test_prompt_longer_than_context(client, model_name, model_info):
    ctx = model_info["context_len"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_name, prompt=[1] * (ctx + 10), max_tokens=1)
    assert f"{ctx + 10} tokens" in str(e.value) and str(ctx) in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "hello " * (ctx + 10)}])
    assert "context length" in str(e.value)


def test_completion_bad_prompt_and_token_ids(base_url, headers):
    assert_error(post(base_url, headers, "/v1/completions", {"prompt": 5}), 400, "prompt", param="prompt")
    assert_error(post(base_url, headers, "/v1/completions", {"prompt": [10**9]}), 400, "out of range")
    assert_error(post(base_url, headers, "/v1/completions", {"prompt": "x", "logprobs": 9}), 400, "logprobs")


def test_generate_bad_sampling_params(base_url, headers):
    r = post(base_url, headers, "/generate", {"text": "x", "sampling_params": {"temperature": -1}})
    assert_error(r, 400, "sampling_params.temperature", "greater than or equal to 0", "Allowed: a finite number in [0, 2]",
                 param="sampling_params.temperature")
    r = post(base_url, headers, "/generate", {"text": "x", "sampling_params": {"max_new_token": 3}})
    assert_error(r, 400, "Unrecognized request argument supplied: sampling_params.max_new_token",
                 param="sampling_params.max_new_token")
    assert_error(post(base_url, headers, "/generate", {"sampling_params": {}}), 400, "exactly one of text or input_ids")


def test_unknown_endpoint_is_404(base_url, headers):
    assert_error(requests.get(f"{base_url}/v1/nothing", headers=headers), 404, "Unknown endpoint")


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
