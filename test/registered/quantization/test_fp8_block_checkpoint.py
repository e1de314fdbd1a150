"""fp8 block checkpoints (quantization_config fp8, weight_block_size [128, 128]: DeepSeek-V3 / Qwen3-FP8) served on
CPU, dequantized once at load (layers/quantization/fp8_block.py). The checkpoint is built here from a random bf16
Qwen3 (fp8_block_fixtures.py quantizes each 128x128 block itself; ragged blocks too: intermediate 320).

- every weight the Engine holds == the test's own fp64 dequantization of the checkpoint rounded once to bf16 (the
  lm_head, left unconverted by modules_to_not_convert, == its stored bf16 tensor);
- greedy tokens through the Engine vs the bf16 model's: teacher-forced top-1 agreement >= 95% (the fp8 weights are
  not the bf16 ones: exact token equality is not the claim);
- `sglang plan --device cpu` charges the weights the runtime holds (the dense dtype, not the checkpoint's fp8 bytes):
  weights term - the CPU load residual == the bytes of every tensor held;
- a random DeepSeek-V3 (MLA, dense first layer, routed + shared experts) in fp8 blocks: held weights == the
  reference, teacher-forced agreement with the bf16 V3 through the Engine >= 95%, plan == tensors held; the GPU
  path refuses it (routed experts: no block-fp8 MoE kernel);
- --quantization fp8 (the GPU path) holds the checkpoint's blocks as stored, and `sglang plan --gpu` prices them;
- a TP rank's narrowed read (Fp8BlockSlice) == the same rows / columns of the whole dequantized tensor;
- refusals: --quantization fp8 on a CPU, an fp8 tensor of a module modules_to_not_convert names, a weight without
  its scales, a per-tensor fp8 checkpoint; --quantization w8a8_int8 composes (dequantized, then 8-bit blocks).
"""

import contextlib
import io
import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_block_fixtures import (  # noqa: E402
    BLOCK,
    dequantize_reference,
    make_random_deepseek_v3_bf16,
    make_random_qwen3_bf16,
    quantize_block,
    write_fp8_block_checkpoint,
)

from sglang import Engine  # noqa: E402
from sglang.cli.plan import main as plan_main  # noqa: E402
from sglang.srt.layers.quantization import resolve_quantization  # noqa: E402
from sglang.srt.layers.quantization.fp8_block import Fp8BlockSlice, dequantized_fp8_weights  # noqa: E402
from sglang.srt.layers.packed_linear import unpack_weight  # noqa: E402
from sglang.srt.layers.quantization.fp8_block_config import Fp8BlockFormat, fp8_block_format  # noqa: E402
from sglang.srt.mem_plan.model_shapes import CPU_LOAD_RESIDUAL_BYTES  # noqa: E402
from sglang.srt.model_loader.weight_utils import CheckpointSlice  # noqa: E402
from sglang.test.ci.ci_register import register_cpu_ci  # noqa: E402
from sglang.test.engine_fixtures import shutdown  # noqa: E402
from sglang.test.tensor_bytes import tensor_bytes  # noqa: E402
from sglang.test.top1_agreement import teacher_forced_agreement  # noqa: E402

register_cpu_ci(est_time=80, suite="cpu")

PROMPTS = [[5, 17, 300, 42, 9], [100, 200, 300], [7] * 12, list(range(20, 60)), [3, 1, 4, 1, 5, 9, 2, 6]]
NEW_TOKENS = 16
FMT = Fp8BlockFormat(BLOCK, BLOCK)
FLAGS = dict(dtype="bfloat16", skip_tokenizer_init=True, max_total_tokens=1024, chunked_prefill_size=64,
             log_level="warning", random_seed=0)
GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8")
    bf16 = make_random_qwen3_bf16(str(root / "bf16"))
    values = write_fp8_block_checkpoint(bf16, str(root / "fp8"))
    return bf16, str(root / "fp8"), values


@pytest.fixture(scope="module")
def bf16_tokens(checkpoints):
    engine = Engine(model_path=checkpoints[0], **FLAGS)
    try:
        return [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)]
    finally:
        shutdown(engine)


def held_weights(model) -> dict:
    """{name: tensor} of the model's parameters in the nn.Linear layout: on a CPU without AMX the loader packs dense
    bf16 linear weights (an untied lm_head included) into the VNNI layout in place (layers/packed_linear.py)."""
    return {n: unpack_weight(p) if getattr(p, "vnni_packed", False) else p for n, p in model.named_parameters()}


