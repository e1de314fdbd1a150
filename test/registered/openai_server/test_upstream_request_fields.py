"""Upstream's request fields over HTTP (issue 28), through the real `openai` client (extra_body for SGLang's fields)
and POST /generate: stop_regex + matched_stop, cache_salt, return_text_in_logprobs, GET /get_memory_pool_size, and
upstream's context-overflow sentence.

References: each route's own greedy text without stop_regex, searched by Python's `re`; the HF tokenizer's decode of
each id; /server_info's plan; the prefix-cache counters of /server_info."""

import re
import uuid

import openai
import pytest
import requests

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=25, suite="cpu")

PROMPT = "The three primary colors are"
CHAT = [{"role": "user", "content": "Name the three primary colors and say one sentence about each."}]
MAX_TOKENS = 32


def word_pattern(word: str) -> str:
    """A real regex for `word`: each letter as a two-case class ("blue" -> "[bB][lL][uU][eE]")."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in word)


def middle_pattern(text: str) -> str:
    """The pattern of a word from the middle of `text` that matches `text` exactly once."""
    words = sorted(re.finditer(r"[A-Za-z]{3,}", text), key=lambda m: abs(m.start() - len(text) // 2))
    for m in words:
        if len(re.findall(word_pattern(m.group()), text)) == 1:
            return word_pattern(m.group())
    pytest.skip(f"no word of the greedy text occurs once: {text!r}")


def post(base_url, headers, path, body):
    return requests.post(f"{base_url}{path}", json=body, headers=headers, timeout=120)


def server_info(base_url, headers):
    return requests.get(f"{base_url}/server_info", headers=headers, timeout=30).json()


# ---------------------------------------------------------------------- stop_regex
def test_stop_regex_on_generate(base_url, headers):
    sp = {"temperature": 0, "max_new_tokens": MAX_TOKENS, "ignore_eos": True}
    greedy = post(base_url, headers, "/generate", {"text": PROMPT, "sampling_params": sp}).json()["text"]
    pattern = middle_pattern(greedy)
    r = post(base_url, headers, "/generate", {"text": PROMPT, "sampling_params": {**sp, "stop_regex": pattern}})
    assert r.status_code == 200, r.text
    assert r.json()["text"] == greedy[: re.search(pattern, greedy).start()]
    assert r.json()["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}


def test_stop_regex_on_completions(client, model_name):
    kw = dict(model=model_name, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
    greedy = client.completions.create(**kw, extra_body={"ignore_eos": True}).choices[0].text
    pattern = middle_pattern(greedy)
    expected = greedy[: re.search(pattern, greedy).start()]
    choice = client.completions.create(**kw, extra_body={"ignore_eos": True, "stop_regex": [pattern]}).choices[0]
    assert choice.text == expected and choice.finish_reason == "stop"
    assert choice.model_extra["matched_stop"] == pattern
    chunks = list(client.completions.create(**kw, stream=True, extra_body={"ignore_eos": True, "stop_regex": pattern}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
    last = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason][-1]
    assert last.finish_reason == "stop" and last.model_extra["matched_stop"] == pattern


def test_stop_regex_on_chat(client, model_name):
    kw = dict(model=model_name, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0)
    greedy = client.chat.completions.create(**kw, extra_body={"ignore_eos": True}).choices[0].message.content
    pattern = middle_pattern(greedy)
    expected = greedy[: re.search(pattern, greedy).start()]
    choice = client.chat.completions.create(**kw, extra_body={"ignore_eos": True, "stop_regex": pattern}).choices[0]
    assert choice.message.content == expected and choice.finish_reason == "stop"
    assert choice.model_extra["matched_stop"] == pattern
    chunks = list(client.chat.completions.create(**kw, stream=True,
                                                 extra_body={"ignore_eos": True, "stop_regex": pattern}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    last = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason][-1]
    assert last.finish_reason == "stop" and last.model_extra["matched_stop"] == pattern


@pytest.mark.parametrize("bad", ["(unclosed", ["fine", "[z-a]"], "x*"])
def test_invalid_stop_regex_is_400_naming_the_field(client, model_name, base_url, headers, bad):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=2, extra_body={"stop_regex": bad})
    assert e.value.body["param"] == "stop_regex" and "stop_regex" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_name, prompt=PROMPT, max_tokens=2, extra_body={"stop_regex": bad})
    assert e.value.body["param"] == "stop_regex"
    r = post(base_url, headers, "/generate", {"text": PROMPT, "sampling_params": {"stop_regex": bad}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "sampling_params.stop_regex", r.text
    assert client.completions.create(model=model_name, prompt=PROMPT, max_tokens=2).choices[0].text is not None


def test_catastrophic_stop_regex_is_a_400_and_the_server_keeps_serving(client, model_name, tokenizer):
    # logit_bias forces "a" tokens, on which (a|a)+c backtracks exponentially: the search times out, the request fails
    a_id = tokenizer.encode("a", add_special_tokens=False)[0]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_name, prompt=PROMPT, max_tokens=64, temperature=0, logit_bias={
            str(a_id): 100}, extra_body={"ignore_eos": True, "stop_regex": "(a|a)+c"})
    assert "stop_regex" in e.value.body["message"]
    assert client.completions.create(model=model_name, prompt=PROMPT, max_tokens=2).choices[0].finish_reason == "length"


# ---------------------------------------------------------------------- cache_salt
def cached_tokens_of(base_url, headers, send) -> int:
    """Prompt tokens the prefix cache served to `send()` (the server's counter, read before and after)."""
    before = server_info(base_url, headers)["stats"]["total_cached_tokens"]
    send()
    return server_info(base_url, headers)["stats"]["total_cached_tokens"] - before


def test_cache_salt_on_generate(base_url, headers):
    prompt = " ".join(uuid.uuid4().hex for _ in range(6))  # ~180 tokens no earlier request sent

    def cached(salt):
        body = {"text": prompt, "sampling_params": {"max_new_tokens": 1}}
        if salt is not None:
            body["cache_salt"] = salt
        return post(base_url, headers, "/generate", body).json()["meta_info"]["cached_tokens"]

    assert cached("alice") == 0
    assert cached("bob") == 0
    assert cached("alice") > 0
    assert cached(None) == 0
    assert cached(None) > 0
    assert cached("carol") == 0
    info = server_info(base_url, headers)
    assert info["memory_integrity"] == "ok" and info["stats"]["num_used_tokens"] == 0


def test_cache_salt_on_chat_and_completions(client, model_name, base_url, headers):
    # its first word is no other test's: after the template, no content token in common with earlier chats
    prompt = "Zebra " + " ".join(uuid.uuid4().hex for _ in range(6))

    def chat(salt, text=prompt):
        extra = {} if salt is None else {"cache_salt": salt}
        return cached_tokens_of(base_url, headers, lambda: client.chat.completions.create(
            model=model_name, messages=[{"role": "user", "content": text}], max_tokens=1, extra_body=extra))

    def completion(salt):
        extra = {} if salt is None else {"cache_salt": salt}
        return cached_tokens_of(base_url, headers, lambda: client.completions.create(
            model=model_name, prompt=prompt, max_tokens=1, extra_body=extra))

    # unsalted chats share the chat template's opening with earlier unsalted chats: that much only. One chat caches
    # that opening (whatever ran before), the next measures it; their first words differ from the prompt's, so
    # neither shares a content token with it (a random hex text could: 26 cached, not 24)
    chat(None, text="Warm " + uuid.uuid4().hex)
    template_only = chat(None, text="Quokka " + uuid.uuid4().hex)
    assert template_only > 0
    assert chat("s1") == 0 and chat("s2") == 0  # a new salt shares nothing, not even the template's opening
    salted = chat("s1")
    assert salted > template_only
    assert chat(None) == template_only  # not the salted copy of this prompt
    assert chat(None) == salted  # the unsalted copy, now cached
    assert completion("s3") == 0 and completion("s3") > 0 and completion("s4") == 0
    info = server_info(base_url, headers)
    assert info["memory_integrity"] == "ok" and info["stats"]["num_used_tokens"] == 0


# ---------------------------------------------------------------------- return_text_in_logprobs
def test_return_text_in_logprobs(base_url, headers, tokenizer):
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 4, "temperature": 0}, "return_logprob": True,
            "top_logprobs_num": 3, "logprob_start_len": 0, "return_text_in_logprobs": True}
    meta = post(base_url, headers, "/generate", body).json()["meta_info"]
    entries = meta["output_token_logprobs"] + meta["input_token_logprobs"]
    entries += [e for top in meta["output_top_logprobs"] + meta["input_top_logprobs"] if top for e in top]
    assert len(entries) > 4 + len(tokenizer.encode(PROMPT))
    for lp, tid, text in entries:
        assert text == tokenizer.decode([tid]), (tid, text)
    plain = post(base_url, headers, "/generate", {**body, "return_text_in_logprobs": False}).json()["meta_info"]
    assert all(e[2] is None for e in plain["output_token_logprobs"])


