"""Upstream launch flags through a real server (`python -m sglang.launch_server`) and the real `openai` client:

    --max-payload-size N   a body of exactly N bytes is served, N + 1 bytes get 413 naming the limit and the flag
    --decode-log-interval  the scheduler's "Decode batch" info line: every step with 1 (its numbers match the
                           server's), never for a short request with a large interval
    --enable-custom-logit-processor / custom_logit_processor + custom_params: a client-sent processor forcing one
                           token id makes every generated token that id, on /v1/completions, /v1/chat/completions and
                           /generate; a request without it in the same batch gets the tokens it gets alone; a
                           processor that raises fails its own request with the exception text and the server keeps
                           serving; without the flag the field is a 400 naming the flag.
    --chat-template FILE   chat (plain and streamed) and /v1/responses render with the file's template: the greedy
                           completion of the prompt jinja2 renders from it (refusals: test_chat_template_flag.py).

Two servers: one float32 with the three flags (float32 so a batch's rows match the same prompts run alone), one
with the defaults and a large decode-log interval.
"""

import concurrent.futures
import json

import openai
import pytest
import requests

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.custom_logit_processors import client_processors
from sglang.test.test_utils import DEFAULT_SMALL_SERVER_ARGS, openai_client, popen_launch_server

register_cpu_ci(est_time=80, suite="cpu")

PAYLOAD_LIMIT_BYTES = 50_000  # far under the default 32 MiB: a server ignoring the flag would accept N + 1
FORCED_ID = 42  # ':' in the default model's vocabulary; any id works, the test compares ids
PROMPTS = ["The capital of France is", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def flags_server():
    srv = popen_launch_server(other_args=[
        *DEFAULT_SMALL_SERVER_ARGS, "--dtype", "float32", "--enable-custom-logit-processor",
        "--decode-log-interval", "1", "--max-payload-size", str(PAYLOAD_LIMIT_BYTES)])
    yield srv
    srv.kill()


# SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION: a pool of POOL_TOKENS, and requests asking for HUGE_NEW_TOKENS each. Unclipped
# (upstream's default clip, 4096, times the initial new-token ratio 0.7) two such reservations leave no room for a
# third; clipped to CLIP_TOKENS, four run together (upstream's test_large_max_new_tokens.py waits for exactly that).
POOL_TOKENS, HUGE_NEW_TOKENS, CLIP_TOKENS = 8192, 4000, 256
START_WITHIN_TOKENS = 64


# --chat-template: a turn format unlike the model's own (SmolLM2's adds a default system prompt), with a marker
SERVER_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n[flag] {{ m.content }}<|im_end|>\n{% endfor %}"
                   "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory):
    template = tmp_path_factory.mktemp("chat_template") / "turns.jinja"
    template.write_text(SERVER_TEMPLATE)
    srv = popen_launch_server(
        other_args=[*DEFAULT_SMALL_SERVER_ARGS, "--decode-log-interval", "1000000", "--max-total-tokens",
                    str(POOL_TOKENS), "--chat-template", str(template)],
        env={"SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION": str(CLIP_TOKENS)})
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def procs():
    return client_processors()


def generate(base_url, body):
    return requests.post(f"{base_url}/generate", json=body, timeout=300)


def greedy_ids(base_url, prompt, n):
    r = generate(base_url, {"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": n,
                                                                "ignore_eos": True}})
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


# ------------------------------------------------------------------------------------------- --max-payload-size
def body_of_size(size: int) -> bytes:
    """A valid /v1/completions body of exactly `size` bytes (padded in the `user` field)."""
    base = {"model": "default", "prompt": "Hi", "max_tokens": 1, "user": ""}
    pad = size - len(json.dumps(base).encode())
    return json.dumps({**base, "user": "u" * pad}).encode()