def _runtime_name(hf_name: str) -> tuple:
    """(runtime parameter, row offset function) of an HF tensor: q/k/v and gate/up are merged (layers/linear.py)."""
    for part, merged in ((".q_proj.", ".qkv_proj."), (".k_proj.", ".qkv_proj."), (".v_proj.", ".qkv_proj."),
                         (".gate_proj.", ".gate_up_proj."), (".up_proj.", ".gate_up_proj.")):
        if part in hf_name:
            return hf_name.replace(part, merged), part
    return hf_name, None


def test_engine_holds_the_dequantized_weights_and_the_plan_prices_them(checkpoints, bf16_tokens, tmp_path):
    bf16, fp8, values = checkpoints
    engine = Engine(model_path=fp8, **FLAGS)
    try:
        runner = engine.scheduler.model_runner
        model = runner.model
        params = held_weights(model)
        cfg = model.config
        q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        offsets = {".q_proj.": 0, ".k_proj.": q, ".v_proj.": q + kv, ".gate_proj.": 0,
                   ".up_proj.": cfg.intermediate_size}
        converted = 0
        for name, value in values.items():
            target, part = _runtime_name(name)
            held = params[target]
            if part is not None:
                held = held.narrow(0, offsets[part], value.shape[0])
            assert held.dtype == torch.bfloat16, name
            assert torch.equal(held, value.to(torch.bfloat16)), f"{name}: held weight != dequantized reference"
            converted += name.endswith("proj.weight")
        assert converted == 7 * cfg.num_hidden_layers
        assert torch.equal(params["lm_head.weight"], values["lm_head.weight"].to(torch.bfloat16))

        outs = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
        same = sum(o["output_ids"] == r for o, r in zip(outs, bf16_tokens))
        rate = teacher_forced_agreement(model, runner.model_config, PROMPTS, bf16_tokens)
        print(f"fp8 blocks dequantized vs the bf16 model: teacher-forced top-1 agreement {rate:.3f} "
              f"({len(PROMPTS) * NEW_TOKENS} positions), {same}/{len(PROMPTS)} prompts token-identical")
        assert rate >= 0.95
        engine.scheduler.check_integrity()

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            status = plan_main(["--device", "cpu", "--model-path", fp8, "--dtype", "bfloat16",
                                "--chunked-prefill-size", "64", "--max-total-tokens", "1024", "--json"])
        assert status == 0, buf.getvalue()
        weights = next(t["num_bytes"] for t in json.loads(buf.getvalue())["plan"]["terms"] if t["name"] == "weights")
        held = tensor_bytes(model)
        print(f"plan weights {weights - CPU_LOAD_RESIDUAL_BYTES:,} B (+ load residual), tensors held {held:,} B")
        assert weights - CPU_LOAD_RESIDUAL_BYTES == held
    finally:
        shutdown(engine)


def _plan_weights(path: str, *flags: str) -> int:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        status = plan_main(["--model-path", path, "--dtype", "bfloat16", "--chunked-prefill-size", "64",
                            "--max-total-tokens", "1024", "--json", *flags])
    assert status == 0, buf.getvalue()
    return next(t["num_bytes"] for t in json.loads(buf.getvalue())["plan"]["terms"] if t["name"] == "weights")


def arranged_kv_b(weight, config):
    """The checkpoint's kv_b_proj [H (nope + v), kv_lora] in the layout the model holds: per head W_UK^T then W_UV."""
    heads, nope, lora = config.num_attention_heads, config.qk_nope_head_dim, config.kv_lora_rank
    per_head = weight.view(heads, -1, lora)
    return torch.cat((per_head[:, :nope].transpose(1, 2).reshape(heads, -1),
                      per_head[:, nope:].reshape(heads, -1)), dim=1).view_as(weight)


