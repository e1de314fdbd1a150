"""Prompt logprobs over HTTP on an fp32 server with 16-token chunks, against HF transformers' fp32 log_softmax (1e-4):
/v1/completions echo + logprobs through the real `openai` client (OpenAI's legacy shape, the first token's logprob
null, max_tokens 0 and 1), vLLM's prompt_logprobs on completions and chat, /generate's logprob_start_len, /v1/score
(scores == HF's label probabilities, the query shared through the radix cache), and 400s naming the field."""

import math

import pytest
import requests

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import default_model_dir
from sglang.test.prompt_logprob_reference import (LOGPROB_PROMPTS, assert_logprobs_close, hf_prompt_logprobs,
                                                   load_hf_fp32, reference_token_logprobs)
from sglang.test.test_utils import openai_client, popen_launch_server

register_cpu_ci(est_time=40, suite="cpu")

TOL = 1e-4
SERVER_ARGS = ["--dtype", "float32", "--chunked-prefill-size", "16", "--max-total-tokens", "16384",
               "--max-running-requests", "16", "--enable-cache-report"]  # /v1/score's usage reports its cache hits


@pytest.fixture(scope="module")
def server():
    srv = popen_launch_server(other_args=SERVER_ARGS)
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server.base_url)


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir())


@pytest.fixture(scope="module")
def prompt_ids(tok):
    return [tok.encode(p) for p in LOGPROB_PROMPTS]


@pytest.fixture(scope="module")
def hf_model():
    return load_hf_fp32(default_model_dir())


@pytest.fixture(scope="module")
def ref(hf_model, prompt_ids):
    return hf_prompt_logprobs(hf_model, prompt_ids)


def _post(server, path, body):
    return requests.post(f"{server.base_url}{path}", json=body, timeout=120)


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_completions_echo_logprobs_openai_client(client, tok, prompt_ids, ref, max_tokens):
    resp = client.completions.create(model="default", prompt=prompt_ids, echo=True, logprobs=2, max_tokens=max_tokens,
                                     temperature=0)
    for ids, r, choice in zip(prompt_ids, ref, sorted(resp.choices, key=lambda c: c.index)):
        lp = choice.logprobs
        assert len(lp.tokens) == len(ids) + max_tokens
        assert lp.tokens[: len(ids)] == [tok.decode([t]) for t in ids]
        assert_logprobs_close(lp.token_logprobs[: len(ids)], reference_token_logprobs(r, ids, 0))
        assert lp.top_logprobs[0] is None and lp.text_offset[0] == 0
        for p in range(1, len(ids)):  # the top-2 of every prompt position, keyed by token text
            want_v, want_i = r[p - 1].topk(2)
            top = lp.top_logprobs[p]
            assert abs(top[tok.decode([int(want_i[0])])] - want_v[0].item()) <= TOL
        assert choice.text.startswith(tok.decode(ids))
        if max_tokens:  # the generated token follows, its offset after the echoed text
            assert abs(lp.token_logprobs[-1] - r[-1].max().item()) <= TOL
            assert lp.text_offset[-1] == len(tok.decode(ids))
    assert resp.usage.prompt_tokens == sum(len(i) for i in prompt_ids)


def test_vllm_prompt_logprobs_completions_and_chat(server, client, tok, prompt_ids, ref):
    ids, r = prompt_ids[3], ref[3]
    resp = client.completions.create(model="default", prompt=ids, max_tokens=1, temperature=0,
                                     extra_body={"prompt_logprobs": 2})
    plp = resp.choices[0].model_extra["prompt_logprobs"]
    assert plp[0] is None and len(plp) == len(ids)
    for p in range(1, len(ids)):
        entry = plp[p][str(ids[p])]
        assert abs(entry["logprob"] - r[p - 1, ids[p]].item()) <= TOL
        assert entry["rank"] == int((r[p - 1] > r[p - 1, ids[p]]).sum()) + 1
        best = int(r[p - 1].argmax())
        assert plp[p][str(best)]["rank"] == 1
    chat = _post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
                                                  "prompt_logprobs": 0}).json()
    assert len(chat["prompt_logprobs"]) == chat["usage"]["prompt_tokens"] and chat["prompt_logprobs"][0] is None


def test_generate_logprob_start_len(server, prompt_ids, ref):
    ids, r = prompt_ids[1], ref[1]
    out = _post(server, "/generate", {"input_ids": ids, "return_logprob": True, "logprob_start_len": 3,
                                      "top_logprobs_num": 1, "sampling_params": {"max_new_tokens": 2,
                                                                                 "temperature": 0}}).json()
    meta = out["meta_info"]
    assert [t for _, t, _ in meta["input_token_logprobs"]] == ids[3:]
    assert_logprobs_close([lp for lp, _, _ in meta["input_token_logprobs"]], reference_token_logprobs(r, ids, 3))
    assert len(meta["output_token_logprobs"]) == 2 and len(meta["input_top_logprobs"]) == len(ids) - 3


