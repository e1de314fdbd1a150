"""End-to-end: the real `openai` client against a launched server with the bundled default model."""

import asyncio
import threading
import time

import openai
import pytest
import requests

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import openai_client

register_cpu_ci(est_time=30, suite="cpu", serial=True)  # asserts a time or CPU measure: run alone

CHAT = [{"role": "user", "content": "List three colors."}]


def greedy_chat(client, model, **kw):
    return client.chat.completions.create(model=model, messages=CHAT, temperature=0, max_tokens=12, **kw)


def test_models(client, model_name):
    models = client.models.list()
    assert [m.id for m in models.data] == [model_name]
    assert client.models.retrieve(model_name).id == model_name


def test_chat_usage_matches_tokenizer(client, model_name, tokenizer):
    resp = greedy_chat(client, model_name, logprobs=True)
    prompt = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert resp.usage.prompt_tokens == len(tokenizer.encode(prompt, add_special_tokens=False))
    assert resp.usage.completion_tokens == len(resp.choices[0].logprobs.content)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    assert resp.choices[0].finish_reason in ("stop", "length")
    assert resp.choices[0].message.role == "assistant" and resp.choices[0].message.content


def test_chat_stream_equals_non_stream(client, model_name):
    full = greedy_chat(client, model_name)
    chunks = list(greedy_chat(client, model_name, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_stream_and_length(client, model_name):
    kw = dict(model=model_name, prompt="Once upon a time", temperature=0, max_tokens=10, extra_body={"ignore_eos": True})
    full = client.completions.create(**kw)
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 10
    text = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw) if c.choices)
    assert text == full.choices[0].text


def test_stop_sequence(client, model_name):
    kw = dict(model=model_name, prompt="1, 2, 3, 4, 5,", temperature=0, max_tokens=16)
    base = client.completions.create(**kw).choices[0].text
    stop = base.strip().split()[2]  # a word in the middle of the greedy continuation
    resp = client.completions.create(stop=[stop], **kw)
    choice = resp.choices[0]
    assert choice.finish_reason == "stop" and stop not in choice.text
    assert base.startswith(choice.text)
    assert choice.model_extra.get("matched_stop") == stop


def test_n_choices_and_seed(fp32_server):
    """Seeded sampling is reproducible. In fp32: in bf16 the repeat's prompt comes from the prefix cache (only the
    last token is prefilled), whose logits round differently from a full prefill, and a near-tie may sample apart."""
    client = openai_client(fp32_server.base_url)
    model_name = client.models.list().data[0].id
    kw = dict(model=model_name, messages=CHAT, temperature=1.0, max_tokens=8, seed=1234, n=3)
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert 3 <= a.usage.completion_tokens <= 3 * 8
    single = client.chat.completions.create(**{**kw, "n": 1})
    assert single.choices[0].message.content == a.choices[0].message.content


def test_logprobs(client, model_name):
    resp = client.chat.completions.create(
        model=model_name, messages=CHAT, temperature=0, max_tokens=5, logprobs=True, top_logprobs=3
    )
    for item in resp.choices[0].logprobs.content:
        assert len(item.top_logprobs) == 3 and item.logprob <= 0
        assert item.logprob == pytest.approx(max(t.logprob for t in item.top_logprobs), abs=1e-3)  # greedy
    comp = client.completions.create(model=model_name, prompt="Hello", max_tokens=4, temperature=0, logprobs=2)
    lp = comp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == comp.usage.completion_tokens
    assert "".join(lp.tokens) == comp.choices[0].text


def test_concurrent_streams_match_solo(fp32_server):
    """8 concurrent greedy streams (batched prefill and decode) give each prompt the text it gets alone (fp32)."""
    client = openai_client(fp32_server.base_url)
    async_client = openai.AsyncOpenAI(base_url=f"{fp32_server.base_url}/v1", api_key="none", max_retries=0, timeout=120)
    model_name = client.models.list().data[0].id
    prompts = [f"Count from {i}:" for i in range(8)]
    solo = [client.completions.create(model=model_name, prompt=p, temperature=0, max_tokens=8).choices[0].text
            for p in prompts[:2]]

    async def one(p):
        stream = await async_client.completions.create(model=model_name, prompt=p, temperature=0, max_tokens=8, stream=True)
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async def run():
        return await asyncio.gather(*(one(p) for p in prompts))

    texts = asyncio.run(run())
    assert texts[:2] == solo and all(texts)


def test_health_answers_during_long_batch(base_url, headers, client, model_name):
    def long_requests():
        client.completions.create(model=model_name, prompt=["a b c"] * 4, max_tokens=64, extra_body={"ignore_eos": True})

    t = threading.Thread(target=long_requests)
    t.start()
    time.sleep(0.5)
    worst = 0.0
    while t.is_alive():
        start = time.perf_counter()
        assert requests.get(f"{base_url}/health", timeout=5).status_code == 200
        worst = max(worst, time.perf_counter() - start)
        time.sleep(0.2)
    t.join()
    assert worst < 1.0, f"/health took {worst:.2f} s while a batch ran"


