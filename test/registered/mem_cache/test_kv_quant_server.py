"""Quantized KV cache over HTTP (issue 23): one server per format family (fp8, int8 -- on a CPU with the bf16 kernels
both written and read by the kernels over the codes --, int4, the >= 8x mode), the real `openai` client. /server_info
reports the format's bytes per token (every scale byte, by hand here), its fixed bytes (fp8 scales, int4 key
multipliers), where its scales came from, the parts it stores turned, its gain over bf16, its quality flag and its
recent window (int4, int2_hadamard: 16 tokens a slot in bf16, fp8 48 on this torch_native server, each with the 4
attention sinks; the plan's kv_window term);
completions and streamed chat work and answer the factual prompt; the pool is intact afterwards; an unknown
--kv-cache-dtype is refused at startup naming the choices."""

import subprocess
import sys

import pytest
import requests

from sglang.srt.mem_plan import kv_quant
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import DEFAULT_SMALL_SERVER_ARGS, openai_client, popen_launch_server

register_cpu_ci(est_time=75, suite="cpu")

PER_HEAD_BYTES = {"fp8_e4m3": 128, "int8": 132, "int4": 72, "int2_hadamard": 31}  # d = 64, K and V, codes + scales
# per (layer, KV head), by hand: fp8's fp32 K and V scales, int4's fp32 key multiplier per channel
FIXED_BYTES = {"fp8_e4m3": 8, "int8": 0, "int4": 64 * 4, "int2_hadamard": 0}
SCALES = {"fp8_e4m3": "calibrated at startup", "int8": "per token", "int4": "key multipliers calibrated at startup",
          "int2_hadamard": "per token"}
TURNED = {"fp8_e4m3": ["k"], "int8": ["k"], "int4": ["k", "v"], "int2_hadamard": ["k", "v"]}  # stored x @ R


@pytest.mark.parametrize("fmt", list(PER_HEAD_BYTES))
def test_server_with_quantized_kv(fmt):
    srv = popen_launch_server(other_args=[*DEFAULT_SMALL_SERVER_ARGS, "--kv-cache-dtype", fmt])
    try:
        info = requests.get(f"{srv.base_url}/server_info", timeout=30).json()
        kv = info["kv_cache"]
        assert kv["kv_cache_dtype"] == fmt
        assert kv["bytes_per_token"] == 30 * 3 * PER_HEAD_BYTES[fmt] == info["memory_plan"]["kv_cell_bytes"]
        assert abs(kv["capacity_gain_vs_bf16"] - 256 / PER_HEAD_BYTES[fmt]) < 1e-3
        assert kv["fixed_bytes"] == 30 * 3 * FIXED_BYTES[fmt] == info["memory_plan"]["kv_fixed_bytes"], kv
        assert SCALES[fmt] in kv["scales"], kv
        assert kv["turned_parts"] == TURNED[fmt], kv
        assert kv["quality_flag"] == (kv_quant.quality_flag(fmt) or None), kv
        # int4 / int2_hadamard: a running request's last 16 tokens in bf16 (fp8: 48) and its first 4 (the attention
        # sinks), in R_w + 1 rings of (W + 4) x (30 x 3 x 256 B + an 8 B slot index) -- R_w = min(slots, what 1% of
        # the budget buys less the scratch row: mem_plan/kv_window.py) -- and the (slots + 1)-entry int64 slot -> row
        # map: the plan's kv_window term
        window = {"int4": 16, "int2_hadamard": 16, "fp8_e4m3": 48}.get(fmt, 0)
        sinks = 4 if window else 0
        assert kv["recent_window_tokens"] == window and kv["sink_tokens"] == sinks, kv
        plan = info["memory_plan"]
        slots, row_bytes = plan["max_running_requests"], (window + sinks) * (30 * 3 * 256 + 8)
        rows = min(slots, max(1, int(0.01 * plan["budget_bytes"]) // row_bytes - 1)) if window else 0
        assert kv["window_rows"] == plan["kv_window_rows"] == rows, (kv, plan["kv_window_rows"], rows)
        assert kv["window_bytes"] == ((rows + 1) * row_bytes + (slots + 1) * 8 if window else 0), kv
        terms = {t["name"]: t["num_bytes"] for t in info["memory_plan"]["terms"]}
        assert terms.get("kv_window", 0) == kv["window_bytes"], terms
        client = openai_client(srv.base_url)
        model = client.models.list().data[0].id
        out = client.completions.create(model=model, prompt="The capital of France is", temperature=0, max_tokens=8)
        assert "Paris" in out.choices[0].text, out.choices[0].text
        chunks = list(client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "List three colors."}], temperature=0, max_tokens=16,
            stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text.strip(), chunks
        stats = requests.get(f"{srv.base_url}/server_info", timeout=30).json()["stats"]
        assert stats["num_used_tokens"] == 0
    finally:
        srv.kill()


def test_unknown_kv_cache_dtype_is_refused():
    out = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--kv-cache-dtype", "int3"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "--kv-cache-dtype" in out.stderr and "int2_hadamard" in out.stderr, out.stderr[-2000:]