# ---------------------------------------------------------------------- memory pool size, context overflow
def test_get_memory_pool_size_is_the_planned_kv_pool(base_url, headers):
    info = server_info(base_url, headers)
    planned = info["memory_plan"]["max_total_num_tokens"]
    assert planned == info["max_total_num_tokens"] == info["kv_cache"]["max_total_num_tokens"] > 0
    for method in (requests.get, requests.post):
        r = method(f"{base_url}/get_memory_pool_size", headers=headers, timeout=30)
        assert r.status_code == 200 and r.json() == planned and type(r.json()) is int


def test_context_overflow_uses_upstreams_words(client, model_name, base_url, headers, model_info):
    head = f"Requested token count exceeds the model's maximum context length of {model_info['context_len']} tokens."
    fits_alone = model_info["context_len"] - 1  # fits without the prompt, not with it
    r = post(base_url, headers, "/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": fits_alone}})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith(head), r.text
    assert "max_new_tokens" in r.json()["error"]["message"]
    # a completion that cannot fit even alone: upstream's other sentence
    r = post(base_url, headers, "/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 10**7}})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith(
        f"max_completion_tokens is too large: {10**7}."), r.text
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_name, prompt=PROMPT, max_tokens=fits_alone)
    assert e.value.body["message"].startswith(head) and e.value.body["code"] == "context_length_exceeded"