def test_max_payload_size_is_exact_in_bytes(flags_server):
    url = f"{flags_server.base_url}/v1/completions"
    headers = {"Content-Type": "application/json"}
    at_limit = body_of_size(PAYLOAD_LIMIT_BYTES)
    assert len(at_limit) == PAYLOAD_LIMIT_BYTES
    r = requests.post(url, data=at_limit, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    r = requests.post(url, data=body_of_size(PAYLOAD_LIMIT_BYTES + 1), headers=headers, timeout=120)
    assert r.status_code == 413, r.text
    message = r.json()["error"]["message"]
    assert f"at most {PAYLOAD_LIMIT_BYTES} bytes" in message and "--max-payload-size" in message, message
    # RFC 7231's reason phrase on the status line ("HTTP/1.1 413 Payload Too Large"), which upstream's test reads
    assert r.reason == "Payload Too Large" and message.startswith("Payload Too Large"), (r.reason, message)


# ------------------------------------------------------------------------------------------ --decode-log-interval
def decode_lines(log: str):
    return [line for line in log.splitlines() if "Decode batch." in line]


def test_decode_log_every_step(flags_server):
    before = len(decode_lines(flags_server.log()))
    ids = greedy_ids(flags_server.base_url, "Count: one, two,", 5)
    assert len(ids) == 5
    lines = decode_lines(flags_server.log())[before:]
    # 5 tokens: the prefill makes the first, 4 decode steps the rest, one line each
    assert len(lines) == 4, lines
    pool = requests.get(f"{flags_server.base_url}/server_info", timeout=30).json()["max_total_num_tokens"]
    assert all("INFO" in line and "#running-req: 1," in line and "#queue-req: 0" in line for line in lines), lines
    # KV tokens in use of the batch each step decodes: one more per step, out of the pool /server_info reports
    used = [int(line.split("#token: ")[1].split(" / ")[0]) for line in lines]
    assert used == list(range(used[0], used[0] + 4)) and all(f" / {pool} (" in line for line in lines), lines
    assert all(float(line.split("gen throughput (token/s): ")[1].split(",")[0]) > 0 for line in lines)


def test_no_decode_log_for_a_short_request_with_a_large_interval(plain_server):
    assert len(greedy_ids(plain_server.base_url, "Count: one, two,", 8)) == 8
    assert decode_lines(plain_server.log()) == []


# --------------------------------------------------------------------------------- --enable-custom-logit-processor
def test_forced_token_on_completions_and_chat(flags_server, procs):
    client = openai_client(flags_server.base_url)
    extra = {"custom_logit_processor": procs["force"], "custom_params": {"token_id": FORCED_ID}}
    tokenize = requests.post(f"{flags_server.base_url}/v1/detokenize", json={"tokens": [FORCED_ID] * 6}, timeout=30)
    forced_text = tokenize.json()["text"]
    c = client.completions.create(model="default", prompt=PROMPTS[0], max_tokens=6, temperature=0.9,
                                  extra_body=extra)
    assert c.choices[0].text == forced_text and c.usage.completion_tokens == 6
    chat = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=6, temperature=0.9, extra_body=extra)
    assert chat.choices[0].message.content == forced_text and chat.usage.completion_tokens == 6


def test_unforced_request_beside_a_forced_one_is_unaffected(flags_server, procs):
    alone = greedy_ids(flags_server.base_url, PROMPTS[1], 8)
    # one /generate batch: row 0 forced, row 1 plain greedy
    r = generate(flags_server.base_url, {
        "text": PROMPTS, "custom_logit_processor": [procs["force"], None],
        "sampling_params": [{"temperature": 0.7, "max_new_tokens": 8, "custom_params": {"token_id": FORCED_ID}},
                            {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}]})
    assert r.status_code == 200, r.text
    forced, plain = r.json()
    assert forced["output_ids"] == [FORCED_ID] * 8
    assert plain["output_ids"] == alone
    # and through the openai client, sent at once
    client = openai_client(flags_server.base_url)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        f = pool.submit(client.completions.create, model="default", prompt=PROMPTS[0], max_tokens=8,
                        extra_body={"custom_logit_processor": procs["force"], "custom_params": {"token_id": FORCED_ID}})
        p = pool.submit(client.completions.create, model="default", prompt=PROMPTS[1], max_tokens=8, temperature=0,
                        extra_body={"ignore_eos": True})
        assert p.result().choices[0].text == requests.post(
            f"{flags_server.base_url}/v1/detokenize", json={"tokens": alone}, timeout=30).json()["text"]
        assert f.result().usage.completion_tokens == 8


def test_raising_processor_fails_only_its_request(flags_server, procs):
    client = openai_client(flags_server.base_url)
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model="default", prompt="Hello", max_tokens=4,
                                  extra_body={"custom_logit_processor": procs["raise"]})
    assert e.value.status_code == 500 and "the client's processor raised on purpose" in str(e.value)
    # sent at once: the raising request fails, the plain one beside it gets the tokens it gets alone
    alone = greedy_ids(flags_server.base_url, PROMPTS[1], 6)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        bad = pool.submit(generate, flags_server.base_url, {
            "text": PROMPTS[0], "custom_logit_processor": procs["raise"],
            "sampling_params": {"temperature": 0, "max_new_tokens": 6}})
        good = pool.submit(generate, flags_server.base_url, {
            "text": PROMPTS[1], "sampling_params": {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}})
        assert bad.result().status_code == 500
        assert "the client's processor raised on purpose" in bad.result().json()["error"]["message"]
        assert good.result().status_code == 200 and good.result().json()["output_ids"] == alone
    assert greedy_ids(flags_server.base_url, PROMPTS[1], 6) == alone  # still serving
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="default", prompt="Hello", max_tokens=4,
                                  extra_body={"custom_logit_processor": "not a processor"})
    assert "custom_logit_processor" in str(e.value)


