"""Quantized MoE experts served on a CPU: GGUF Q4_0 / Q4_1 / Q8_0 files kept as blocks (--quantization gguf) and the
safetensors checkpoint quantized to 8-bit blocks at load (--quantization w8a8_int8), in bf16 through sglang.Engine.

Top-1 agreement, teacher-forced: the bf16 dense model of the same weights decodes 16 prompts greedily (24 tokens
each: 384 positions); the quantized model then reads those tokens in one prefill per prompt and its argmax at each
generated position is compared with the reference's token (>= 95%, the issue's bar). The reference for a GGUF file
is the file itself read dense (--quantization none: its blocks dequantized to bf16), so the figure measures the
quantized serving path (packed experts, int8 activations in the kernel); against the original fp32-drawn
checkpoint in bf16 the figure is printed too (it adds the blocks' own rounding; Q8_0 and int8 must still reach 95%).
The fixture's embedding has spread 1.0 (moe_fixtures.py): with the default 0.08 every layer's update swamps the
residual stream and bf16 against fp32 on the same weights agrees only ~96.7%, which leaves no room to measure.

Plan (`sglang plan` on the same file and flags): the weights formula equals the bytes of every tensor the served
model holds (packed experts at each layer's bits, counted here by hand too, packed linear layers, the bf16
embedding, norms, routers, rope table), the moe_workspace term the buffer the runner allocated (the CPU kernel's,
with its int8 activations for the experts' bits). A mixed file (gate Q4_0, up Q4_1, down Q8_0 in one layer and F16 in another, Q4_0 in the
last) is priced per layer, and a second start reads its packed experts from the packed-weights cache.
"""

import contextlib
import io
import json

import pytest
import torch

from sglang import Engine
from sglang.cli.plan import main as plan_main
from sglang.srt.layers.moe.fused_moe_cpu import QuantExpertWeights, grouped_experts_torch
from sglang.srt.layers.moe.moe_layer import FusedMoE
from sglang.srt.layers.moe.router import select_experts
from sglang.srt.layers.quantization.linear_method import quant_kernels
from sglang.srt.mem_plan.build import CPU_LOAD_RESIDUAL_BYTES
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.tensor_bytes import tensor_bytes
from sglang.test.engine_fixtures import shutdown
from sglang.test.moe_fixtures import VOCAB_SIZE, make_random_mixtral, make_random_qwen2_moe, make_random_qwen3_moe
from sglang.test.moe_gguf_fixtures import write_moe_gguf
from sglang.test.paged_forward import PagedForwardDriver

register_cpu_ci(est_time=30, suite="cpu")

CHUNK = 64
PROMPTS = [[(37 * i + 11 * j + 5) % VOCAB_SIZE for j in range(6 + i % 5)] for i in range(16)]
NEW_TOKENS = 24
BAR = 0.95
# hidden 128, 16 experts of intermediate 64, top-4: K and N multiples of 32, so bf16 runs the CPU kernel
GEOMETRY = dict(hidden_size=128, num_experts_per_tok=4, embed_std=1.0)
MAKERS = {
    "qwen3_moe": lambda p: make_random_qwen3_moe(p, num_experts=16, moe_intermediate_size=64, **GEOMETRY),
    "mixtral": lambda p: make_random_mixtral(p, num_local_experts=16, intermediate_size=64, **GEOMETRY),
    "qwen2_moe": lambda p: make_random_qwen2_moe(p, num_experts=16, moe_intermediate_size=64,
                                                 shared_expert_intermediate_size=64, **GEOMETRY),
}
# (architecture, format, expert bits): every format on Qwen3-MoE, one on each other architecture
CASES = [("qwen3_moe", "Q4_0", 4), ("qwen3_moe", "Q4_1", 4), ("qwen3_moe", "Q8_0", 8), ("qwen3_moe", "int8", 8),
         ("mixtral", "Q4_0", 4), ("qwen2_moe", "Q4_1", 4)]
FLAGS = dict(dtype="bfloat16", skip_tokenizer_init=True, max_total_tokens=1024, chunked_prefill_size=CHUNK,
             log_level="warning", random_seed=0)


def served(path: str, quantization: str, cache: str) -> Engine:
    return Engine(model_path=path, quantization=quantization, model_cache_dir=cache, **FLAGS)


def driver_of(engine: Engine) -> PagedForwardDriver:
    runner = engine.scheduler.model_runner  # the served model, its MoE layers in the planned workspace
    return PagedForwardDriver(runner.model, runner.model_config, max_reqs=len(PROMPTS) + 1, max_tokens=2048)


