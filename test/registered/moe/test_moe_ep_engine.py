"""--ep-size 2 through sglang.Engine(tp_size=2, ep_size=2) (rank 1 a child process, CPU gloo): each rank holds 4 of the
8 experts whole, and fp32 greedy tokens equal HF transformers' on the random-weight Qwen3-MoE, Mixtral and Qwen2-MoE
checkpoints (its shared expert stays split over both ranks) of test_moe_engine.py, in its four scenarios: 8 prompts,
chunked prefill, prefix-cache hits, retraction.

Also: rank 0 (this process) holds global experts [0, 4) whole, its model's tensors are the plan's weight formula at
ep=2, and every rank allocated the planned workspace, which is the formula by hand for E / 2 experts of the full
intermediate size (the torch path on CPU: block 1).
"""

import json

import pytest
import torch
from safetensors.torch import load_file
from test_moe_engine import CHUNK, FLAGS, LONG, MAKERS, PREFIX, PROMPTS, RETRACT, SUFFIXES, scenarios

from sglang import Engine
from sglang.srt.layers.moe.moe_layer import FusedMoE
from sglang.srt.model_executor.model_runner import _unique_tensor_bytes
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import hf_greedy, shutdown

register_cpu_ci(est_time=35, suite="cpu")

TP = EP = 2


def workspace_by_hand(config: dict) -> int:
    """The torch path's workspace for one rank: M = CHUNK tokens x k rows of 2N + N + K fp32 values (N whole: the
    rank's experts are not split), int32 sorted ids and expert ids (one per row, block 1) and E / ep + 1 offsets."""
    rows = CHUNK * config["num_experts_per_tok"]
    n = config.get("moe_intermediate_size") or config["intermediate_size"]  # Mixtral: intermediate_size
    experts = (config.get("num_experts") or config["num_local_experts"]) // EP
    return rows * (3 * n + config["hidden_size"]) * 4 + 4 * (2 * rows + experts + 1)


@pytest.fixture(scope="module", params=list(MAKERS))
def served(request, tmp_path_factory):
    path = MAKERS[request.param](str(tmp_path_factory.mktemp(request.param) / "m"))
    ref = {"prompts": hf_greedy(path, PROMPTS, 12), "chunked": hf_greedy(path, [LONG], 8)[0],
           "prefix": hf_greedy(path, [PREFIX + s for s in SUFFIXES], 10), "retraction": hf_greedy(path, RETRACT, 32)}
    engine = Engine(model_path=path, tp_size=TP, ep_size=EP, **FLAGS)
    try:
        runner = engine.scheduler.model_runner
        layers = [m for m in runner.model.modules() if isinstance(m, FusedMoE)]
        rank0 = {"layers": [(m.first_expert, m.num_local_experts, tuple(m.w13_weight.shape), tuple(m.w2_weight.shape))
                            for m in layers],
                 "expert3_layer0": (layers[0].w13_weight[3].clone(), layers[0].w2_weight[3].clone()),
                 "tensor_bytes": _unique_tensor_bytes(runner.model),
                 "formula_bytes": runner.model_facts().shape.weight_bytes(TP, "float32", EP)}
        got = scenarios(engine)
    finally:
        shutdown(engine)
    with open(f"{path}/config.json") as f:
        config = json.load(f)
    return got, ref, rank0, config, path


def test_greedy_tokens_equal_hf(served):
    got, ref, *_ = served
    assert got["prompts"] == ref["prompts"]


def test_chunked_prefill(served):
    got, ref, *_ = served
    assert got["chunked"] == ref["chunked"]


def test_prefix_cache_hits(served):
    got, ref, *_ = served
    assert all(h >= 2 * CHUNK for h in got["prefix_hits"]), got["prefix_hits"]
    assert got["prefix"] == ref["prefix"]


def test_retraction(served):
    got, ref, *_ = served
    assert got["num_retractions"] > 0
    assert got["retraction"] == ref["retraction"]


def test_rank0_holds_the_first_half_of_the_experts_whole(served):
    _, _, rank0, config, path = served
    n = config.get("moe_intermediate_size") or config["intermediate_size"]
    h, experts = config["hidden_size"], config.get("num_experts") or config["num_local_experts"]
    assert rank0["layers"] and all(layer == (0, experts // EP, (experts // EP, 2 * n, h), (experts // EP, h, n))
                                   for layer in rank0["layers"]), rank0["layers"]
    ckpt = load_file(f"{path}/model.safetensors")
    mixtral = any("block_sparse_moe" in name for name in ckpt)
    prefix = f"model.layers.0.{'block_sparse_moe' if mixtral else 'mlp'}.experts.3."
    gate, up, down = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    w13, w2 = rank0["expert3_layer0"]
    assert torch.equal(w13, torch.cat([ckpt[f"{prefix}{gate}.weight"], ckpt[f"{prefix}{up}.weight"]]))
    assert torch.equal(w2, ckpt[f"{prefix}{down}.weight"])
    assert rank0["tensor_bytes"] == rank0["formula_bytes"]


def test_every_rank_allocated_the_planned_workspace_by_hand(served):
    got, _, _, config, _ = served
    assert len(got["moe_workspace"]) == TP
    assert all(allocated == planned == workspace_by_hand(config) for allocated, planned in got["moe_workspace"]), \
        (got["moe_workspace"], workspace_by_hand(config))
