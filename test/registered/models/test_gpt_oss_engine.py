"""gpt-oss and Mistral served through sglang.Engine: fp32 greedy tokens equal HF transformers' on random checkpoints
(test_gpt_oss.py / test_mistral.py build them; window 16), with gpt-oss's experts in float and in mxfp4.

Each engine runs: prompts 3x the window prefilled in 32-token chunks (every chunk edge inside or across a window);
prompts sharing a cached prefix longer than the window (prefix-cache hits); more requests than the tiny KV pool holds
at once (retraction, gpt-oss). After each, the allocator is idle and intact. gpt-oss runs at tp=1 and tp=2 (the
follower's windowed layers read the K/V rank 0's allocator mapped). `sglang plan` predicts a gpt-oss start's pools.
"""

import os

import pytest
import torch

from sglang import Engine
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import assert_idle_and_intact, shutdown
from sglang.test.hf_greedy_reference import teacher_forced_choices
from sglang.test.retraction_checks import greedy, retraction_prompts, run_retraction

from test_gpt_oss import VOCAB, WINDOW, make_gpt_oss, write_mxfp4_checkpoint  # noqa: E402 (the same directory)
from test_mistral import make_mistral  # noqa: E402

register_cpu_ci(est_time=180, suite="cpu")

CHUNK = 32
FLAGS = dict(dtype="float32", skip_tokenizer_init=True, max_total_tokens=256, chunked_prefill_size=CHUNK,
             log_level="warning", random_seed=0)
LONG = [[(29 * j + 7 * i + 1) % VOCAB for j in range(3 * WINDOW + 5 * i)] for i in range(3)]
PREFIX = [(17 * j + 2) % VOCAB for j in range(2 * WINDOW + 9)]
SUFFIXES = [[400, 401], [7, 8, 9], [250]]
# 8 x (11-14 prompt + 32 new) tokens exceed the 256-token full pool: decode must retract
RETRACT = retraction_prompts(VOCAB)


def save(kind: str, root: str) -> str:
    torch.manual_seed(0)
    path = os.path.join(root, kind)
    if kind == "mistral":
        make_mistral(WINDOW).float().eval().save_pretrained(path)
    else:
        make_gpt_oss().save_pretrained(os.path.join(root, "gpt_oss"))
        if kind == "gpt_oss_mxfp4":
            write_mxfp4_checkpoint(os.path.join(root, "gpt_oss"), path)
    return path


def scenarios(engine) -> dict:
    out = {"long": [o["output_ids"] for o in engine.generate(input_ids=LONG, sampling_params=greedy(16))]}
    assert_idle_and_intact(engine)
    engine.flush_cache()
    engine.generate(input_ids=[PREFIX + [1]], sampling_params=greedy(1))  # caches the shared prefix
    outs = engine.generate(input_ids=[PREFIX + s for s in SUFFIXES], sampling_params=greedy(10))
    out["prefix"] = [o["output_ids"] for o in outs]
    out["prefix_hits"] = [o["meta_info"]["cached_tokens"] for o in outs]
    out["retraction"], out["num_retractions"] = run_retraction(engine, RETRACT)
    return out


def reference(path: str, got: dict) -> dict:
    """HF's greedy choice after every prefix of prompt + our tokens, one forward per request (teacher-forced: equal to
    ours exactly when ours are HF's greedy continuation). transformers reads an mxfp4 directory dequantized on a CPU:
    the same values as ours, test_gpt_oss checks them bit for bit."""
    prompts = {"long": LONG, "prefix": [PREFIX + s for s in SUFFIXES], "retraction": RETRACT}
    return {k: teacher_forced_choices(path, p, got[k]) for k, p in prompts.items()}


# tp=2: rank 0's allocator sets the windowed slot map and sends each forward's entries to the follower (73928ce);
# without them the follower's windowed layers read the dummy page and leave HF's tokens after the first
@pytest.fixture(scope="module", params=[("gpt_oss", 1), ("gpt_oss_mxfp4", 1), ("mistral", 1), ("gpt_oss", 2)],
                ids=["gpt_oss-tp1", "gpt_oss_mxfp4-tp1", "mistral-tp1", "gpt_oss-tp2"])
def served(request, tmp_path_factory):
    kind, tp = request.param
    path = save(kind, str(tmp_path_factory.mktemp(kind)))
    engine = Engine(model_path=path, tp_size=tp, **FLAGS)
    try:
        got = scenarios(engine)
    finally:
        shutdown(engine)
    return got, reference(path, got), kind


def test_prompts_3x_the_window_in_chunks(served):
    got, ref, _ = served
    assert all(len(p) >= 3 * WINDOW for p in LONG)
    assert got["long"] == ref["long"]


def test_prefix_cache_hits(served):
    got, ref, _ = served
    assert all(h > WINDOW for h in got["prefix_hits"]), got["prefix_hits"]
    assert got["prefix"] == ref["prefix"]


def test_retraction(served):
    got, ref, kind = served
    if kind != "mistral":  # its windowed pool frees pages as the window moves: 8 requests may fit
        assert got["num_retractions"] > 0
    assert got["retraction"] == ref["retraction"]


def test_dry_run_plans_the_start(tmp_path):
    """`sglang plan` with the same flags predicts what a gpt-oss start allocates: its full pool (the 2 full layers),
    its windowed pool (the 2 sliding ones) and the int32 slot map between them, each within 3% (the start measures
    weights and activations, the dry run uses formulas); the start allocates exactly its own plan's terms."""
    import contextlib
    import io
    import json

    from sglang.cli.plan import main as plan_main

    path = save("gpt_oss", str(tmp_path))
    flags = dict(dtype="float32", chunked_prefill_size=CHUNK, max_total_memory_gb=1)
    engine = Engine(model_path=path, skip_tokenizer_init=True, log_level="warning", **flags)
    try:
        runner = engine.scheduler.model_runner
        served, alloc, got = engine.get_server_info()["memory_plan"], runner.token_to_kv_pool_allocator, \
            runner.allocated_bytes()
        for term in ("kv_cache", "kv_windowed", "kv_windowed_map"):
            assert got[term] == runner.memory_plan.bytes_of(term) > 0, term
        assert (alloc.size, alloc.windowed_size) == (served["max_total_num_tokens"], served["windowed_tokens"])
    finally:
        shutdown(engine)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        status = plan_main(["--device", "cpu", "--model-path", path, "--dtype", "float32", "--max-total-memory-gb", "1",
                            "--chunked-prefill-size", str(CHUNK), "--json"])
    assert status == 0
    planned = json.loads(buf.getvalue())["plan"]
    assert 0 < served["windowed_tokens"] < served["max_total_num_tokens"]  # a windowed pool beside the full one
    assert [t["name"] for t in planned["terms"]] == [t["name"] for t in served["terms"]]
    for key in ("max_total_num_tokens", "windowed_tokens"):
        assert abs(planned[key] - served[key]) <= 0.03 * served[key], (key, planned[key], served[key])
    terms = {t["name"]: t for t in planned["terms"]}
    for t in served["terms"]:
        if t["name"] in ("kv_cache", "kv_windowed", "kv_windowed_map"):
            assert abs(terms[t["name"]]["num_bytes"] - t["num_bytes"]) <= 0.03 * t["num_bytes"], (t, terms[t["name"]])
    print(f"gpt-oss plan vs start: T {planned['max_total_num_tokens']} / {served['max_total_num_tokens']}, "
          f"T_w {planned['windowed_tokens']} / {served['windowed_tokens']}, map bytes "
          f"{terms['kv_windowed_map']['num_bytes']} / {got['kv_windowed_map']}")
