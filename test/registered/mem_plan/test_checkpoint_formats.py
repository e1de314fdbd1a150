"""Every quantized checkpoint format the planner reads from quantization_config, priced against a tiny checkpoint of
that format written here: the tensors the format's loader reads (names, dtypes, shapes) saved with safetensors, their
bytes on disk (header excluded) == the plan's weights term less the runtime's rope table, exactly.

The tensors of each format are written here from its published layout, not from the planner:
  compressed-tensors   built by the compressed-tensors library itself (apply_quantization_config + ModelCompressor)
  fp8 block-wise       DeepSeek-V3 / Qwen3-FP8 model.safetensors.index.json: <linear>.weight F8_E4M3 and
                       <linear>.weight_scale_inv F32 [ceil(out/128), ceil(in/128)]
  fp8 per-tensor       AutoFP8 / vLLM's fp8 loader: weight F8_E4M3, weight_scale F32 and (static) input_scale F32
  awq                  AutoAWQ WQLinear_GEMM: qweight int32 [in, out*bits/32], qzeros int32 [groups, out*bits/32],
                       scales fp16 [groups, out]
  gptq                 AutoGPTQ QuantLinear: qweight int32 [in*bits/32, out], qzeros int32 [groups, out*bits/32],
                       scales fp16 [groups, out], g_idx int32 [in]
  mxfp4                openai/gpt-oss checkpoints: experts' *_blocks uint8 [E, out, in/32, 16], *_scales uint8
                       [E, out, in/32], *_bias bf16; attention, router, embeddings and lm_head bf16
The dense tensors (and which modules are linear) come from transformers' own model built on the meta device.
"""

import contextlib
import io
import json
import os
import struct
import tempfile
import unittest

import torch
from safetensors.torch import save_file

from sglang.cli.plan import main
from sglang.srt.mem_plan.model_shapes import model_shape_from_path
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="cpu")

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 640,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "num_hidden_layers": 2, "vocab_size": 1000,
    "max_position_embeddings": 512, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "hidden_act": "silu",
}
TINY_QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 256, "intermediate_size": 512,
    "moe_intermediate_size": 192, "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
    "mlp_only_layers": [0], "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "num_hidden_layers": 2,
    "vocab_size": 1000, "max_position_embeddings": 512, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "hidden_act": "silu", "norm_topk_prob": True,
}
TINY_GPT_OSS = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 256, "intermediate_size": 192,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "num_hidden_layers": 2, "vocab_size": 1000,
    "max_position_embeddings": 512, "tie_word_embeddings": False, "num_local_experts": 4, "num_experts_per_tok": 2,
    "experts_per_token": 2, "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"],
    "attention_bias": True, "rope_theta": 150000, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]},
}
BF16, FP8, F32, F16 = torch.bfloat16, torch.float8_e4m3fn, torch.float32, torch.float16
I32, U8 = torch.int32, torch.uint8


