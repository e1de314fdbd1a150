"""The MoE workspace is one declared term of the plan, the same in `sglang plan` and in a real start, and the runtime
allocates exactly it (and runs its experts in it).

The term is recomputed here from config.json by hand: M x k rows of (2N + N + K) activation elements, plus the int32
sort buffers: sorted ids (the rows, each expert's group padded to the row block B: + E x (B - 1)), one expert id per
block of B, expert offsets E + 1. B is 1 for the torch path (CPU), 64 for the Triton kernel (GPU).
"""

import contextlib
import io
import json
import os

import pytest
import torch

from sglang import Engine
from sglang.cli.plan import main as plan_main
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import shutdown
from sglang.test.moe_fixtures import make_random_qwen3_moe

register_cpu_ci(est_time=10, suite="cpu")

CHUNK = 48
FLAGS = ["--dtype", "float32", "--chunked-prefill-size", str(CHUNK), "--max-total-memory-gb", "0.5"]
FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mem_plan", "fixtures")
QWEN3_30B = os.path.join(FIXTURES, "qwen3-30b-a3b")
LLAMA_8B = os.path.join(FIXTURES, "llama-3.1-8b")


def by_hand(config: dict, tokens: int, tp: int, elem_bytes: int, block: int = 1) -> int:
    experts = config.get("num_experts") or config["num_local_experts"]
    rows = tokens * config["num_experts_per_tok"]
    n = config["moe_intermediate_size"] // tp
    sorted_ids = rows + experts * (block - 1)
    return rows * (2 * n + n + config["hidden_size"]) * elem_bytes + 4 * (sorted_ids + -(-sorted_ids // block)
                                                                          + experts + 1)


def by_hand_cpu_kernel(config: dict, tokens: int) -> int:
    """The CPU kernel's one byte buffer (bf16 experts on a CPU whose kernels load): int32 expert starts and block
    starts [E + 1], int32 slot tokens and fp32 slot weights [M k], bf16 silu(gate) * up [M k, N], the fp32 output sums
    [M, K]; every region rounded up to 64 bytes."""
    def up64(n):
        return (n + 63) // 64 * 64

    experts = config.get("num_experts") or config["num_local_experts"]
    rows = tokens * config["num_experts_per_tok"]
    return (2 * up64(4 * (experts + 1)) + 2 * up64(4 * rows) + up64(2 * rows * config["moe_intermediate_size"])
            + up64(4 * tokens * config["hidden_size"]))


def dry_run(*flags) -> dict:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        status = plan_main([*flags, "--json"])
    out = json.loads(buf.getvalue())
    assert status == 0, out
    return out


def term(result: dict, name: str) -> dict:
    return {t["name"]: t for t in result["plan"]["terms"]}[name]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = make_random_qwen3_moe(str(tmp_path_factory.mktemp("qwen3_moe") / "m"))
    with open(f"{path}/config.json") as f:
        return path, json.load(f)


def test_dry_run_declares_the_workspace(model):
    path, config = model
    from sglang.srt.configs.resolved import cpu_kernels_available

    kernel = cpu_kernels_available("cpu")  # bf16 experts run the CPU kernel where it loads, else the torch path
    for tp, dtype, elem in ((1, "float32", 4), (2, "float32", 4), (1, "bfloat16", 2), (2, "bfloat16", 2)):
        flags = ["--device", "cpu", "--model-path", path, *FLAGS, "--tp-size", str(tp), "--dtype", dtype]
        got = term(dry_run(*flags), "moe_workspace")
        assert got["source"] == "declared"
        # tp=2 halves the expert intermediate to 16 columns: not a multiple of 32, so the torch path
        if kernel and dtype == "bfloat16" and tp == 1:
            assert got["num_bytes"] == by_hand_cpu_kernel(config, CHUNK), (tp, dtype, got)
            assert "the CPU kernel's routing" in got["detail"]
        else:
            assert got["num_bytes"] == by_hand(config, CHUNK, tp, elem), (tp, dtype, got)
        assert f"{CHUNK} tokens x top-2 of 8 experts" in got["detail"]


def test_runtime_allocates_the_planned_workspace_and_runs_in_it(model):
    path, config = model
    planned = term(dry_run("--device", "cpu", "--model-path", path, *FLAGS), "moe_workspace")["num_bytes"]
    engine = Engine(model_path=path, skip_tokenizer_init=True, dtype="float32", chunked_prefill_size=CHUNK,
                    max_total_memory_gb=0.5, log_level="warning", random_seed=0)
    try:
        runner = engine.scheduler.model_runner
        assert runner.memory_plan.bytes_of("moe_workspace") == planned
        assert runner.allocated_bytes()["moe_workspace"] == planned
        assert sum(t.numel() * t.element_size() for t in runner.moe_workspace.buffers.values()) == planned
        from sglang.srt.layers.moe.moe_layer import FusedMoE

        layers = [m for m in runner.model.modules() if isinstance(m, FusedMoE)]
        assert len(layers) == config["num_hidden_layers"] and all(m.workspace is runner.moe_workspace for m in layers)
        runner.moe_workspace.expert_offsets.zero_()
        engine.generate(input_ids=[[5, 6, 7]], sampling_params={"max_new_tokens": 1, "temperature": 0})
        # the last expert call (the prefill of 3 tokens) grouped its 3 x 2 rows in the workspace
        assert runner.moe_workspace.expert_offsets[-1].item() == 3 * config["num_experts_per_tok"]
    finally:
        shutdown(engine)


def test_qwen3_30b_a3b_on_h100():
    with open(f"{QWEN3_30B}/config.json") as f:
        config = json.load(f)
    got = dry_run("--model-path", QWEN3_30B, "--gpu", "h100-80gb")
    assert got["plan"]["chunked_prefill_size"] == 8192
    # a GPU runs the Triton kernel: row block 64; its experts can be captured, so decode keeps its CUDA graphs
    assert term(got, "moe_workspace")["num_bytes"] == by_hand(config, 8192, 1, 2, block=64) == 570_724_860
    assert got["plan"]["cuda_graph_max_bs"] > 0
    tp4 = dry_run("--model-path", QWEN3_30B, "--gpu", "h100-80gb", "--tp", "4")
    assert term(tp4, "moe_workspace")["num_bytes"] == by_hand(config, tp4["plan"]["chunked_prefill_size"], 4, 2,
                                                              block=64)


def test_mixtral_8x7b_needs_two_h100s():
    """Mixtral-8x7B (published config): 46.7 B parameters by hand; alone on an H100 its weights do not fit, at tp=2
    (experts' columns split) and at ep=2 (whole experts per rank) it fits, with the workspace of the rank's experts."""
    path = os.path.join(FIXTURES, "mixtral-8x7b")
    with open(f"{path}/config.json") as f:
        config = json.load(f)
    v, h, n, layers, e = 32000, 4096, 14336, 32, 8
    params = 2 * v * h + layers * (2 * h * h + 2 * h * 1024 + e * 3 * h * n + h * e + 2 * h) + h
    assert params == 46_702_792_704
    got = dry_run("--model-path", path, "--gpu", "h200")
    assert term(got, "weights")["num_bytes"] == 2 * params + 32768 * 128 * 2  # + the shared bf16 rope table
    assert term(got, "moe_workspace")["num_bytes"] == by_hand(dict(config, moe_intermediate_size=n), 8192, 1, 2, 64)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert plan_main(["--model-path", path, "--gpu", "h100-80gb", "--json"]) != 0
    for par in (["--tp", "2"], ["--tp", "2", "--ep-size", "2"]):
        assert dry_run("--model-path", path, "--gpu", "h100-80gb", *par)["plan"]["max_total_num_tokens"] > 400_000


def test_dense_model_has_no_moe_workspace():
    assert term(dry_run("--model-path", LLAMA_8B, "--gpu", "h100-80gb"), "moe_workspace")["num_bytes"] == 0


def test_tp_must_divide_the_expert_sizes():
    from sglang.srt.configs.resolved import check_tp_sharding
    from sglang.srt.mem_plan.model_shapes import model_shape_from_config

    with open(f"{QWEN3_30B}/config.json") as f:
        config = json.load(f)
    check_tp_sharding(model_shape_from_config(config), 8)
    with pytest.raises(ValueError, match="does not divide the model's MoE intermediate size 36"):
        check_tp_sharding(model_shape_from_config(dict(config, moe_intermediate_size=36)), 8)
    qwen2 = dict(config, model_type="qwen2_moe", shared_expert_intermediate_size=20)
    with pytest.raises(ValueError, match="shared-expert intermediate size 20"):
        check_tp_sharding(model_shape_from_config(qwen2), 8)
    # every layer is sparse: the unused dense intermediate_size need not divide
    check_tp_sharding(model_shape_from_config(dict(config, intermediate_size=6145)), 8)


def test_bf16_experts_on_cpu_run_the_planned_kernel(model):
    """bf16 on a CPU whose kernels load: the plan charges the CPU kernel's buffer, the runtime allocates exactly it,
    every MoE layer runs the kernel on weights packed at attach, and a layer's output matches the torch path on the
    same (unpacked) weights within bf16 rounding."""
    from sglang.srt.configs.resolved import cpu_kernels_available
    from sglang.srt.layers.moe.fused_moe_cpu import unpack_moe_weight
    from sglang.srt.layers.moe.fused_moe_torch import fused_experts_torch
    from sglang.srt.layers.moe.moe_layer import FusedMoE
    from sglang.srt.layers.moe.router import select_experts

    if not cpu_kernels_available("cpu"):
        pytest.skip("the sgl-kernel CPU kernels do not load on this machine (the torch path serves bf16 experts)")
    path, config = model
    flags = ["--device", "cpu", "--model-path", path, "--dtype", "bfloat16", "--chunked-prefill-size", str(CHUNK),
             "--max-total-memory-gb", "0.5"]
    planned = term(dry_run(*flags), "moe_workspace")["num_bytes"]
    assert planned == by_hand_cpu_kernel(config, CHUNK)
    engine = Engine(model_path=path, skip_tokenizer_init=True, dtype="bfloat16", chunked_prefill_size=CHUNK,
                    max_total_memory_gb=0.5, log_level="warning", random_seed=0)
    try:
        runner = engine.scheduler.model_runner
        assert runner.memory_plan.bytes_of("moe_workspace") == runner.allocated_bytes()["moe_workspace"] == planned
        layers = [m for m in runner.model.modules() if isinstance(m, FusedMoE)]
        assert layers and all(m.impl == "cpu" and m.w13_weight.vnni_packed and m.w2_weight.vnni_packed for m in layers)
        out = engine.generate(input_ids=[5, 6, 7, 8], sampling_params={"max_new_tokens": 4, "temperature": 0})
        assert len(out["output_ids"]) == 4
        layer = layers[0]
        gen = torch.Generator().manual_seed(0)
        hidden = torch.randn(9, config["hidden_size"], generator=gen).to(torch.bfloat16)
        logits = torch.randn(9, layer.num_experts, generator=gen)
        with torch.inference_mode():
            got = layer(hidden, logits).float()
            weights, ids = select_experts(logits, layer.top_k, layer.renormalize)
            want = fused_experts_torch(hidden, unpack_moe_weight(layer.w13_weight, True),
                                       unpack_moe_weight(layer.w2_weight, False), weights, ids).float()
        assert (got - want).abs().max() <= 2 ** -6 * want.abs().max(), (got - want).abs().max()
    finally:
        shutdown(engine)