def greedy_runs(engine: Engine):
    driver = driver_of(engine)
    rows = [driver.new_request() for _ in PROMPTS]
    with torch.inference_mode():
        runs = [[int(t)] for t in driver.extend(rows, PROMPTS).argmax(-1)]
        for _ in range(NEW_TOKENS - 1):  # batched decode steps
            for run, t in zip(runs, driver.extend(rows, [[run[-1]] for run in runs]).argmax(-1)):
                run.append(int(t))
    return runs


def agreement(engine: Engine, runs) -> float:
    """Share of the reference's generated tokens that are this model's argmax given the same preceding tokens (one
    prefill of every prompt with its run)."""
    driver = driver_of(engine)
    rows = [driver.new_request() for _ in PROMPTS]
    inputs = [prompt + run[:-1] for prompt, run in zip(PROMPTS, runs)]
    starts = torch.tensor([0] + [len(x) for x in inputs]).cumsum(0)[:-1]
    positions = torch.cat([start + len(p) - 1 + torch.arange(NEW_TOKENS) for start, p in zip(starts, PROMPTS)])
    with torch.inference_mode():
        top1 = driver.extend(rows, inputs, logits_indices=positions).argmax(-1).tolist()
    return sum(a == b for a, b in zip(top1, [t for run in runs for t in run])) / len(top1)



def dry_run_terms(path: str, quantization: str, cache: str) -> dict:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        status = plan_main(["--device", "cpu", "--model-path", path, "--quantization", quantization, "--dtype",
                            "bfloat16", "--chunked-prefill-size", str(CHUNK), "--max-total-tokens", "1024",
                            "--model-cache-dir", cache, "--json"])
    assert status == 0, buf.getvalue()
    return {t["name"]: t["num_bytes"] for t in json.loads(buf.getvalue())["plan"]["terms"]}


