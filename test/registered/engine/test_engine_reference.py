"""The engine's fp32 greedy tokens equal HF transformers fp32, on SmolLM2 (bundled) and on a random Qwen3. The bundled
GGUF's path is given as a pathlib.Path, as users pass one. The SmolLM2 engine starts with skip_server_warmup (no
forward before the first request, the same tokens); the Qwen3 one with the default warmup."""

import pathlib

import pytest

from sglang import Engine
from sglang.srt.model_loader.model_path import default_model_path
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import PROMPTS, default_model_dir, hf_greedy, make_random_qwen3, shutdown

register_cpu_ci(est_time=25, suite="cpu")

MAX_NEW = 24


@pytest.fixture(scope="module")
def smollm_fp32():
    engine = Engine(model_path=pathlib.Path(default_model_path()), dtype="float32", max_total_memory_gb=3,
                    chunked_prefill_size=512, log_level="warning", skip_server_warmup=True)
    yield engine
    shutdown(engine)


def test_smollm2_fp32_greedy_equals_hf(smollm_fp32):
    engine = smollm_fp32
    assert engine.scheduler.runner.forward_ct == 0, "skip_server_warmup: no forward ran before the first request"
    tok = engine.tokenizer
    ids = [tok.encode(p) for p in PROMPTS]
    ref = hf_greedy(default_model_dir(), ids, MAX_NEW)
    # all prompts at once: batched prefill and decode must not change a single token
    outs = engine.generate(PROMPTS, {"temperature": 0, "max_new_tokens": MAX_NEW, "ignore_eos": True})
    for p, o, r in zip(PROMPTS, outs, ref):
        assert o["output_ids"] == r, f"mismatch for {p!r}"
        assert o["meta_info"]["finish_reason"] == {"type": "length", "length": MAX_NEW}
        assert o["text"] == tok.decode(r, skip_special_tokens=True)
    engine.scheduler.check_integrity()


def test_random_qwen3_fp32_greedy_equals_hf(tmp_path):
    path = make_random_qwen3(str(tmp_path / "qwen3"))
    prompts = [[5, 17, 300, 42, 9], [100, 200, 300], [7] * 12, list(range(20, 60))]
    ref = hf_greedy(path, prompts, 16)
    engine = Engine(model_path=path, dtype="float32", skip_tokenizer_init=True, max_total_memory_gb=1,
                    log_level="warning")
    try:
        assert engine.scheduler.runner.forward_ct > 0, "the default start runs the warmup requests"
        outs = engine.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": 16,
                                                                   "ignore_eos": True})
        assert [o["output_ids"] for o in outs] == ref
        engine.scheduler.check_integrity()
    finally:
        shutdown(engine)


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