def test_tokenize_detokenize(base_url, headers, tokenizer):
    r = requests.post(f"{base_url}/v1/tokenize", json={"prompt": "Hello world"}, headers=headers).json()
    assert r["tokens"] == tokenizer.encode("Hello world") and r["count"] == len(r["tokens"])
    d = requests.post(f"{base_url}/v1/detokenize", json={"tokens": r["tokens"]}, headers=headers).json()
    assert d["text"] == "Hello world"


def test_native_generate(base_url, headers, tokenizer):
    body = {"text": "The capital of Italy is", "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    r = requests.post(f"{base_url}/generate", json=body, headers=headers).json()
    assert r["meta_info"]["completion_tokens"] == len(r["output_ids"]) <= 6
    ids = tokenizer.encode(body["text"])
    r2 = requests.post(f"{base_url}/generate", json={"input_ids": ids, "sampling_params": body["sampling_params"]},
                       headers=headers).json()
    assert r2["output_ids"] == r["output_ids"]
    with requests.post(f"{base_url}/generate", json={**body, "stream": True}, headers=headers, stream=True) as s:
        lines = [l for l in s.iter_lines() if l]
    assert lines[-1] == b"data: [DONE]" and b'"text"' in lines[-2]
    batch = requests.post(f"{base_url}/generate", json={**body, "text": [body["text"], "Hi"]}, headers=headers).json()
    assert isinstance(batch, list) and batch[0]["output_ids"] == r["output_ids"]


def test_server_info_and_flush(base_url, headers):
    info = requests.get(f"{base_url}/server_info", headers=headers).json()
    assert info["max_total_num_tokens"] > 0 and info["memory_integrity"] == "ok"
    assert info["port"] == int(base_url.rsplit(":", 1)[1]) and "version" in info
    assert info["cuda_graphs"] == {"enabled": False, "reason": "cpu: no CUDA graphs here, decode runs eagerly"}
    from sglang.jit_kernel.cpu_ops import cpu_kernels_expected

    from sglang.jit_kernel.cpu_isa import at_least, cpu_isa, native_cpu_isa

    # the CPU level this server resolved, and the dtype and weight format it led to (bf16 only from avx512_bf16)
    dtype = "bfloat16" if at_least(cpu_isa(), "avx512_bf16") else "float32"
    assert info["cpu_isa"] == {"level": cpu_isa(), "native": native_cpu_isa(), "dtype": dtype,
                               "quantization": info["quantization"]}, info["cpu_isa"]
    assert info["dtype"] == dtype
    from sglang.jit_kernel.cpu_ops import quant_kernels_expected

    if cpu_kernels_expected():  # the default bf16 server decodes through the CPU kernels, and says so
        assert info["cpu_kernels"].startswith("in use, with"), info["cpu_kernels"]
    elif quant_kernels_expected():  # avx2 / avx512_vnni: fp32 activations through the quantized GEMM and fp32 kernels
        assert info["cpu_kernels"].startswith("in use for the quantized GEMM and the fp32 kernels"), info["cpu_kernels"]
    elif dtype == "bfloat16":  # SGLANG_CPU_KERNELS=0: the bf16 server says why the kernels are not used
        assert info["cpu_kernels"].startswith("not used"), info["cpu_kernels"]
    else:  # scalar: fp32 dense, nothing to load (the runner reports no kernel summary)
        assert info["cpu_kernels"] is None and info["quantization"] == "none", info["cpu_kernels"]
    assert requests.post(f"{base_url}/flush_cache", headers=headers).status_code == 200
    assert requests.get(f"{base_url}/health_generate", headers=headers).status_code == 200


def test_api_key(base_url, model_name):
    import openai

    bad = openai.OpenAI(base_url=f"{base_url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.chat.completions.create(model=model_name, messages=CHAT, max_tokens=2)
    assert e.value.status_code == 401 and "API key" in str(e.value)
    assert requests.get(f"{base_url}/v1/models").status_code == 401
    assert requests.get(f"{base_url}/health").status_code == 200  # health checks carry no credentials


def test_metrics(base_url, client, model_name):
    client.completions.create(model=model_name, prompt="Hi", max_tokens=3, extra_body={"ignore_eos": True})
    text = requests.get(f"{base_url}/metrics").text
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                 "sglang:prompt_tokens_total", "sglang:generation_tokens_total",
                 "sglang:time_to_first_token_seconds_bucket", "sglang:inter_token_latency_seconds_bucket"):
        assert name in text, name
    gen = [l for l in text.splitlines() if l.startswith("sglang:generation_tokens_total")]
    assert float(gen[0].rsplit(" ", 1)[1]) >= 3


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", "-s"]))
