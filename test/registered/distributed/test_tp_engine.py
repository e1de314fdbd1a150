"""Tensor parallelism through sglang.Engine: the same greedy fp32 tokens as one rank.

The default model (9 attention heads, 3 KV heads, intermediate 1536) at tp=3 against tp=1 with the same flags:
8 prompts, then retraction under a tiny KV pool, prefix-cache hits and chunked prefill -- each scenario on both
engines, outputs compared token for token. Rank 0 is this process; ranks 1-2 are child processes. After each
scenario rank 0's allocator is intact and idle (only rank 0 allocates: the other ranks' pools are indexed by the
slots it broadcasts), and every rank planned the same pool.
"""

import os

import psutil
import pytest

from sglang import Engine
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import PROMPTS, assert_idle_and_intact, shutdown

register_cpu_ci(est_time=40, suite="cpu")

GREEDY = {"temperature": 0, "ignore_eos": True}
# small pool: 8 requests x (prompt + 32) do not fit at once (retraction); chunk 64 splits the long prompt
FLAGS = dict(dtype="float32", max_total_tokens=256, chunked_prefill_size=64, log_level="warning", random_seed=0)
SYSTEM = "You are a helpful assistant who answers briefly and precisely. " * 5
LONG = "Here is a long story about a cat who liked to sit in the sun. " * 12


def scenarios(engine) -> dict:
    """Every scenario's outputs and the counters that prove it happened."""
    out = {}
    outs = engine.generate(PROMPTS, dict(GREEDY, max_new_tokens=12))
    out["prompts"] = [o["output_ids"] for o in outs]
    assert_idle_and_intact(engine)

    before = engine.scheduler.num_retractions
    prompts = [PROMPTS[i] + f" (request {i})" for i in range(8)]
    outs = engine.generate(prompts, dict(GREEDY, max_new_tokens=32))
    out["retraction"] = [o["output_ids"] for o in outs]
    out["num_retractions"] = engine.scheduler.num_retractions - before
    assert_idle_and_intact(engine)

    engine.flush_cache()
    engine.generate(SYSTEM + "Hi.", dict(GREEDY, max_new_tokens=1))  # caches the shared prefix
    outs = engine.generate([SYSTEM + q for q in ("What is 2+2?", "Name a color.", "Say hello.")],
                           dict(GREEDY, max_new_tokens=10))
    out["prefix"] = [o["output_ids"] for o in outs]
    out["prefix_hits"] = [o["meta_info"]["cached_tokens"] for o in outs]
    assert_idle_and_intact(engine)

    engine.flush_cache()
    out["chunked_len"] = len(engine.tokenizer.encode(LONG))
    out["chunked"] = engine.generate([LONG, PROMPTS[0]], dict(GREEDY, max_new_tokens=8))[0]["output_ids"]
    assert_idle_and_intact(engine)
    return out


@pytest.fixture(scope="module")
def reference():
    engine = Engine(**FLAGS)
    try:
        return scenarios(engine)
    finally:
        shutdown(engine)


@pytest.fixture(scope="module")
def tp3(reference):
    engine = Engine(tp_size=3, **FLAGS)
    yield engine
    pids = engine.tp_ranks.pids
    shutdown(engine)  # releases ranks 1-2: they leave their loop and exit
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]


@pytest.fixture(scope="module")
def tp3_outputs(tp3):
    return scenarios(tp3)


def test_every_rank_planned_the_same_pool(tp3):
    info = tp3.get_server_info()
    ranks = info["memory_plan_per_rank"]
    assert info["tp_size"] == 3 and [r["tp_rank"] for r in ranks] == [0, 1, 2]
    assert {r["max_total_num_tokens"] for r in ranks} == {info["max_total_num_tokens"]}
    assert len({r["pid"] for r in ranks}) == 3 and ranks[0]["pid"] == os.getpid()
    # each rank holds its third of the attention / MLP weights (embedding: a third of the vocabulary rows too)
    for r in ranks:
        assert r["allocated_bytes"] == ranks[0]["allocated_bytes"]


def test_greedy_tokens_equal_tp1(reference, tp3_outputs):
    assert tp3_outputs["prompts"] == reference["prompts"]


def test_retraction_under_tp(reference, tp3_outputs):
    assert tp3_outputs["num_retractions"] > 0
    assert tp3_outputs["retraction"] == reference["retraction"]


def test_prefix_cache_under_tp(reference, tp3_outputs):
    assert all(h >= 50 for h in tp3_outputs["prefix_hits"]), tp3_outputs["prefix_hits"]
    assert tp3_outputs["prefix"] == reference["prefix"]


def test_chunked_prefill_under_tp(reference, tp3_outputs):
    assert tp3_outputs["chunked_len"] > FLAGS["chunked_prefill_size"]
    assert tp3_outputs["chunked"] == reference["chunked"]