ROUTES_4 = [("/v1/chat/completions", {"messages": CHAT, "max_tokens": 4, "temperature": 0}),
            ("/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}),
            ("/v1/responses", {"input": PROMPT, "max_output_tokens": 4, "temperature": 0}),
            ("/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 4, "temperature": 0}})]


@pytest.mark.parametrize("path, body", ROUTES_4, ids=[p for p, _ in ROUTES_4])
def test_stream_null_and_priority_as_sglang_router_sends_them(base_url, headers, path, body):
    """"stream": null is OpenAI's default (not streamed); upstream's "priority" is accepted and, as upstream without
    --enable-priority-scheduling, changes nothing: the same JSON answer as the body without both."""
    plain = post(base_url, headers, path, body)
    routed = post(base_url, headers, path, {**body, "stream": None, "priority": 7})
    assert plain.status_code == routed.status_code == 200, routed.text
    assert routed.headers["content-type"].startswith("application/json")

    def text(r):
        j = r.json()
        if "choices" in j:
            c = j["choices"][0]
            return c["message"]["content"] if "message" in c else c["text"]
        return j["text"] if "text" in j and isinstance(j["text"], str) else j["output"][0]["content"][0]["text"]

    assert text(routed) == text(plain)
    bad = post(base_url, headers, path, {**body, "priority": "high"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "priority", bad.text
