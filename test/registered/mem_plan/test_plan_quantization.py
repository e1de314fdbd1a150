"""The weights term knows the weight format: a Llama-3.1-8B plan on an H100 with --quantization fp8, an AWQ or
GPTQ checkpoint (quantization_config in config.json) frees exactly the bytes the quantized linear layers save, and
the KV pool grows by them. The expected bytes are computed here from the architecture's own numbers (only the
blocks' linear layers are quantized, each of q, k, v, o, gate, up, down a tensor of its own with its own scales as
the checkpoint stores it; embeddings, lm_head and norms stay bf16). test_checkpoint_formats.py prices every format
against a checkpoint written to disk."""

import contextlib
import io
import json
import os
import shutil
import tempfile
import unittest

from sglang.cli.plan import main
from sglang.srt.mem_plan.quantization_sizes import (
    cpu_packed_bytes,
    gguf_file_bytes,
    weight_format,
)
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=8, suite="cpu")

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
LLAMA = os.path.join(FIXTURES, "llama-3.1-8b")
GiB = 2**30

# Llama-3.1-8B: hidden 4096, 32 layers, 32 q heads and 8 KV heads of 128, MLP 14336
H, LAYERS, KV_DIM, MLP = 4096, 32, 8 * 128, 14336
# per layer: q [4096, 4096], k and v [1024, 4096], o [4096, 4096], gate and up [14336, 4096], down [4096, 14336]
LINEAR_SHAPES = [(H, H), (KV_DIM, H), (KV_DIM, H), (H, H), (MLP, H), (MLP, H), (H, MLP)]
LINEAR_PARAMS = LAYERS * sum(r * c for r, c in LINEAR_SHAPES)  # 6,979,321,856


def plan_of(model_path, *extra):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        status = main(["--model-path", model_path, "--gpu", "h100-80gb", "--json", *extra])
    assert status == 0
    d = json.loads(buf.getvalue())
    terms = {t["name"]: t["num_bytes"] for t in d["plan"]["terms"]}
    return terms, d["plan"]


