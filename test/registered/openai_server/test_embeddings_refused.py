"""A generative server (the directory's shared one) answers POST /v1/embeddings with a 400 saying to start an embedding
server with --is-embedding, through the real `openai` client, and keeps serving; /get_model_info says it generates."""

import openai
import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="cpu")


def test_embeddings_need_is_embedding(client, model_name, model_info):
    assert model_info["is_generation"] is True
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=model_name, input="hello")
    assert "--is-embedding" in str(e.value)
    assert client.completions.create(model=model_name, prompt="Hi", max_tokens=2).usage.completion_tokens == 2
