"""POST /v1/embeddings through the real `openai` client against an --is-embedding server on the default model in
float32: single, batch, token-id and token-id-batch inputs, float and base64 encodings, equal to HF transformers'
last hidden state pooled at the last token and L2-normalized (cosine >= 0.9999); `dimensions` and bad inputs get a
400 naming the field, generation routes a 400 naming --is-embedding, and the server keeps serving."""

import base64

import numpy as np
import openai
import pytest
import requests
import torch

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import PROMPTS
from sglang.test.test_utils import DEFAULT_SMALL_SERVER_ARGS, openai_client, popen_launch_server

register_cpu_ci(est_time=50, suite="cpu")

MIN_COSINE = 0.9999


@pytest.fixture(scope="module")
def server():
    srv = popen_launch_server(other_args=[*DEFAULT_SMALL_SERVER_ARGS, "--dtype", "float32", "--is-embedding",
                                          "--enable-metrics"])
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def info(server):
    return requests.get(f"{server.base_url}/get_model_info", timeout=10).json()


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server.base_url)


@pytest.fixture(scope="module")
def reference(info):
    """(token ids, HF vector) per prompt of PROMPTS."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(info["tokenizer_path"])
    model = AutoModel.from_pretrained(info["model_path"], dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for p in PROMPTS:
            ids = tok(p)["input_ids"]
            h = model(torch.tensor([ids])).last_hidden_state[0, -1]
            out.append((ids, torch.nn.functional.normalize(h, dim=0).numpy()))
    return out


def cos(a, b):
    return float(np.dot(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)))


def test_single_batch_tokens_base64(client, info, reference):
    model = info["served_model_name"]
    assert info["is_generation"] is False
    r = client.embeddings.create(model=model, input=PROMPTS[0], encoding_format="float")
    assert len(r.data) == 1 and r.data[0].index == 0 and r.object == "list" and r.model == model
    assert cos(r.data[0].embedding, reference[0][1]) >= MIN_COSINE
    assert r.usage.prompt_tokens == r.usage.total_tokens == len(reference[0][0])
    batch = client.embeddings.create(model=model, input=PROMPTS, encoding_format="float")
    assert [d.index for d in batch.data] == list(range(len(PROMPTS)))
    for d, (ids, ref) in zip(batch.data, reference):
        assert cos(d.embedding, ref) >= MIN_COSINE
    assert batch.usage.prompt_tokens == sum(len(ids) for ids, _ in reference)
    toks = client.embeddings.create(model=model, input=reference[1][0], encoding_format="float")
    assert len(toks.data) == 1 and cos(toks.data[0].embedding, reference[1][1]) >= MIN_COSINE
    tok_batch = client.embeddings.create(model=model, input=[ids for ids, _ in reference[:3]], encoding_format="float")
    assert [cos(d.embedding, ref) >= MIN_COSINE for d, (_, ref) in zip(tok_batch.data, reference)] == [True] * 3
    # base64: little-endian float32 of the same vector; the client asks for it by default and decodes it itself
    # (within fp32 rounding: whether the two inputs share a prefill batch depends on when they arrive)
    b64 = client.embeddings.create(model=model, input=PROMPTS[:2], encoding_format="base64")
    assert isinstance(b64.data[1].embedding, str)
    decoded = np.frombuffer(base64.b64decode(b64.data[1].embedding), dtype="<f4")
    assert decoded.shape == (len(batch.data[1].embedding),)
    assert np.abs(decoded - np.asarray(batch.data[1].embedding, np.float32)).max() < 1e-5
    default = client.embeddings.create(model=model, input=PROMPTS[:2])
    assert isinstance(default.data[0].embedding, list) and cos(default.data[0].embedding, reference[0][1]) >= MIN_COSINE
    same = client.embeddings.create(model=model, input="x", dimensions=len(batch.data[0].embedding))
    assert len(same.data[0].embedding) == len(batch.data[0].embedding)
    # any model name is served and echoed, as upstream; without one the served name answers
    other = client.embeddings.create(model="BAAI/bge-m3", input=PROMPTS[0], encoding_format="float")
    assert other.model == "BAAI/bge-m3" and cos(other.data[0].embedding, reference[0][1]) >= MIN_COSINE
    unnamed = requests.post(f"{client.base_url}embeddings", json={"input": "x"}).json()
    assert unnamed["model"] == model


def test_refusals_keep_serving(client, server, info):
    model = info["served_model_name"]
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=model, input="hello", dimensions=64)
    assert "dimensions" in str(e.value) and str(info.get("hidden_size", "")) in str(e.value)
    for bad in ([], ["a", 1], [[1, 2], []], [1, -1]):
        r = requests.post(f"{server.base_url}/v1/embeddings", json={"input": bad})
        assert r.status_code == 400 and "input" in r.json()["error"]["message"] + str(r.json()["error"]["param"]), bad
    r = requests.post(f"{server.base_url}/v1/embeddings", json={"input": "hi " * 100_000})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="Hi", max_tokens=2)
    assert "--is-embedding" in str(e.value)
    r = requests.post(f"{server.base_url}/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 400 and "--is-embedding" in r.text
    assert requests.get(f"{server.base_url}/health_generate", timeout=30).status_code == 200
    assert len(client.embeddings.create(model=model, input=["a", "b"]).data) == 2
    srv_info = requests.get(f"{server.base_url}/server_info", timeout=30).json()
    assert srv_info["memory_integrity"] == "ok" and srv_info["stats"]["num_used_tokens"] == 0
