"""Streams that fall behind, and the writes of a stream: a client that reads slower than tokens arrive gets the
deltas queued meanwhile merged into fewer chunks, whose text and logprobs are those of the non-streamed reply; n > 1
streams end with every choice's finish, the usage and one [DONE]. Chunks are parsed with the real `openai` client's
models; the slow reader is a raw socket with a tiny TCP window (an HTTP client library would read ahead)."""

import http.client
import json
import socket
import time

import pytest
from openai.types.chat import ChatCompletionChunk

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="cpu")

MESSAGES = [{"role": "user", "content": "Tell me a long story about a river and a mill."}]
DONE = b"data: [DONE]\n\n"


class TinyWindowConnection(http.client.HTTPConnection):
    """A receive buffer of ~1 KiB, and segments of 88 bytes announced to the server, so the server's kernel takes
    only ~50 KB of this response before the server's writer has to wait (on loopback it would otherwise take MBs)."""

    def connect(self):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 88)
        sock.settimeout(self.timeout)
        sock.connect((self.host, self.port))
        self.sock = sock


def sse_events(data: bytes) -> list:
    assert data.endswith(DONE) and data.count(DONE) == 1, data[-200:]
    events = [e for e in data.split(b"\n\n") if e]
    assert all(e.startswith(b"data: ") for e in events)
    return [ChatCompletionChunk.model_validate_json(e[6:]) for e in events[:-1]]


def test_slow_reader_gets_merged_chunks_with_the_same_text_and_logprobs(base_url, headers, client, model_name):
    # 96 tokens with 20 top logprobs each: ~165 KB of chunks, several times what the kernel holds for the tiny window
    kw = dict(model=model_name, messages=MESSAGES, max_tokens=96, temperature=0, logprobs=True, top_logprobs=20)
    client.chat.completions.create(**kw, extra_body={"ignore_eos": True})  # the prompt enters the prefix cache, so
    start = time.perf_counter()  # the reference and the slow stream below are computed the same way
    ref = client.chat.completions.create(**kw, extra_body={"ignore_eos": True})
    took_s = time.perf_counter() - start
    assert ref.usage.completion_tokens == 96

    host, port = base_url.split("://")[1].rsplit(":", 1)
    conn = TinyWindowConnection(host, int(port), timeout=120)
    conn.request("POST", "/v1/chat/completions", json.dumps({**kw, "ignore_eos": True, "stream": True}),
                 {**headers, "Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    time.sleep(2 * took_s + 1)  # the reply is generated while this client reads nothing
    chunks = sse_events(resp.read())
    conn.close()

    choices = [c.choices[0] for c in chunks if c.choices]
    assert choices[0].delta.role == "assistant"
    assert "".join(c.delta.content or "" for c in choices) == ref.choices[0].message.content
    got_lp = [lp for c in choices if c.logprobs for lp in c.logprobs.content]
    want_lp = ref.choices[0].logprobs.content
    assert [lp.token for lp in got_lp] == [lp.token for lp in want_lp]
    assert [lp.logprob for lp in got_lp] == pytest.approx([lp.logprob for lp in want_lp], abs=1e-4)
    top = lambda lps: [[t.token for t in lp.top_logprobs] for lp in lps]  # noqa: E731
    assert top(got_lp) == top(want_lp)
    assert [c.finish_reason for c in choices if c.finish_reason] == ["length"]
    token_chunks = [c for c in choices if c.logprobs and c.logprobs.content]
    print(f"slow reader: {len(token_chunks)} chunks for {len(got_lp)} tokens")
    # measured: 18 chunks for the 96 tokens; 72 when this process buffers 64 KiB per connection (asyncio's default)
    assert len(token_chunks) <= len(got_lp) // 2, "the deltas queued while the client was not reading were not merged"


@pytest.mark.parametrize("include_usage", [False, True])
def test_n_choices_stream_ends_once(base_url, headers, client, model_name, include_usage):
    kw = dict(model=model_name, messages=MESSAGES, max_tokens=8, temperature=0, n=2)
    ref = client.chat.completions.create(**kw)
    body = {**kw, "stream": True}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    host, port = base_url.split("://")[1].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {**headers, "Content-Type": "application/json"})
    chunks = sse_events(conn.getresponse().read())
    conn.close()
    texts = {0: "", 1: ""}
    finishes = {}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
    assert texts == {c.index: c.message.content for c in ref.choices}
    assert finishes == {c.index: c.finish_reason for c in ref.choices}
    if include_usage:
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == ref.usage.completion_tokens
        assert all(c.usage is None for c in chunks[:-1])
    else:
        assert all(c.choices for c in chunks)


def test_completions_many_prompts_stream_ends_once(base_url, headers, client, model_name):
    """2 prompts x n=2: four choices, each with the non-streamed text, then the usage and one [DONE]."""
    kw = dict(model=model_name, prompt=["Once upon a time", "The river"], max_tokens=6, temperature=0, n=2)
    ref = client.completions.create(**kw)
    host, port = base_url.split("://")[1].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    body = {**kw, "stream": True, "stream_options": {"include_usage": True}}
    conn.request("POST", "/v1/completions", json.dumps(body), {**headers, "Content-Type": "application/json"})
    data = conn.getresponse().read()
    conn.close()
    assert data.endswith(DONE) and data.count(DONE) == 1
    events = [json.loads(e[6:]) for e in data.split(b"\n\n") if e and e != DONE.strip()]
    texts, finishes = {}, {}
    for e in events:
        for ch in e["choices"]:
            texts[ch["index"]] = texts.get(ch["index"], "") + ch["text"]
            if ch["finish_reason"]:
                finishes[ch["index"]] = ch["finish_reason"]
    assert texts == {c.index: c.text for c in ref.choices}
    assert finishes == {c.index: c.finish_reason for c in ref.choices}
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == ref.usage.completion_tokens
