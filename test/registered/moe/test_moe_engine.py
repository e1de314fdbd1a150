"""MoE checkpoints through sglang.Engine: fp32 greedy tokens equal HF transformers' on random-weight Qwen3-MoE,
Mixtral and Qwen2-MoE (shared expert, one dense layer) checkpoints (moe_fixtures.py), at tp=1 and tp=2 (rank 1 a
child process, CPU gloo).

Each engine runs four scenarios, each compared token for token with HF's greedy continuation of the same ids:
8 prompts; a prompt longer than the chunk (chunked prefill at --chunked-prefill-size 32); three prompts that share
a cached prefix (prefix-cache hits); 8 requests that do not fit the tiny KV pool at once (retraction). After each,
the allocator is idle and intact, and the MoE workspace the runner allocated is the plan's term.
"""

import pytest

from sglang import Engine
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import assert_idle_and_intact, hf_greedy, shutdown
from sglang.test.moe_fixtures import VOCAB_SIZE, make_random_mixtral, make_random_qwen2_moe, make_random_qwen3_moe

register_cpu_ci(est_time=35, suite="cpu")

CHUNK = 32
# 8 x (11-14 prompt + 32 new) tokens exceed the 256-token pool: decode must retract
FLAGS = dict(dtype="float32", skip_tokenizer_init=True, max_total_tokens=256, chunked_prefill_size=CHUNK,
             log_level="warning", random_seed=0)
PROMPTS = [[(37 * i + 11 * j + 5) % VOCAB_SIZE for j in range(5 + i)] for i in range(8)]
RETRACT = [[(13 * i + 7 * j + 3) % VOCAB_SIZE for j in range(11 + i % 4)] for i in range(8)]
LONG = [(29 * j + 1) % VOCAB_SIZE for j in range(3 * CHUNK + 7)]
PREFIX = [(17 * j + 2) % VOCAB_SIZE for j in range(2 * CHUNK + 3)]
SUFFIXES = [[400, 401], [7, 8, 9], [250]]
MAKERS = {"qwen3_moe": make_random_qwen3_moe, "mixtral": make_random_mixtral, "qwen2_moe": make_random_qwen2_moe}


def greedy(n):
    return {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}


def scenarios(engine) -> dict:
    out = {}
    out["prompts"] = [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=greedy(12))]
    assert_idle_and_intact(engine)

    out["chunked"] = engine.generate(input_ids=[LONG], sampling_params=greedy(8))[0]["output_ids"]
    assert_idle_and_intact(engine)

    engine.flush_cache()
    engine.generate(input_ids=[PREFIX + [1]], sampling_params=greedy(1))  # caches the shared prefix
    outs = engine.generate(input_ids=[PREFIX + s for s in SUFFIXES], sampling_params=greedy(10))
    out["prefix"] = [o["output_ids"] for o in outs]
    out["prefix_hits"] = [o["meta_info"]["cached_tokens"] for o in outs]
    assert_idle_and_intact(engine)

    before = engine.scheduler.num_retractions
    out["retraction"] = [o["output_ids"] for o in engine.generate(input_ids=RETRACT, sampling_params=greedy(32))]
    out["num_retractions"] = engine.scheduler.num_retractions - before
    assert_idle_and_intact(engine)

    info = engine.get_server_info()
    terms = {t["name"]: t["num_bytes"] for t in info["memory_plan"]["terms"]}
    out["moe_workspace"] = [(r["allocated_bytes"]["moe_workspace"], terms["moe_workspace"])
                            for r in info["memory_plan_per_rank"]]
    return out


@pytest.fixture(scope="module", params=list(MAKERS))
def model(request, tmp_path_factory):
    path = MAKERS[request.param](str(tmp_path_factory.mktemp(request.param) / "m"))
    ref = {"prompts": hf_greedy(path, PROMPTS, 12), "chunked": hf_greedy(path, [LONG], 8)[0],
           "prefix": hf_greedy(path, [PREFIX + s for s in SUFFIXES], 10), "retraction": hf_greedy(path, RETRACT, 32)}
    return path, ref


@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def served(request, model):
    path, ref = model
    engine = Engine(model_path=path, tp_size=request.param, **FLAGS)
    try:
        return scenarios(engine), ref, request.param
    finally:
        shutdown(engine)


def test_greedy_tokens_equal_hf(served):
    got, ref, _ = served
    assert got["prompts"] == ref["prompts"]


def test_chunked_prefill(served):
    got, ref, _ = served
    assert len(LONG) > 3 * CHUNK
    assert got["chunked"] == ref["chunked"]


def test_prefix_cache_hits(served):
    got, ref, _ = served
    assert all(h >= 2 * CHUNK for h in got["prefix_hits"]), got["prefix_hits"]
    assert got["prefix"] == ref["prefix"]


def test_retraction(served):
    got, ref, _ = served
    assert got["num_retractions"] > 0
    assert got["retraction"] == ref["retraction"]


def test_every_rank_allocated_the_planned_moe_workspace(served):
    got, _, tp = served
    assert len(got["moe_workspace"]) == tp
    assert all(allocated == planned > 0 for allocated, planned in got["moe_workspace"]), got["moe_workspace"]