class TestPlanQuantization(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dense_terms, cls.dense_plan = plan_of(LLAMA)
        cls.tmp = tempfile.mkdtemp()

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def checkpoint_with(self, quantization_config):
        path = os.path.join(self.tmp, quantization_config["quant_method"])
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(LLAMA, "config.json")) as f:
            cfg = json.load(f)
        cfg["quantization_config"] = quantization_config
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(cfg, f)
        return path

    def check_frees(self, terms, plan, saved_bytes):
        self.assertEqual(self.dense_terms["weights"] - terms["weights"], saved_bytes)
        # the freed bytes go to the KV pool (within a page and the terms that scale with its token count)
        gained = terms["kv_cache"] - self.dense_terms["kv_cache"]
        self.assertGreater(gained, 0.97 * saved_bytes)
        self.assertLessEqual(gained, saved_bytes + plan["kv_cell_bytes"] * plan["page_size"])
        self.assertGreater(plan["max_total_num_tokens"], self.dense_plan["max_total_num_tokens"])

    def test_fp8_halves_the_linear_layers(self):
        terms, plan = plan_of(LLAMA, "--quantization", "fp8")
        scales = 7 * LAYERS * 4  # one fp32 weight_scale per stored weight tensor (q, k, v, o, gate, up, down)
        saved = LINEAR_PARAMS * 2 - (LINEAR_PARAMS + scales)
        self.check_frees(terms, plan, saved)
        self.assertAlmostEqual(saved / GiB, 6.50, places=2)

    def test_fp8_block_scales_from_config(self):
        terms, plan = plan_of(self.checkpoint_with({"quant_method": "fp8", "weight_block_size": [128, 128]}))
        blocks = LAYERS * sum(-(-r // 128) * -(-c // 128) for r, c in LINEAR_SHAPES)
        self.check_frees(terms, plan, LINEAR_PARAMS * 2 - (LINEAR_PARAMS + 4 * blocks))

    def test_awq_and_gptq_4bit_with_group_scales(self):
        groups_x_rows = LINEAR_PARAMS // 128  # every input width is a multiple of 128
        awq = LINEAR_PARAMS // 2 + groups_x_rows * 2 + groups_x_rows // 2  # values, fp16 scales, 4-bit zeros
        terms, plan = plan_of(self.checkpoint_with({"quant_method": "awq", "bits": 4, "group_size": 128}))
        self.check_frees(terms, plan, LINEAR_PARAMS * 2 - awq)
        self.assertAlmostEqual((LINEAR_PARAMS * 2 - awq) / GiB, 9.62, places=2)
        # GPTQ adds g_idx: one int32 per input column of every stored matrix (q, k, v, o, gate and up read 4096,
        # down 14336)
        g_idx = LAYERS * 4 * sum(c for _, c in LINEAR_SHAPES)
        terms, plan = plan_of(self.checkpoint_with({"quant_method": "gptq", "bits": 4, "group_size": 128}))
        self.check_frees(terms, plan, LINEAR_PARAMS * 2 - (awq + g_idx))

    def test_flag_wins_over_checkpoint_config(self):
        path = self.checkpoint_with({"quant_method": "awq", "bits": 4, "group_size": 128})
        terms, _ = plan_of(path, "--quantization", "fp8")
        fp8_terms, _ = plan_of(LLAMA, "--quantization", "fp8")
        self.assertEqual(terms["weights"], fp8_terms["weights"])


    def test_unknown_checkpoint_format_is_a_usage_error(self):
        path = self.checkpoint_with({"quant_method": "bitsandbytes", "load_in_4bit": True})
        err = io.StringIO()
        with contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as cm:
            main(["--model-path", path, "--gpu", "h100-80gb"])
        self.assertEqual(cm.exception.code, 2)
        self.assertIn("quant_method 'bitsandbytes': the planner knows none, gguf, w8a8_int8, fp8, mxfp4, awq, gptq, "
                      "compressed-tensors", err.getvalue())

    def test_gguf_on_a_safetensors_checkpoint_is_a_usage_error(self):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as cm:
            main(["--model-path", LLAMA, "--gpu", "h100-80gb", "--quantization", "gguf"])
        self.assertEqual(cm.exception.code, 2)
        self.assertIn("--quantization gguf needs a .gguf", err.getvalue())


class TestWeightFormatRules(unittest.TestCase):
    def test_gguf_file_bits_per_weight(self):
        for name, bits in (("Q4_0", 4.5), ("Q4_1", 5.0), ("Q8_0", 8.5), ("Q6_K", 6.5625), ("Q4_K", 4.5)):
            self.assertEqual(gguf_file_bytes(64, 4096, name) * 8 / (64 * 4096), bits, name)

    def test_cpu_packed_form(self):
        # 16 rows x 32 weights per record, fp16 d and c per row; partial records are padded
        self.assertEqual(cpu_packed_bytes(16, 32, 4), 16 * 16 + 64)
        self.assertEqual(cpu_packed_bytes(576, 1536, 4) * 8 / (576 * 1536), 5.0)
        self.assertEqual(cpu_packed_bytes(576, 1536, 8) * 8 / (576 * 1536), 9.0)
        self.assertEqual(cpu_packed_bytes(17, 33, 8), 4 * (16 * 32 + 64))
        self.assertEqual(weight_format("gguf", None, "Q4_1").matrix_bytes(576, 1536, 2), cpu_packed_bytes(576, 1536, 4))
        # Q6_K: 8-bit levels with its own header (fp16 d, int8 scale per 16 weights: 64 bytes per record); Q4_K: 4-bit
        # levels with fp32 d, c per 32 weights (128 bytes)
        self.assertEqual(weight_format("gguf", None, "Q6_K").matrix_bytes(576, 1536, 2), 36 * 48 * (16 * 32 + 64))
        self.assertEqual(weight_format("gguf", None, "Q4_K").matrix_bytes(576, 1536, 2), 36 * 48 * (16 * 16 + 128))
        # a GGUF type without a packed form (F16, F32, Q2_K, Q3_K) is requantized at load to 8-bit blocks
        # (model_loader/gguf_weights.py: packing.staging_q8_blocks)
        self.assertEqual(weight_format("gguf", None, "Q3_K").matrix_bytes(576, 1536, 2), cpu_packed_bytes(576, 1536, 8))

    def test_quantized_matrices_are_the_blocks_linear_weights(self):
        """For Qwen3-30B-A3B (MoE, q/k norms), the matrices sized as quantized hold every attention and expert
        weight and nothing else: the attention minus the q/k norms, plus the experts (routers stay dense); the
        runtime's merged form (qkv, gate_up) holds the same weights."""
        from sglang.srt.mem_plan.model_shapes import model_shape_from_path
        from sglang.srt.mem_plan.quantization_sizes import runtime_linear_matrices

        shape = model_shape_from_path(os.path.join(FIXTURES, "qwen3-30b-a3b"))
        s, p = shape.text, shape.params(1)
        groups = shape.weight_groups(1, 1)
        quantized = sum(g.numel for g in groups if g.linear)
        self.assertEqual(quantized, p["attention"] - s.num_layers * 2 * s.head_dim + p["mlp_dense"] + p["moe_experts"])
        self.assertEqual(sum(r * c * n for r, c, n, _, _ in runtime_linear_matrices(groups)), quantized)
        # per layer: qkv, o; per expert: gate_up, down
        self.assertEqual(len(runtime_linear_matrices(groups)), 4)
        self.assertGreater(p["moe_router"], 0)

    def test_unknown_method_is_refused(self):
        with self.assertRaisesRegex(ValueError, "--quantization 'bitsandbytes': the planner knows none, gguf"):
            weight_format("bitsandbytes")
        fmt = weight_format(None, {"quant_method": "gptq", "bits": 8, "group_size": -1})
        self.assertEqual((fmt.method, fmt.bits, fmt.group_size), ("gptq", 8, -1))
        # one group over all input columns: one fp16 scale and one packed zero point per output row
        self.assertEqual(fmt.checkpoint.codecs[0][1].matrix_bytes(64, 256, 2), 64 * 256 + 64 * 2 + 64 + 256 * 4)


if __name__ == "__main__":
    unittest.main()
