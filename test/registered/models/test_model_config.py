"""ModelConfig resolution, registries' error messages, and building on the meta device."""

import json
import os
import tempfile
import unittest
from unittest import mock

import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.configs.resolved import ALLOW_LONGER_CONTEXT_ENV
from sglang.srt.model_loader import resolve_model_path
from sglang.srt.model_loader.loader import build_model
from sglang.srt.models.registry import get_model_class
from sglang.srt.server_args import ServerArgs
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=8, suite="cpu")


class TestModelConfig(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model_dir = resolve_model_path(ServerArgs())  # the bundled SmolLM2, converted once

    def test_smollm2_fields(self):
        c = ModelConfig.from_server_args(ServerArgs(), self.model_dir)
        self.assertEqual(c.architecture, "LlamaForCausalLM")
        self.assertEqual(
            (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.vocab_size),
            (30, 576, 9, 3, 64, 49152),
        )
        self.assertEqual(c.context_len, 8192)
        self.assertEqual(c.dtype, torch.bfloat16)  # auto on CPU
        self.assertEqual(c.kv_cache_dtype, torch.bfloat16)
        self.assertEqual(c.eos_token_ids, {2})
        self.assertTrue(c.tie_word_embeddings)
        self.assertFalse(c.is_multimodal)
        self.assertEqual(c.rope_parameters["rope_theta"], 100000.0)

    def test_dtype_and_context_overrides(self):
        c = ModelConfig.from_server_args(ServerArgs(dtype="float32", context_length=1024), self.model_dir)
        self.assertEqual((c.dtype, c.kv_cache_dtype, c.context_len), (torch.float32, torch.float32, 1024))
        with self.assertRaisesRegex(ValueError, "max_position_embeddings=8192"):
            ModelConfig.from_server_args(ServerArgs(context_length=10000), self.model_dir)
        with mock.patch.dict(os.environ, {ALLOW_LONGER_CONTEXT_ENV: "1"}):
            self.assertEqual(ModelConfig.from_server_args(ServerArgs(context_length=10000), self.model_dir).context_len, 10000)

    def test_top_level_rope_theta_and_generation_eos(self):
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(self.model_dir, "config.json")) as f:
                cfg = json.load(f)
            cfg.pop("rope_parameters")
            cfg["rope_theta"] = 12345.0
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(cfg, f)
            with open(os.path.join(tmp, "generation_config.json"), "w") as f:
                json.dump({"eos_token_id": [2, 7]}, f)
            c = ModelConfig.from_pretrained(tmp)
            self.assertEqual(c.rope_parameters["rope_theta"], 12345.0)
            self.assertEqual(c.eos_token_ids, {2, 7})

    def test_meta_device_build_counts_parameters(self):
        c = ModelConfig.from_server_args(ServerArgs(), self.model_dir)
        model = build_model(c, "meta")
        n = sum(p.numel() for p in model.parameters())  # tied lm_head counted once
        self.assertEqual(n, 134_515_008)
        self.assertTrue(all(p.device.type == "meta" and p.dtype == torch.bfloat16 for p in model.parameters()))

    def test_unknown_architecture_lists_supported(self):
        with self.assertRaisesRegex(ValueError, "LlamaForCausalLM.*Qwen3ForCausalLM"):
            get_model_class("GPTNeoXForCausalLM")


if __name__ == "__main__":
    unittest.main()