def test_score_matches_hf_and_shares_the_query(server, tok, hf_model):
    import torch

    query, items = "The capital of France is Paris. The capital of Germany is", [" Berlin", " Munich", " Paris"]
    labels = [tok.encode(" a")[0], tok.encode(" the")[0], tok.encode(".")[0]]
    body = {"query": query, "items": items, "label_token_ids": labels}
    out = _post(server, "/v1/score", body).json()
    soft = _post(server, "/v1/score", {**body, "apply_softmax": True}).json()
    for item, scores, soft_scores in zip(items, out["scores"], soft["scores"]):
        with torch.no_grad():
            last = torch.log_softmax(hf_model(torch.tensor([tok.encode(query + item)])).logits[0, -1], -1)
        for label, s in zip(labels, scores):
            assert abs(s - math.exp(last[label].item())) <= TOL
        want = torch.softmax(last[labels], -1).tolist()
        assert all(abs(a - b) <= TOL for a, b in zip(soft_scores, want))
    # the items after the first prefill only what follows the cached query
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] >= (len(items) - 1) * (len(tok.encode(query)) - 2)


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": "Hi", "echo": True, "logprobs": 6, "max_tokens": 0}, "logprobs"),
    ("/v1/completions", {"prompt": "Hi", "prompt_logprobs": 21}, "prompt_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "prompt_logprobs": 1, "stream": True},
     "prompt_logprobs"),
    ("/generate", {"text": "Hi", "return_logprob": True, "top_logprobs_num": 21}, "top_logprobs_num"),
    ("/generate", {"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": 2}, "logprob_start_len"),
    ("/generate", {"text": "Hi", "logprob_start_len": 0}, "logprob_start_len"),
    ("/generate", {"text": "Hi", "return_logprob": True, "token_ids_logprob": [-1]}, "token_ids_logprob"),
    ("/v1/score", {"query": "Hi", "items": [[1, 2]], "label_token_ids": [1]}, "items"),
    ("/v1/score", {"query": "Hi", "items": [" a"], "label_token_ids": [10 ** 7]}, "label_token_ids"),
    ("/v1/score", {"query": "Hi", "items": [" a"], "label_token_ids": []}, "label_token_ids"),
])
def test_bad_logprob_inputs_are_400_naming_the_field(server, path, body, param):
    resp = _post(server, path, body)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == param and param in err["message"], err
    ok = _post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 0, "echo": True, "logprobs": 0})
    assert ok.status_code == 200 and ok.json()["choices"][0]["logprobs"]["token_logprobs"][0] is None


# ---------------------------------------------------------------------- lm-evaluation-harness (local-completions)
TASK_DIR = __import__("pathlib").Path(__file__).parent / "lm_eval_tasks"


@pytest.fixture(scope="module")
def engine():
    from sglang import Engine
    from sglang.test.engine_fixtures import shutdown

    e = Engine(dtype="float32", max_total_memory_gb=1, chunked_prefill_size=16, log_level="warning")
    yield e
    shutdown(e)


def test_lm_eval_local_tasks_equal_the_engine(server, engine, tmp_path, monkeypatch):
    """lm-eval's local-completions runs a local multiple-choice task (log-likelihoods from echo + logprobs) and a
    generate_until task against the server; each log-likelihood equals the Engine's own prompt logprobs summed."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    from lm_eval import simple_evaluate
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    data = str(TASK_DIR / "local_mc.jsonl")
    for name in ("local_mc.yaml", "local_gen.yaml"):
        (tmp_path / name).write_text((TASK_DIR / name).read_text().replace("DATA_FILE", data))
    lm = LocalCompletionsAPI(base_url=f"{server.base_url}/v1/completions", model="default",
                             tokenizer=default_model_dir(), tokenizer_backend="huggingface", num_concurrent=1,
                             max_retries=1, batch_size=1)
    res = simple_evaluate(model=lm, tasks=["sglang_local_mc", "sglang_local_gen"],
                          task_manager=TaskManager(include_path=str(tmp_path)), log_samples=True)
    mc = res["samples"]["sglang_local_mc"]
    pairs = [(tuple(arg), resp[0]) for doc in mc for arg, resp in zip(doc["arguments"], doc["resps"])]
    assert len(pairs) == 19  # every choice of the 6 questions
    for (ctx, cont), (ll, _greedy) in pairs:
        ctx_ids, cont_ids = lm._encode_pair(ctx, cont)
        o = engine.generate(input_ids=ctx_ids + cont_ids, sampling_params={"max_new_tokens": 0},
                            return_logprob=True, logprob_start_len=len(ctx_ids))
        want = sum(lp for lp, _, _ in o["meta_info"]["input_token_logprobs"])
        assert abs(ll - want) <= TOL, (ctx, cont, ll, want)
    assert res["results"]["sglang_local_mc"]["acc,none"] >= 0.5  # the model knows most of these
    for doc in res["samples"]["sglang_local_gen"]:
        ctx = doc["arguments"][0][0]
        o = engine.generate(input_ids=lm.tok_encode(ctx), sampling_params={"max_new_tokens": 8, "temperature": 0,
                                                                           "stop": ["\n"]})
        assert doc["resps"][0][0] == o["text"], (ctx, doc["resps"], o["text"])
