"""The default CPU start serves the bundled model from its Q4_1 blocks, through sglang.Engine and the HTTP server.

Checked: /server_info and Engine.get_server_info report quantization 'gguf'; the plan's weights term is the
quantized size (measured from the loaded tensors: packed Q4_1 linears + the bf16 embedding, well under the dense
bf16 model's 287 MiB); greedy text from the Engine equals the HTTP server's (same kernels, one request at a time);
the flag rules at startup. Output quality is test_quant_quality.py's.
"""

import pytest
import requests

from sglang import Engine
from sglang.jit_kernel.cpu_ops import cpu_kernels_expected
from sglang.srt.layers.quantization import resolve_quantization
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import assert_idle_and_intact, shutdown
from sglang.test.test_utils import DEFAULT_SMALL_SERVER_ARGS, popen_launch_server

register_cpu_ci(est_time=60, suite="cpu")

PROMPTS = ["The three primary colors are", "Write a haiku about the ocean.\n", "def fibonacci(n):"]
SAMPLING = {"temperature": 0.0, "max_new_tokens": 24}
MIB = 2**20
# the default start serves Q4_1 only where quant_linear runs (without it the dense path is faster)
needs_kernels = pytest.mark.skipif(not cpu_kernels_expected() or " avx512_vnni" not in open("/proc/cpuinfo").read(),
                                   reason="no AVX-512 VNNI/BF16 kernels here: the default start stays dense")


@pytest.fixture(scope="module")
def engine():
    eng = Engine(max_total_memory_gb=3, log_level="warning")
    yield eng
    shutdown(eng)


def weights_term_bytes(info: dict) -> int:
    terms = info["memory_plan"]["terms"]
    return next(t["num_bytes"] for t in terms if t["name"] == "weights")


@needs_kernels
def test_default_start_serves_q4_1_blocks(engine):
    info = engine.get_server_info()
    assert info["quantization"] == "gguf" and info["dtype"] == "bfloat16"
    # packed Q4_1 (30 layers: 64.3 MiB) + bf16 embedding (54 MiB) + norms; the dense bf16 model holds 287 MiB
    assert 100 * MIB < weights_term_bytes(info) < 200 * MIB, weights_term_bytes(info)


@needs_kernels
def test_engine_and_http_server_give_the_same_greedy_text(engine):
    engine_texts = [engine.generate(p, dict(SAMPLING))["text"] for p in PROMPTS]
    assert all(len(t) > 10 for t in engine_texts)
    assert_idle_and_intact(engine)
    srv = popen_launch_server(other_args=[*DEFAULT_SMALL_SERVER_ARGS])
    try:
        info = requests.get(f"{srv.base_url}/server_info", timeout=30).json()
        assert info["quantization"] == "gguf"
        for prompt, expected in zip(PROMPTS, engine_texts):
            r = requests.post(f"{srv.base_url}/generate", json={"text": prompt, "sampling_params": SAMPLING}, timeout=120)
            assert r.status_code == 200, r.text
            assert r.json()["text"] == expected
    finally:
        srv.kill()


def test_flag_rules():
    assert resolve_quantization(None, True, "cpu", is_float32=False) == "gguf"
    assert resolve_quantization(None, True, "cpu", is_float32=True) == "none"  # the exact HF reference path
    assert resolve_quantization(None, False, "cpu", is_float32=False) == "none"
    assert resolve_quantization(None, True, "cuda", is_float32=False) == "none"
    assert resolve_quantization(None, True, "cpu", is_float32=False, kernels=False) == "none"  # no per-call dequant
    assert resolve_quantization("gguf", True, "cpu", is_float32=False, kernels=False) == "gguf"
    assert resolve_quantization("gguf", True, "cpu", is_float32=True) == "gguf"  # explicit wins
    assert resolve_quantization("w8a8_int8", False, "cpu", is_float32=False) == "w8a8_int8"
    with pytest.raises(ValueError, match="needs a .gguf --model-path"):
        resolve_quantization("gguf", False, "cpu", is_float32=False)
    with pytest.raises(ValueError, match="sized by `sglang plan` only"):
        resolve_quantization("fp8", False, "cpu", is_float32=False)
    with pytest.raises(ValueError, match="--tp-size 2"):
        resolve_quantization("w8a8_int8", False, "cpu", is_float32=False, tp_size=2)
