"""Upstream's response shape on the directory's server (default model, no --reasoning-parser, no
--enable-cache-report), read the way upstream-based client code reads it: attributes of the real `openai` client's
objects. reasoning_content is on every message and every delta (null), usage has
completion_tokens_details.reasoning_tokens = 0 and prompt_tokens_details null, any `model` name is served and
echoed, /v1/models ids the model by its served name, and /generate takes upstream's require_reasoning."""

import openai
import pytest
import requests

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=8, suite="cpu")

MSG = [{"role": "user", "content": "Name a color."}]
OTHER_MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # an upstream launch script's name: not the served one


def test_message_and_usage_shape_without_a_parser(client, model_name):
    resp = client.chat.completions.create(model=model_name, messages=MSG, max_tokens=6, temperature=0)
    msg = resp.choices[0].message
    assert msg.reasoning_content is None  # an attribute (AttributeError when the key is left out)
    assert "reasoning_content" in msg.model_extra and msg.content
    assert resp.usage.completion_tokens_details.reasoning_tokens == 0
    assert resp.usage.model_extra["reasoning_tokens"] == 0  # upstream's own top-level field
    assert resp.usage.prompt_tokens_details is None  # no --enable-cache-report: null, as upstream


def test_every_stream_delta_has_reasoning_content(client, model_name):
    chunks = list(client.chat.completions.create(model=model_name, messages=MSG, max_tokens=6, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert len(deltas) >= 3  # the role, content, the finish
    assert all("reasoning_content" in d.model_extra and d.reasoning_content is None for d in deltas)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-2].choices[0].finish_reason
    usage = chunks[-1].usage
    assert usage.completion_tokens_details.reasoning_tokens == 0 and usage.prompt_tokens_details is None
    # logprobs and n > 1 take the general chunk path: the same field
    chunks = list(client.chat.completions.create(model=model_name, messages=MSG, max_tokens=4, n=2, logprobs=True,
                                                 stream=True))
    assert all(c.choices[0].delta.reasoning_content is None for c in chunks)


def test_any_model_name_is_served_and_echoed(client, model_name, base_url, headers):
    chat = client.chat.completions.create(model=OTHER_MODEL, messages=MSG, max_tokens=4, temperature=0)
    assert chat.model == OTHER_MODEL and chat.choices[0].finish_reason in ("stop", "length")
    same = client.chat.completions.create(model=model_name, messages=MSG, max_tokens=4, temperature=0)
    assert same.model == model_name
    streamed = list(client.completions.create(model=OTHER_MODEL, prompt="Hi", max_tokens=3, stream=True))
    assert {c.model for c in streamed} == {OTHER_MODEL}
    assert client.completions.create(model="x", prompt="Hi", max_tokens=2).model == "x"
    # no model at all (curl, /generate-style clients): the served name
    body = requests.post(f"{base_url}/v1/chat/completions", headers=headers, timeout=60,
                         json={"messages": MSG, "max_tokens": 2}).json()
    assert body["model"] == model_name


def test_models_list_the_served_name(client, model_name):
    # the bundled model, no --model-path: its file name without .gguf (docs: README's endpoint table)
    assert model_name == "SmolLM2-135M-Instruct.Q4_1"
    assert [m.id for m in client.models.list().data] == [model_name]
    # root: the model path as given (no --model-path: the bundled file), not the converted cache directory
    from sglang.srt.model_loader.model_path import default_model_path

    assert client.models.retrieve(model_name).model_extra["root"] == default_model_path()
    with pytest.raises(openai.NotFoundError) as e:  # retrieving a model the server does not list is still 404
        client.models.retrieve(OTHER_MODEL)
    assert OTHER_MODEL in str(e.value)


def test_generate_accepts_require_reasoning(base_url, headers):
    body = {"text": "The sky is", "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    plain = requests.post(f"{base_url}/generate", json=body, headers=headers, timeout=60)
    asked = requests.post(f"{base_url}/generate", json={**body, "require_reasoning": True}, headers=headers,
                          timeout=60)
    assert plain.status_code == asked.status_code == 200, asked.text
    # without --reasoning-parser it changes nothing (upstream's no-op), a grammar included
    assert asked.json()["output_ids"] == plain.json()["output_ids"]
    regex = {**body, "sampling_params": {**body["sampling_params"], "regex": "[a-z ]{3,12}"}}
    ok = requests.post(f"{base_url}/generate", json={**regex, "require_reasoning": True}, headers=headers, timeout=60)
    assert ok.status_code == 200, ok.text
    bad = requests.post(f"{base_url}/generate", json={**body, "require_reasoning": 1}, headers=headers, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "require_reasoning"


def test_error_body_reads_as_upstream_and_as_openai(client, model_name, base_url, headers):
    # upstream SGLang's clients read the top-level ErrorResponse fields, OpenAI's the nested object: both present
    r = requests.post(f"{base_url}/v1/chat/completions", headers=headers, timeout=60,
                      json={"model": model_name, "messages": MSG, "max_tokens": -1})
    body = r.json()
    assert r.status_code == 400 and body["object"] == "error" and body["type"] == "BadRequestError"
    assert body["message"] == body["error"]["message"] and "max_tokens" in body["message"]
    assert body["code"] == 400 and body["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_name, messages=MSG, max_tokens=-1)
    assert e.value.message.endswith(body["message"]) or body["message"] in str(e.value)
