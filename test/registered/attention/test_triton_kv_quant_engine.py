"""--attention-backend triton with a quantized KV cache end to end on CPU (Triton interpreter, child process:
interpreted_run.py): through sglang.Engine, a small random-weight Qwen3 (GQA 2:1) in fp32 gives the greedy tokens
of torch_native reading the same --kv-cache-dtype (both read the same codes: torch_native through its dequantizing
gather, Triton in-kernel), for a batch of mixed prompt lengths and then requests that extend a cached prefix (radix
hits: the cached prefix read through its codes, the new tokens attended as computed), at page size 16. fp8_e4m3
calibrates its per-head scales at startup through the Triton backend's prefill (kv_calibration.py), so both engines
hold the same scales."""

import json

import pytest
from interpreted_run import run_engine, run_in_interpreter

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import make_random_qwen3

register_cpu_ci(est_time=30, suite="cpu")

MAX_NEW = 5
SHARED = [(i * 11) % 400 + 3 for i in range(40)]
BATCHES = [[[5, 17, 300, 42, 9], list(range(20, 60)), [7] * 12], [SHARED], [SHARED + [9, 8, 7, 6, 5]]]
ENGINE_KW = dict(skip_tokenizer_init=True, max_total_memory_gb=1, chunked_prefill_size=512, page_size=16)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return make_random_qwen3(str(tmp_path_factory.mktemp("qwen3") / "m"))


@pytest.mark.parametrize("kv_cache_dtype", ["int4", "fp8_e4m3"])
def test_triton_matches_torch_native(model_path, kv_cache_dtype):
    kw = dict(ENGINE_KW, kv_cache_dtype=kv_cache_dtype)
    ref = run_engine(model_path, "torch_native", kw, BATCHES, MAX_NEW)
    got = run_in_interpreter("engine", json.dumps(dict(model_path=model_path, backend="triton", engine_kwargs=kw,
                                                       batches=BATCHES, max_new_tokens=MAX_NEW)))
    ids = [[o["output_ids"] for o in batch] for batch in got["outputs"]]
    assert all(len(o) == MAX_NEW for batch in ids for o in batch)
    assert ids == [[o["output_ids"] for o in batch] for batch in ref["outputs"]]
    assert got["outputs"][2][0]["cached_tokens"] >= 32  # the prefix request hit the cache (two full pages)
    assert got["num_retractions"] == 0
    print(f"triton {kv_cache_dtype}: startup {got['startup_s']:.1f} s, generate {got['generate_s']:.1f} s")