def cdiv(a, b):
    return -(-a // b)


def meta_params(cfg):
    """(name, shape, is a Linear layer's weight) of transformers' model of this config, on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = {k: v for k, v in cfg.items() if k not in ("quantization_config", "architectures", "model_type")}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg["model_type"], **kw))
    linear = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    return [(n, tuple(p.shape), n in linear) for n, p in model.named_parameters()]


def disk_tensor_bytes(path):
    """Bytes of the tensors in a safetensors file: its size less the 8-byte length and the JSON header."""
    with open(path, "rb") as f:
        (header,) = struct.unpack("<Q", f.read(8))
    return os.path.getsize(path) - 8 - header


def weights_term(model_dir):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["--model-path", model_dir, "--gpu", "h100-80gb", "--json"]) == 0
    return {t["name"]: t["num_bytes"] for t in json.loads(buf.getvalue())["plan"]["terms"]}["weights"]


def quantized_linears(params, skip=()):
    """The decoder layers' linear weights (lm_head and the embeddings are not Linear in a layer), less `skip`
    suffixes."""
    return [(n, s) for n, s, lin in params if lin and ".layers." in n and ".router" not in n
            and not any(n[: -len(".weight")].endswith(k) for k in skip)]


class CheckpointCase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.llama_params = meta_params(TINY_LLAMA)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def write(self, name, cfg, tensors):
        d = os.path.join(self._tmp.name, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        path = os.path.join(d, "model.safetensors")
        save_file({k: v.contiguous() for k, v in tensors.items()}, path)
        return d, disk_tensor_bytes(path)

    def checkpoint(self, name, quant, linear_tensors, cfg=TINY_LLAMA, params=None, skip=()):
        """Dense params in bf16, each quantized linear weight replaced by linear_tensors(rows, cols) -> {suffix: t}."""
        params = params or self.llama_params
        quantized = dict(quantized_linears(params, skip))
        tensors = {}
        for n, shape, _ in params:
            if n in quantized:
                base = n[: -len("weight")]
                tensors.update({base + k: t for k, t in linear_tensors(*shape).items()})
            else:
                tensors[n] = torch.empty(shape, dtype=BF16)
        return self.write(name, {**cfg, "quantization_config": quant}, tensors)

    def assert_priced(self, model_dir, disk):
        rope = model_shape_from_path(model_dir).rope_cache_bytes(2)
        self.assertEqual(weights_term(model_dir) - rope, disk)


class TestHfFormats(CheckpointCase):
    def test_fp8_block_wise(self):
        def fp8_block(rows, cols):
            return {"weight": torch.empty(rows, cols, dtype=FP8),
                    "weight_scale_inv": torch.empty(cdiv(rows, 128), cdiv(cols, 128), dtype=F32)}

        quant = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}
        self.assert_priced(*self.checkpoint("fp8_block", quant, fp8_block))

    def test_fp8_block_wise_moe_experts(self):
        """Qwen3-30B-A3B-FP8's layout: every expert's gate / up / down its own fp8 tensor with 128x128 scales
        (model.layers.N.mlp.experts.E.gate_proj.weight[_scale_inv]); the router (mlp.gate) stays bf16. Experts of
        192 columns: partial blocks."""
        E = TINY_QWEN3_MOE["num_experts"]
        tensors = {}

        def fp8_block(name, rows, cols):
            tensors[name + ".weight"] = torch.empty(rows, cols, dtype=FP8)
            tensors[name + ".weight_scale_inv"] = torch.empty(cdiv(rows, 128), cdiv(cols, 128), dtype=F32)

        for n, shape, linear in meta_params(TINY_QWEN3_MOE):
            prefix = n.rsplit(".", 1)[0]
            if n.endswith("experts.gate_up_proj"):  # transformers' fused [E, 2 I, H]: the checkpoint's gate, up
                for e in range(E):
                    fp8_block(f"{prefix}.{e}.gate_proj", shape[1] // 2, shape[2])
                    fp8_block(f"{prefix}.{e}.up_proj", shape[1] // 2, shape[2])
            elif n.endswith("experts.down_proj"):  # [E, H, I]
                for e in range(E):
                    fp8_block(f"{prefix}.{e}.down_proj", shape[1], shape[2])
            elif linear and ".layers." in n:
                fp8_block(n[: -len(".weight")], *shape)
            else:
                tensors[n] = torch.empty(shape, dtype=BF16)
        quant = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}
        self.assert_priced(*self.write("fp8_moe", {**TINY_QWEN3_MOE, "quantization_config": quant}, tensors))

    def test_fp8_per_tensor_static(self):
        def fp8_static(rows, cols):
            return {"weight": torch.empty(rows, cols, dtype=FP8), "weight_scale": torch.empty((), dtype=F32),
                    "input_scale": torch.empty((), dtype=F32)}

        self.assert_priced(*self.checkpoint("fp8_static", {"quant_method": "fp8", "activation_scheme": "static"},
                                            fp8_static))

    def test_awq_gemm_with_unconverted_modules(self):
        def awq(rows, cols, bits=4, group=128):
            return {"qweight": torch.empty(cols, rows * bits // 32, dtype=I32),
                    "qzeros": torch.empty(cdiv(cols, group), rows * bits // 32, dtype=I32),
                    "scales": torch.empty(cdiv(cols, group), rows, dtype=F16)}

        quant = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm",
                 "modules_to_not_convert": ["down_proj"]}
        self.assert_priced(*self.checkpoint("awq", quant, awq, skip=("down_proj",)))

    def test_gptq_desc_act_stores_zeros_and_g_idx(self):
        def gptq(rows, cols, bits=4, group=128):
            return {"qweight": torch.empty(cols * bits // 32, rows, dtype=I32),
                    "qzeros": torch.empty(cdiv(cols, group), rows * bits // 32, dtype=I32),
                    "scales": torch.empty(cdiv(cols, group), rows, dtype=F16), "g_idx": torch.empty(cols, dtype=I32)}

        quant = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True, "sym": True}
        self.assert_priced(*self.checkpoint("gptq", quant, gptq))

    def test_mxfp4_gpt_oss_experts(self):
        params = meta_params(TINY_GPT_OSS)
        E, H, I = TINY_GPT_OSS["num_local_experts"], TINY_GPT_OSS["hidden_size"], TINY_GPT_OSS["intermediate_size"]
        tensors = {}
        for n, shape, _ in params:
            if n.endswith("experts.gate_up_proj") or n.endswith("experts.down_proj"):
                out, cols = (2 * I, H) if n.endswith("gate_up_proj") else (H, I)
                tensors[n + "_blocks"] = torch.empty(E, out, cols // 32, 16, dtype=U8)
                tensors[n + "_scales"] = torch.empty(E, out, cols // 32, dtype=U8)
            else:
                tensors[n] = torch.empty(shape, dtype=BF16)
        self.assert_priced(*self.write("mxfp4", TINY_GPT_OSS, tensors))

    def test_published_gpt_oss_sizes(self):
        """The published checkpoints' model.safetensors.index.json total_size: gpt-oss-20b 13,761,264,768 B and
        gpt-oss-120b 65,248,815,744 B (mxfp4 experts, everything else bf16)."""
        from sglang.srt.mem_plan.quantization_sizes import quantized_weight_bytes, weight_format

        for name, total in (("gpt-oss-20b", 13_761_264_768), ("gpt-oss-120b", 65_248_815_744)):
            path = os.path.join(FIXTURES, name)
            shape = model_shape_from_path(path)
            with open(os.path.join(path, "config.json")) as f:
                fmt = weight_format(None, json.load(f)["quantization_config"])
            self.assertEqual(quantized_weight_bytes(shape, fmt, 1, 2) - shape.rope_cache_bytes(2), total, name)


class TestCompressedTensors(CheckpointCase):
    """w8a8 int8, w8a8 fp8 (static input scales), w4a16 and w4a16 asymmetric, written by compressed-tensors."""

    def compressed(self, name, preset, ignore):
        from compressed_tensors.compressors import ModelCompressor
        from compressed_tensors.quantization import (QuantizationConfig, apply_quantization_config,
                                                     preset_name_to_scheme)
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        kw = {k: v for k, v in TINY_LLAMA.items() if k not in ("architectures", "model_type")}
        model = LlamaForCausalLM(LlamaConfig(**kw)).to(BF16)
        apply_quantization_config(model, QuantizationConfig(
            config_groups={"group_0": preset_name_to_scheme(preset, ["Linear"])}, ignore=ignore))
        for n, p in model.named_parameters():
            if n.endswith("_scale"):  # calibrated scales: any positive value packs the same tensors
                p.data.fill_(0.01)
        compressor = ModelCompressor.from_pretrained_model(model)
        compressor.compress_model(model)
        d, disk = self.write(name, TINY_LLAMA, dict(model.state_dict()))
        compressor.update_config(d)
        return d, disk

    def test_presets(self):
        for preset in ("W8A8", "FP8", "W4A16", "W4A16_ASYM"):
            with self.subTest(preset=preset):
                self.assert_priced(*self.compressed(preset, preset, ["lm_head", "re:.*mlp.down_proj$"]))
        # the library writes its ignore list as module names, one per layer: one layer's down_proj left dense
        self.assert_priced(*self.compressed("one_layer", "W4A16", ["lm_head", "model.layers.1.mlp.down_proj"]))


class TestRefusals(unittest.TestCase):
    def test_unknown_method_and_format(self):
        from sglang.srt.mem_plan.quantization_sizes import weight_format

        with self.assertRaisesRegex(ValueError, r"quant_method 'bitsandbytes'.*knows none, gguf, w8a8_int8, fp8, "
                                                r"mxfp4, awq, gptq, compressed-tensors"):
            weight_format(None, {"quant_method": "bitsandbytes"})
        with self.assertRaisesRegex(ValueError, r"'nvfp4-pack-quantized'.*pack-quantized, int-quantized"):
            weight_format(None, {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                                 "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4}}}})

    def test_layouts_of_other_sizes(self):
        from sglang.srt.mem_plan.checkpoint_formats import checkpoint_format

        for method, cfg, named in (("gptq", {"checkpoint_format": "marlin"}, "'marlin'.*knows gptq, gptq_v2"),
                                   ("awq", {"version": "gemv"}, "'gemv'.*knows gemm"),
                                   ("compressed-tensors", {"sparsity_config": {"format": "sparse-24-bitmask"}},
                                    "'sparse-24-bitmask'.*knows dense")):
            with self.subTest(method=method), self.assertRaisesRegex(ValueError, named):
                checkpoint_format(method, cfg)

    def test_rules_the_planner_cannot_resolve(self):
        from sglang.srt.mem_plan.arch_spec import WeightGroup
        from sglang.srt.mem_plan.checkpoint_formats import checkpoint_format

        down = WeightGroup("mlp_dense", "model.layers.*.mlp.down_proj.weight", (256, 640), 2, linear=True)
        with self.assertRaisesRegex(ValueError, "'model.layers.1.mlp' names single layers"):
            checkpoint_format("awq", {"modules_to_not_convert": ["model.layers.1.mlp"]}).codec_for(down)
        ct = {"config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8}}},
              "format": "int-quantized", "ignore": ["Llama4TextAttention"]}
        with self.assertRaisesRegex(ValueError, "'Llama4TextAttention' is a module class"):
            checkpoint_format("compressed-tensors", ct).codec_for(down)
        # a rule for every layer is applied: transformers' boundary rule, compressed-tensors' exact / re: rule
        self.assertIsNone(checkpoint_format("awq", {"modules_to_not_convert": ["model.layers.*.mlp"]})
                          .codec_for(down)[0])
        self.assertEqual(checkpoint_format("awq", {"modules_to_not_convert": ["mlp.down"]}).codec_for(down)[1], 2)
        ct["ignore"] = ["re:.*down_proj$"]
        self.assertIsNone(checkpoint_format("compressed-tensors", ct).codec_for(down)[0])
        # compressed-tensors' own lists name each layer's module: one of two named -> one instance stays dense
        ct["ignore"] = ["lm_head", "model.layers.1.mlp.down_proj"]
        self.assertEqual(checkpoint_format("compressed-tensors", ct).codec_for(down)[1], 1)


if __name__ == "__main__":
    unittest.main()
