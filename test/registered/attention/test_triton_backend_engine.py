"""--attention-backend triton end to end on CPU (Triton interpreter, in a child process: interpreted_run.py): a
small random-weight Qwen3 (GQA 2:1, q/k norms) gives exactly the greedy tokens of torch_native in fp32 through
sglang.Engine -- one batch of mixed prompt lengths (3 to 300 tokens; the 300-token one decodes over two KV splits),
then requests that extend a cached prefix (radix hits) -- at page sizes 1 and 16 and two split counts; no
retraction, pools intact. Without the interpreter, triton on CPU is refused at startup naming
TRITON_INTERPRET; under it, bf16 is refused (the interpreter's bf16 dot products are wrong)."""

import json
import os
import subprocess
import sys

import pytest
from interpreted_run import run_engine, run_in_interpreter

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import make_random_qwen3

register_cpu_ci(est_time=40, suite="cpu")

MAX_NEW = 6
# 300 tokens: more than the interpreter tiles' 256 tokens per decode split, so its decode merges two splits
MIXED = [[5, 17, 300, 42, 9], [100, 200, 300], [7] * 12, list(range(20, 60)), [(i * 37) % 500 + 2 for i in range(300)]]
SHARED = [(i * 11) % 400 + 3 for i in range(70)]
# after SHARED itself, two requests that extend its cached 70 tokens (radix hits; 64 of them at page size 16)
BATCHES = [MIXED, [SHARED], [SHARED + [9, 8, 7, 6, 5]], [SHARED + list(range(30, 60))]]
ENGINE_KW = dict(skip_tokenizer_init=True, max_total_memory_gb=1, chunked_prefill_size=512)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return make_random_qwen3(str(tmp_path_factory.mktemp("qwen3") / "m"))


@pytest.fixture(scope="module")
def reference(model_path):
    return run_engine(model_path, "torch_native", ENGINE_KW, BATCHES, MAX_NEW)


@pytest.mark.parametrize("page_size,num_kv_splits", [(1, 8), (16, 2)])
def test_triton_matches_torch_native(model_path, reference, page_size, num_kv_splits):
    kw = dict(ENGINE_KW, page_size=page_size, triton_attention_num_kv_splits=num_kv_splits)
    got = run_in_interpreter("engine", json.dumps(dict(model_path=model_path, backend="triton", engine_kwargs=kw,
                                                       batches=BATCHES, max_new_tokens=MAX_NEW)))
    ids = [[o["output_ids"] for o in batch] for batch in got["outputs"]]
    ref_ids = [[o["output_ids"] for o in batch] for batch in reference["outputs"]]
    assert all(len(o) == MAX_NEW for batch in ids for o in batch)
    assert ids == ref_ids
    cached = [batch[0]["cached_tokens"] for batch in got["outputs"][1:]]
    # the prefix requests really hit the cache: at least the full pages of the shared 70 tokens
    assert cached[0] == 0 and min(cached[1:]) >= (len(SHARED) // page_size) * page_size, cached
    assert got["num_retractions"] == 0
    print(f"triton page {page_size}: startup {got['startup_s']:.1f} s, generate {got['generate_s']:.1f} s")


@pytest.mark.parametrize("interpret,dtype,message", [
    (False, "float32", "--attention-backend triton cannot run here"),  # at startup, before the weights load
    (True, "bfloat16", "cannot run bfloat16"),  # the interpreter's bf16 dot products are wrong
])
def test_refused_on_cpu(model_path, interpret, dtype, message):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    code = ("import sglang; sglang.Engine(model_path=%r, dtype=%r, skip_tokenizer_init=True, "
            "attention_backend='triton', log_level='error')" % (model_path, dtype))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert message in out.stderr, out.stderr[-2000:]
    if not interpret:
        assert "TRITON_INTERPRET=1" in out.stderr