def test_deepseek_v3_fp8_blocks(tmp_path):
    """A random DeepSeek-V3 (MLA with q_lora, a dense first layer, 8 routed + 1 shared experts; hidden 256) in fp8
    blocks (experts, shared expert, MLA projections; the router bf16) served on CPU: the held weights the model keeps
    under their checkpoint names (kv_a_proj_with_mqa's 160 rows: a ragged block) == the reference dequantization,
    greedy tokens vs the bf16 V3 teacher-forced >= 95%, plan == tensors held."""
    bf16 = make_random_deepseek_v3_bf16(str(tmp_path / "bf16"))
    fp8 = str(tmp_path / "fp8")
    values = write_fp8_block_checkpoint(bf16, fp8)
    engine = Engine(model_path=bf16, **FLAGS)
    try:
        reference = [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)]
    finally:
        shutdown(engine)
    engine = Engine(model_path=fp8, **FLAGS)
    try:
        runner = engine.scheduler.model_runner
        params = held_weights(runner.model)
        same_name = [n for n, v in values.items() if n in params and params[n].shape == v.shape]
        for name in same_name:
            want = values[name].to(torch.bfloat16)
            if name.endswith("kv_b_proj.weight"):  # held per head as [W_UK^T | W_UV] (KVBProjection.arrange)
                want = arranged_kv_b(want, runner.model.config)
            assert torch.equal(params[name], want), name
        assert "model.layers.0.self_attn.kv_a_proj_with_mqa.weight" in same_name
        # teacher-forced through the Engine (the paged test driver has no latent pool): one request per position,
        # the prompt plus the bf16 run before it, one greedy token
        forced = [p + run[:j] for p, run in zip(PROMPTS, reference) for j in range(NEW_TOKENS)]
        outs = engine.generate(input_ids=forced, sampling_params={**GREEDY, "max_new_tokens": 1})
        rate = sum(o["output_ids"][0] == t for o, t in zip(outs, [t for run in reference for t in run])) / len(forced)
        print(f"DeepSeek-V3 fp8 blocks vs bf16: teacher-forced top-1 agreement {rate:.3f} ({len(forced)} positions); "
              f"{len(same_name)} tensors checked by name")
        assert rate >= 0.95
        weights, held = _plan_weights(fp8, "--device", "cpu") - CPU_LOAD_RESIDUAL_BYTES, tensor_bytes(runner.model)
        print(f"DeepSeek-V3 plan weights {weights:,} B, tensors held {held:,} B")
        assert weights == held
    finally:
        shutdown(engine)
    # the GPU path (--quantization fp8) has no block-fp8 MoE kernel: refused before building, naming the way out
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import load_model
    from sglang.srt.server_args import ServerArgs

    with pytest.raises(ValueError, match="--quantization none"):
        load_model(ModelConfig.from_server_args(ServerArgs(model_path=fp8, dtype="bfloat16"), fp8), "meta", "fp8")


def test_w8a8_int8_composes_and_fp8_on_cpu_is_refused(checkpoints, bf16_tokens):
    fp8 = checkpoints[1]
    with pytest.raises(ValueError, match="--quantization fp8 on a CPU"):
        resolve_quantization("fp8", False, "cpu", False, checkpoint_fp8=True)
    assert resolve_quantization(None, False, "cpu", False, checkpoint_fp8=True) == "none"
    assert resolve_quantization(None, False, "cuda", False, checkpoint_fp8=True) == "fp8"
    assert resolve_quantization("none", False, "cuda", False, checkpoint_fp8=True) == "none"
    engine = Engine(model_path=fp8, quantization="w8a8_int8", **FLAGS)
    try:
        runner = engine.scheduler.model_runner
        assert runner.quantization == "w8a8_int8"
        assert runner.model.model.layers[0].self_attn.qkv_proj.qweight is not None
        rate = teacher_forced_agreement(runner.model, runner.model_config, PROMPTS, bf16_tokens)
        print(f"fp8 blocks -> w8a8_int8 vs the bf16 model: teacher-forced top-1 agreement {rate:.3f}")
        assert rate >= 0.9
    finally:
        shutdown(engine)


