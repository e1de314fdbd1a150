"""usage.completion_tokens_details.reasoning_tokens, reasoning_content with a parser, --enable-cache-report and the
model's id, through one launched server (the bundled model named by its --model-path, --reasoning-parser qwen3
--enable-cache-report) and the real `openai` client.

The bundled 135M model never thinks on its own: a `regex` makes it write a <think> block (as in
function_call/test_tool_calling_server.py). The reference count of reasoning tokens is read off the tokens the
server returns as logprobs (their bytes joined until they hold "</think>"), not off the server's own count; the
reference for a cache hit is the prompt's token count.
"""

import uuid

import pytest
import requests

from sglang.srt.managers.tokenizer_loading import served_model_name
from sglang.srt.model_loader.model_path import default_model_path
from sglang.srt.server_args import ServerArgs
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import DEFAULT_SMALL_SERVER_ARGS, openai_client, popen_launch_server

register_cpu_ci(est_time=40, suite="cpu")

SERVED = default_model_path()  # --model-path as given: upstream's id when there is no --served-model-name
ASK = [{"role": "user", "content": "Is the sky blue?"}]
THINK_REGEX = r"<think>\n[A-Za-z ]{4,40}\n</think>\n\n[A-Za-z ]{4,40}"
LONG = " ".join(f"Paragraph {i} says that the river runs east past the old mill and the long stone bridge."
                for i in range(12))


@pytest.fixture(scope="module")
def server():
    srv = popen_launch_server(other_args=[*DEFAULT_SMALL_SERVER_ARGS, "--model-path", SERVED, "--reasoning-parser",
                                          "qwen3", "--enable-cache-report"])
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server.base_url)


def think(client, **kw):
    extra = {"regex": THINK_REGEX, **kw.pop("extra_body", {})}
    return client.chat.completions.create(model=SERVED, messages=ASK, temperature=0, max_tokens=64, logprobs=True,
                                          extra_body=extra, **kw)


def tokens_through_think_end(logprobs) -> int:
    """Reference: how many output tokens it takes for their bytes to hold </think> (0 when they never do)."""
    text = b""
    for k, entry in enumerate(logprobs, 1):
        text += bytes(entry.bytes)
        if b"</think>" in text:
            return k
    return 0


def test_reasoning_tokens_non_streamed(client):
    resp = think(client)
    msg, usage = resp.choices[0].message, resp.usage
    assert msg.reasoning_content and msg.content
    want = tokens_through_think_end(resp.choices[0].logprobs.content)
    assert 0 < want < usage.completion_tokens  # an answer follows the thoughts
    assert usage.completion_tokens_details.reasoning_tokens == want
    assert usage.model_extra["reasoning_tokens"] == want  # upstream's top-level field, the same count
    # separate_reasoning=false leaves the thoughts in content; they are still reasoning tokens
    whole = think(client, extra_body={"separate_reasoning": False})
    assert whole.choices[0].message.reasoning_content is None and "</think>" in whole.choices[0].message.content
    assert whole.usage.completion_tokens_details.reasoning_tokens == tokens_through_think_end(
        whole.choices[0].logprobs.content)
    # thinking turned off: the parser stands down and nothing counts as reasoning
    off = think(client, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert off.usage.completion_tokens_details.reasoning_tokens == 0


def test_reasoning_tokens_streamed_and_n(client):
    chunks = list(think(client, n=2, stream=True, stream_options={"include_usage": True}))
    per_choice = {0: [], 1: []}
    for c in chunks:
        for ch in c.choices:
            assert "reasoning_content" in ch.delta.model_extra  # every delta, null or text
            if ch.logprobs is not None and ch.logprobs.content:
                per_choice[ch.index].extend(ch.logprobs.content)
    want = [tokens_through_think_end(per_choice[i]) for i in (0, 1)]
    assert all(w > 0 for w in want)
    usage = chunks[-1].usage
    assert usage.completion_tokens_details.reasoning_tokens == sum(want)
    assert usage.completion_tokens == sum(len(per_choice[i]) for i in (0, 1))


def test_no_think_block_is_null_reasoning_and_zero_tokens(client):
    # qwen3's parser reads reasoning only after an opening <think>; without one the message has none
    resp = client.chat.completions.create(model=SERVED, messages=ASK, temperature=0, max_tokens=8,
                                          extra_body={"regex": "[A-Za-z ]{4,30}"})
    assert resp.choices[0].message.reasoning_content is None and resp.choices[0].message.content
    assert resp.usage.completion_tokens_details.reasoning_tokens == 0


def prompt_with_nonce() -> str:
    return f"[{uuid.uuid4().hex}] {LONG}"  # a new first token: nothing of it is cached before the first request


def test_cache_report_chat_completions_and_streaming(client):
    prompt = prompt_with_nonce()
    kw = dict(model=SERVED, prompt=prompt, max_tokens=2, temperature=0)
    first, second = client.completions.create(**kw), client.completions.create(**kw)
    assert first.usage.prompt_tokens > 150 and first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert second.usage.prompt_tokens - 16 <= cached < second.usage.prompt_tokens  # all but the prompt's tail
    # streamed with include_usage: the last chunk reports it too
    streamed = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert streamed[-1].usage.prompt_tokens_details.cached_tokens == cached
    # n=2 on one prompt counts the prompt's hit once
    both = client.completions.create(n=2, **kw)
    assert both.usage.prompt_tokens_details.cached_tokens == cached

    msgs = [{"role": "user", "content": prompt_with_nonce()}]
    ckw = dict(model=SERVED, messages=msgs, max_tokens=2, temperature=0)
    c1 = client.chat.completions.create(**ckw)
    c2 = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **ckw))[-1]
    assert c1.usage.prompt_tokens > 150
    assert c1.usage.prompt_tokens_details.cached_tokens < 30  # at most the chat template's shared opening
    assert c2.usage.prompt_tokens - 16 <= c2.usage.prompt_tokens_details.cached_tokens < c2.usage.prompt_tokens


def test_model_id_is_the_model_path_as_given_and_requests_echo_theirs(client):
    assert [m.id for m in client.models.list().data] == [SERVED]
    assert client.models.retrieve(SERVED).id == SERVED
    # --served-model-name, when given, wins; a relative path stays as typed
    assert served_model_name(ServerArgs(model_path="models/x.gguf", served_model_name="org/name"), "/abs") == "org/name"
    assert served_model_name(ServerArgs(model_path="models/x.gguf"), "/abs/models/x.gguf") == "models/x.gguf"
    resp = client.chat.completions.create(model="gpt-4o", messages=ASK, max_tokens=2)
    assert resp.model == "gpt-4o" and resp.choices[0].finish_reason in ("stop", "length")


def test_generate_require_reasoning_with_a_parser(server):
    url = f"{server.base_url}/generate"
    body = {"text": "The sky is", "require_reasoning": True, "sampling_params": {"max_new_tokens": 4}}
    assert requests.post(url, json=body, timeout=60).status_code == 200  # no grammar: nothing to hold off
    bad = requests.post(url, json={**body, "sampling_params": {"max_new_tokens": 4, "regex": "[a-z]+"}}, timeout=60)
    assert bad.status_code == 400, bad.text
    err = bad.json()["error"]
    assert err["param"] == "require_reasoning" and "regex" in err["message"]
    assert requests.post(url, json=body, timeout=60).status_code == 200  # and the server keeps serving
