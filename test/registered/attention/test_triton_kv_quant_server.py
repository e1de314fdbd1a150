"""--attention-backend triton with --kv-cache-dtype int4 over HTTP (Triton interpreter on CPU, fp32, the default
model): the real `openai` client gets the factual completion and a streamed chat answer, /server_info reports the
int4 pool (72 B per token, KV head and layer) under the triton backend, and the pool is intact afterwards. A small
prefill chunk keeps the startup profile forward short under the interpreter, and few new tokens its decode (each
interpreted decode step runs every layer's split-KV kernel: "Paris" is the first token, the chat's first 3 "1. Red")."""

import requests

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import openai_client, popen_launch_server

register_cpu_ci(est_time=65, suite="cpu")

ARGS = ["--attention-backend", "triton", "--dtype", "float32", "--kv-cache-dtype", "int4", "--chunked-prefill-size",
        "64", "--max-total-memory-gb", "2", "--max-running-requests", "8"]


def test_triton_server_with_int4_kv():
    srv = popen_launch_server(other_args=ARGS, env={"TRITON_INTERPRET": "1"})
    try:
        info = requests.get(f"{srv.base_url}/server_info", timeout=30).json()
        assert info["kv_cache"]["kv_cache_dtype"] == "int4"
        assert info["kv_cache"]["bytes_per_token"] == 30 * 3 * 72
        assert info["attention_backend"]["name"] == "triton"
        client = openai_client(srv.base_url)
        model = client.models.list().data[0].id
        out = client.completions.create(model=model, prompt="The capital of France is", temperature=0, max_tokens=2)
        assert "Paris" in out.choices[0].text, out.choices[0].text
        chunks = list(client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "List three colors."}], temperature=0, max_tokens=3,
            stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip(), chunks
        assert requests.get(f"{srv.base_url}/server_info", timeout=30).json()["stats"]["num_used_tokens"] == 0
    finally:
        srv.kill()