def test_gpu_path_holds_the_blocks_the_plan_prices(tmp_path):
    """--quantization fp8 (what a GPU start resolves for this checkpoint) built and loaded here on the CPU: the
    projections hold the checkpoint's fp8 weights and block scales as stored, the module modules_to_not_convert
    names (down_proj, stored bf16) is dense, and `sglang plan --gpu H200` charges exactly the tensors held. (The
    kernels these layers run: test_fp8_block_gemm_interpreted.py.)"""
    from safetensors.torch import load_file

    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import load_model
    from sglang.srt.server_args import ServerArgs

    bf16 = make_random_qwen3_bf16(str(tmp_path / "bf16"), intermediate_size=384)  # gate/up on block boundaries
    path = str(tmp_path / "fp8")
    write_fp8_block_checkpoint(bf16, path, not_converted=("lm_head", "mlp.down_proj"), keep_dense=("mlp.down_proj",))
    stored = load_file(os.path.join(path, "model.safetensors"))
    config = ModelConfig.from_server_args(ServerArgs(model_path=path, dtype="bfloat16"), path)
    model = load_model(config, "cpu", "fp8")
    for i, layer in enumerate(model.model.layers):
        prefix = f"model.layers.{i}."
        qkv, down = layer.self_attn.qkv_proj, layer.mlp.down_proj
        assert qkv.weight.dtype == torch.float8_e4m3fn and down.weight.dtype == torch.bfloat16
        assert down.weight_scale_inv is None and torch.equal(down.weight, stored[prefix + "mlp.down_proj.weight"])
        parts = [prefix + f"self_attn.{p}_proj.weight" for p in "qkv"]
        assert torch.equal(qkv.weight.view(torch.uint8), torch.cat([stored[p] for p in parts]).view(torch.uint8))
        assert torch.equal(qkv.weight_scale_inv, torch.cat([stored[p + "_scale_inv"] for p in parts]))
        up = layer.mlp.gate_up_proj.weight_scale_inv
        assert torch.equal(up, torch.cat([stored[prefix + f"mlp.{p}_proj.weight_scale_inv"] for p in ("gate", "up")]))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        status = plan_main(["--gpu", "H200", "--model-path", path, "--dtype", "bfloat16", "--attention-backend",
                            "triton", "--max-total-tokens", "1024", "--json"])
    assert status == 0, buf.getvalue()
    weights = next(t["num_bytes"] for t in json.loads(buf.getvalue())["plan"]["terms"] if t["name"] == "weights")
    print(f"GPU plan weights {weights:,} B, tensors held with --quantization fp8 {tensor_bytes(model):,} B")
    assert weights == tensor_bytes(model)


def test_tp_rank_reads_only_its_rows_and_columns(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    torch.manual_seed(1)
    w = torch.randn(300, 200) * 0.05  # ragged blocks on both dims
    q, s = quantize_block(w)
    save_file({"w": q, "w_scale_inv": s}, str(tmp_path / "t.safetensors"))
    whole = dequantize_reference(q, s).to(torch.bfloat16)
    with safe_open(str(tmp_path / "t.safetensors"), framework="pt", device="cpu") as f:
        sl = Fp8BlockSlice(CheckpointSlice(f.get_slice("w")), CheckpointSlice(f.get_slice("w_scale_inv")), FMT,
                           torch.bfloat16)
        assert torch.equal(sl.materialize(), whole)
        for dim, start, length in ((0, 0, 150), (0, 150, 150), (0, 100, 57), (1, 0, 100), (1, 100, 100), (1, 130, 3)):
            assert torch.equal(sl.narrow(dim, start, length), whole.narrow(dim, start, length)), (dim, start, length)


def test_checkpoints_that_contradict_their_config_are_refused():
    torch.manual_seed(2)
    q, s = quantize_block(torch.randn(128, 128))
    dense = torch.randn(4, 4)

    def run(items, fmt=FMT):
        return list(dequantized_fp8_weights(iter(items), fmt, torch.float32))

    # scales before the weight, and a dense tensor between: both orders pair up
    out = dict(run([("a.weight_scale_inv", s), ("n.weight", dense), ("a.weight", q)]))
    assert torch.equal(out["a.weight"], dequantize_reference(q, s).float()) and "a.weight_scale_inv" not in out
    with pytest.raises(ValueError, match="has no weight_scale_inv"):
        run([("x.proj.weight", q)])
    with pytest.raises(ValueError, match="has no fp8 weight"):
        run([("x.proj.weight_scale_inv", s)])
    with pytest.raises(ValueError, match="modules_to_not_convert"):
        run([("model.layers.0.mlp.down_proj.weight", q)], Fp8BlockFormat(BLOCK, BLOCK, ("mlp.down_proj",)))
    with pytest.raises(ValueError, match="weight_block_size"):
        fp8_block_format({"quant_method": "fp8", "activation_scheme": "dynamic"})
    with pytest.raises(ValueError, match="activation_scheme"):
        fp8_block_format({"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "static"})
    assert fp8_block_format({"quant_method": "awq"}) is None


if __name__ == "__main__":
    pytest.main([__file__, "-q", "-s"])


def test_plan_notes_what_the_gpu_fp8_path_refuses():
    """DeepSeek-V3's published fp8 config on 8x H200: the plan prices the checkpoint's blocks and notes, in the words
    the loader refuses with, that a start refuses its routed experts on the fp8 path (no block-fp8 MoE kernel)."""
    from sglang.cli import plan as plan_cli

    v3 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mem_plan", "fixtures", "deepseek-v3")
    status, result, text = plan_cli.run(["--model-path", v3, "--gpu", "h200", "--tp", "8"])
    assert status == 0 and "routed experts: this runtime has no block-fp8 MoE kernel" in result["plan"]["notes"][-1]
    assert "routed experts" in text