def test_without_the_flag_the_field_is_refused_naming_it(plain_server, procs):
    client = openai_client(plain_server.base_url)
    for call in (
        lambda: client.completions.create(model="default", prompt="Hi", max_tokens=2,
                                          extra_body={"custom_logit_processor": procs["force"]}),
        lambda: client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi"}],
                                               max_tokens=2, extra_body={"custom_logit_processor": procs["force"]}),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            call()
        assert "--enable-custom-logit-processor" in str(e.value)
    r = generate(plain_server.base_url, {"text": "Hi", "custom_logit_processor": procs["force"]})
    assert r.status_code == 400 and "--enable-custom-logit-processor" in r.json()["error"]["message"]
    assert len(greedy_ids(plain_server.base_url, "Hi", 2)) == 2


# ------------------------------------------------------------------------------------------------ --chat-template
def test_chat_template_flag_renders_chat_and_responses(plain_server):
    """Chat (plain and streamed) and /v1/responses are the greedy completion of the prompt the flag's template
    renders, rendered here by jinja2 itself: same prompt token count, same text."""
    import jinja2

    messages = [{"role": "user", "content": "Name a colour."}]
    prompt = jinja2.Template(SERVER_TEMPLATE).render(messages=messages, add_generation_prompt=True)
    client = openai_client(plain_server.base_url)
    ref = client.completions.create(model="default", prompt=prompt, max_tokens=8, temperature=0)
    chat = client.chat.completions.create(model="default", messages=messages, max_tokens=8, temperature=0)
    assert chat.usage.prompt_tokens == ref.usage.prompt_tokens
    assert chat.choices[0].message.content == ref.choices[0].text
    streamed = client.chat.completions.create(model="default", messages=messages, max_tokens=8, temperature=0,
                                              stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == ref.choices[0].text
    resp = client.responses.create(model="default", input=messages[0]["content"], max_output_tokens=8,
                                   temperature=0)
    assert resp.usage.input_tokens == ref.usage.prompt_tokens
    assert resp.output_text == ref.choices[0].text


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))


# ------------------------------------------------------------------------- SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
def test_clip_env_lets_four_huge_requests_run_together(plain_server):
    """Four requests sent at once all start before the first has streamed START_WITHIN_TOKENS tokens. Unclipped,
    the third waits until decoding has lowered new_token_ratio enough (hundreds of steps) for its reservation."""
    import math
    import threading

    import httpx

    from sglang.srt.managers.prefill_scheduler import CLIP_MAX_NEW_TOKENS, INIT_NEW_TOKEN_RATIO

    unclipped = math.ceil(min(HUGE_NEW_TOKENS, CLIP_MAX_NEW_TOKENS) * INIT_NEW_TOKEN_RATIO)
    assert 3 * unclipped > POOL_TOKENS  # the precondition: without the variable at most two start at once
    lock, counts, started_at = threading.Lock(), [0] * 4, [None] * 4
    all_started = threading.Event()

    def stream(i):
        body = {"text": f"Story {i}: once upon a time", "stream": True,
                "sampling_params": {"max_new_tokens": HUGE_NEW_TOKENS, "ignore_eos": True}}
        with httpx.Client(timeout=300) as http, http.stream("POST", f"{plain_server.base_url}/generate",
                                                            json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                with lock:
                    counts[i] = len(json.loads(line[6:])["output_ids"])
                    if started_at[i] is None:
                        started_at[i] = list(counts)  # every stream's progress when this one started
                    if all(s is not None for s in started_at):
                        all_started.set()
                if all_started.is_set():
                    return  # closing the stream aborts the request

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    assert all_started.wait(240), counts
    for t in threads:
        t.join(60)
    progress_when_last_started = max(started_at, key=lambda c: sum(1 for n in c if n))
    print(f"\ntokens streamed per request when the last one started: {progress_when_last_started}")
    assert max(max(c) for c in started_at) <= START_WITHIN_TOKENS, started_at