def packed_bytes_by_hand(rows: int, cols: int, bits: int) -> int:
    """quant_gemm.h's packed records: 16 rows x 32 weights of `bits` each plus an fp16 d and c per row."""
    return -(-rows // 16) * -(-cols // 32) * (16 * 32 * bits // 8 + 16 * 4)


def check_plan(engine: Engine, path: str, quantization: str, cache: str, bits) -> None:
    """The served experts hold `bits` [(gate/up, down) per layer] in the packed form's bytes; `sglang plan`'s weights
    formula equals the bytes of every tensor the model holds and its moe_workspace the buffer the runner allocated."""
    runner = engine.scheduler.model_runner
    layers = [m for m in runner.model.modules() if isinstance(m, FusedMoE)]
    assert layers and all(m.impl == "cpu" and isinstance(m.w13_weight, QuantExpertWeights) for m in layers)
    assert [(m.w13_weight.bits, m.w2_weight.bits) for m in layers] == bits
    for m, (b13, b2) in zip(layers, bits):
        e, n, k = m.num_experts, m.intermediate_size, m.hidden_size
        assert m.w13_qweight.nbytes == e * packed_bytes_by_hand(2 * n, k, b13)
        assert m.w2_qweight.nbytes == e * packed_bytes_by_hand(k, n, b2)
    spec, plan = runner.moe_workspace.spec, runner.memory_plan
    assert (spec.w13_bits, spec.w2_bits) == (max(b for b, _ in bits), max(b for _, b in bits))
    assert runner.allocated_bytes()["moe_workspace"] == plan.bytes_of("moe_workspace") > 0
    dry = dry_run_terms(path, quantization, cache)  # a CPU dry run adds the load's RSS residual to the formula
    assert dry["weights"] - CPU_LOAD_RESIDUAL_BYTES == tensor_bytes(runner.model), (dry["weights"],
                                                                                   tensor_bytes(runner.model))
    assert dry["moe_workspace"] == plan.bytes_of("moe_workspace")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """arch -> (HF directory, greedy runs of its bf16 model), built on first use."""
    cache, root = {}, tmp_path_factory.mktemp("moe_quant")

    def get(arch: str):
        if arch not in cache:
            hf_dir = MAKERS[arch](str(root / arch))
            engine = served(hf_dir, "none", str(root / "cache"))
            try:
                cache[arch] = hf_dir, greedy_runs(engine)
            finally:
                shutdown(engine)
        return cache[arch]

    get.root = root
    return get


@pytest.mark.parametrize("arch,fmt,bits", CASES, ids=[f"{a}-{f}" for a, f, _ in CASES])
def test_agreement_and_plan(checkpoints, arch, fmt, bits):
    hf_dir, original_runs = checkpoints(arch)
    cache = str(checkpoints.root / "cache")
    if fmt == "int8":
        path, quantization, runs = hf_dir, "w8a8_int8", original_runs
    else:
        path, quantization = write_moe_gguf(hf_dir, str(checkpoints.root / f"{arch}-{fmt}.gguf"), fmt), "gguf"
        dense = served(path, "none", cache)
        try:
            runs = greedy_runs(dense)
        finally:
            shutdown(dense)
    engine = served(path, quantization, cache)
    try:
        rate, vs_original = agreement(engine, runs), agreement(engine, original_runs)
        print(f"{arch} {fmt}: top-1 agreement {rate:.3f} vs bf16 of the same weights, {vs_original:.3f} vs the "
              f"original checkpoint in bf16 ({len(PROMPTS) * NEW_TOKENS} positions)")
        assert rate >= BAR
        if bits == 8:
            assert vs_original >= BAR
        config = engine.scheduler.model_runner.model_config.hf_config
        moe_layers = config.num_hidden_layers - len(getattr(config, "mlp_only_layers", None) or [])
        check_plan(engine, path, quantization, cache, [(bits, bits)] * moe_layers)
    finally:
        shutdown(engine)


def test_mixed_file_is_priced_per_layer_and_cached_packed(checkpoints, monkeypatch):
    """Priced per layer; the first start caches the packed experts (model_loader/loader.py), a second start reads
    them from that cache (the GGUF's blocks are not read again) and serves the same tokens."""
    from sglang.srt.model_loader import gguf_weights

    hf_dir, _ = checkpoints("qwen3_moe")
    cache = str(checkpoints.root / "cache")
    types = {"ffn_gate_exps": "Q4_0", "ffn_up_exps": "Q4_1", "blk.0.ffn_down_exps": "Q8_0",
             "blk.1.ffn_down_exps": "F16"}  # F16 experts are requantized to 8-bit blocks at load
    path = write_moe_gguf(hf_dir, str(checkpoints.root / "mixed.gguf"), "Q4_0", types)
    greedy = {"max_new_tokens": 6, "temperature": 0}
    tokens = []
    for start in range(2):
        if start:
            monkeypatch.setattr(gguf_weights, "iter_gguf_quantized_weights", None)  # the cache must serve
        engine = served(path, "gguf", cache)
        try:
            check_plan(engine, path, "gguf", cache, [(4, 8), (4, 8), (4, 4)])
            tokens.append(engine.generate(input_ids=PROMPTS[0], sampling_params=greedy)["output_ids"])
        finally:
            shutdown(engine)
    assert tokens[0] == tokens[1] and len(tokens[0]) == 6


def test_layer_runs_the_kernel_and_the_torch_path_agrees(checkpoints):
    """A served Q4_1 layer's output is the CPU kernel's (in the planned workspace); the torch path, which
    dequantizes the routed experts where the kernel is absent, gives the same within the int8 activations' error."""
    ops = quant_kernels()
    if ops is None:
        pytest.skip("the quant kernels do not load here: the torch path serves the experts")
    hf_dir, _ = checkpoints("qwen3_moe")
    path = write_moe_gguf(hf_dir, str(checkpoints.root / "layer-Q4_1.gguf"), "Q4_1")
    engine = served(path, "gguf", str(checkpoints.root / "cache"))
    try:
        layer = next(m for m in engine.scheduler.model_runner.model.modules() if isinstance(m, FusedMoE))
        gen = torch.Generator().manual_seed(0)
        hidden = torch.randn(CHUNK + 9, layer.hidden_size, generator=gen).to(torch.bfloat16)  # two slices
        logits = torch.randn(CHUNK + 9, layer.num_experts, generator=gen)
        with torch.inference_mode():
            got = layer(hidden, logits)
            weights, ids = select_experts(logits, layer.top_k, layer.renormalize)
            w13, w2 = layer.w13_weight, layer.w2_weight
            kernel = torch.cat([ops.fused_experts_quant(hidden[i: i + CHUNK], w13.packed, w2.packed, w13.bits, w2.bits,
                                                        weights[i: i + CHUNK], ids[i: i + CHUNK], None)
                                for i in (0, CHUNK)])
            torch_path = grouped_experts_torch(hidden, w13, w2, weights, ids).float()
        assert torch.equal(got, kernel)
        err = (got.float() - torch_path).abs().max() / torch_path.abs().max()
        assert err <= 2 ** -5, err
    finally:
        shutdown(engine)
