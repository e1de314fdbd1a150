"""Exact parameter counts from config.json, checked against hand-computed numbers."""

import os
import unittest

from sglang.srt.mem_plan.model_shapes import model_shape_from_config, model_shape_from_path
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="cpu")

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")

DEEPSEEK_V3 = dict(
    model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], hidden_size=7168, num_hidden_layers=61,
    num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
    qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=256, n_shared_experts=1, moe_intermediate_size=2048,
    intermediate_size=18432, first_k_dense_replace=3, moe_layer_freq=1, vocab_size=129280, topk_method="noaux_tc",
    num_experts_per_tok=8, max_position_embeddings=163840, torch_dtype="bfloat16",
)


def siglip_so400m_tower(image=384, patch=14):
    h, i, layers = 1152, 4304, 27
    layer = 4 * (h * h + h) + 2 * (2 * h) + (h * i + i) + (i * h + h)
    return layers * layer + 2 * h + (3 * patch * patch * h + h) + (image // patch) ** 2 * h


class TestTextModels(unittest.TestCase):
    def test_llama_3_1_8b(self):
        s = model_shape_from_path(os.path.join(FIXTURES, "llama-3.1-8b"))
        h, i, v, L = 4096, 14336, 128256, 32
        layer = h * h + 2 * h * 1024 + h * h + 3 * h * i + 2 * h
        self.assertEqual(L * layer + 2 * v * h + h, 8_030_261_248)
        self.assertEqual(s.num_params, 8_030_261_248)
        self.assertEqual(s.weight_bytes() - s.rope_cache_bytes(2), 16_060_522_496)
        self.assertEqual(s.rope_cache_bytes(2), 131072 * 128 * 2)  # one cos/sin table shared by the layers, bf16
        self.assertEqual(s.kv_cell().cell_bytes, 131_072)
        # TP2: heads, intermediate and vocab halve; norms replicate
        self.assertEqual(sum(s.params(2).values()), (8_030_261_248 - L * 2 * h - h) // 2 + L * 2 * h + h)

    def test_qwen3_30b_a3b(self):
        s = model_shape_from_path(os.path.join(FIXTURES, "qwen3-30b-a3b"))
        h, v, L, E, mi = 2048, 151936, 48, 128, 768
        attn = h * 4096 + 2 * h * 512 + 4096 * h + 2 * 128  # q, k, v, o + q_norm, k_norm
        moe = E * 3 * h * mi + h * E  # experts + router
        expected = L * (attn + moe + 2 * h) + 2 * v * h + h
        self.assertEqual(expected, 30_532_122_624)
        self.assertEqual(s.num_params, expected)
        self.assertAlmostEqual((s.weight_bytes() - s.rope_cache_bytes(2)) / 2**30, 56.87, places=2)
        self.assertEqual(s.kv_cell().cell_bytes, 98_304)
        self.assertEqual(s.kv_cell("fp8_e4m3", tp=8).cell_bytes, 1 * 256 * 48)
        self.assertEqual(s.attention_shape(262144).num_q_heads, 32)

    def test_tied_embeddings_and_qwen2_bias(self):
        cfg = dict(model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=True)
        s = model_shape_from_config(cfg)
        d = 16
        layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + (64 + 2 * 32) + 3 * 64 * 128 + 2 * 64
        self.assertEqual(s.num_params, 2 * layer + 1000 * 64 + 64)
        self.assertEqual(s.params()["lm_head"], 0)
        self.assertEqual(d, s.text.head_dim)

    def test_deepseek_v3_mla(self):
        s = model_shape_from_config(DEEPSEEK_V3)
        h, nh = 7168, 128
        attn = (h * 1536 + 1536 + 1536 * nh * 192 + h * 576 + 512 + 512 * nh * 256 + nh * 128 * h)
        dense = 3 * h * 18432
        moe = 256 * 3 * h * 2048 + 3 * h * 2048 + h * 256 + 256
        expected = 61 * (attn + 2 * h) + 3 * dense + 58 * moe + 2 * 129280 * h + h
        self.assertEqual(s.num_params, expected)
        self.assertEqual(expected, 671_026_419_200)  # "671B" without the MTP layer
        # bf16 weights, the 58 routers' float32 e_score_correction_bias, one cos/sin table of qk_rope_head_dim 64
        rope = s.text.max_position_embeddings * 64 * 2
        self.assertEqual(s.weight_bytes(), (expected - 58 * 256) * 2 + 58 * 256 * 4 + rope)
        self.assertEqual(s.kv_cell().cell_bytes, 70_272)
        self.assertTrue(s.attention_shape(163840).is_mla)


class TestMultimodal(unittest.TestCase):
    def test_llava_siglip(self):
        s = model_shape_from_path(os.path.join(FIXTURES, "llava-siglip-qwen2-7b"))
        self.assertEqual(siglip_so400m_tower(), 412_987_248)
        p = s.params()
        self.assertEqual(p["vision_tower"], 412_987_248)
        self.assertEqual(p["projector"], 1152 * 3584 + 3584 + 3584 * 3584 + 3584)
        self.assertEqual(s.num_params - p["vision_tower"] - p["projector"],
                         sum(v for k, v in p.items() if k not in ("vision_tower", "projector")))
        vision = s.encoders[0]
        self.assertEqual(vision.max_tokens_per_input, 729)
        self.assertGreater(vision.peak_bytes_per_input, 0)

    def test_siglip_head_counted_only_when_used(self):
        cfg = dict(model_type="llava", text_config=dict(model_type="llama", hidden_size=64, intermediate_size=128,
                   num_hidden_layers=1, num_attention_heads=4, vocab_size=100),
                   vision_config=dict(model_type="siglip_vision_model", hidden_size=1152, intermediate_size=4304,
                                      num_hidden_layers=27, num_attention_heads=16, image_size=384, patch_size=14,
                                      vision_use_head=True))
        self.assertEqual(model_shape_from_config(cfg).params()["vision_tower"], 428_225_600)  # so400m with head

    def test_unknown_towers_refused_by_name(self):
        # a tower the planner does not know is not SigLIP: counting it as one (as the planner once did for Llama 4's)
        # is the guess it never makes, whatever SigLIP-like keys its vision_config carries
        cfg = dict(model_type="llava", text_config=dict(model_type="llama", hidden_size=64, intermediate_size=128,
                   num_hidden_layers=1, num_attention_heads=4, vocab_size=100),
                   vision_config=dict(model_type="some_vision_model", hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=1, num_attention_heads=4, image_size=28, patch_size=14))
        with self.assertRaisesRegex(ValueError, "vision_config tower 'some_vision_model'"):
            model_shape_from_config(cfg)
        cfg = dict(model_type="qwen2_audio", text_config=dict(model_type="qwen2", hidden_size=64, intermediate_size=128,
                   num_hidden_layers=1, num_attention_heads=4, vocab_size=100),
                   audio_config=dict(model_type="some_audio_encoder", d_model=64, encoder_ffn_dim=128,
                                     encoder_layers=1, encoder_attention_heads=4))
        with self.assertRaisesRegex(ValueError, "audio_config tower 'some_audio_encoder'"):
            model_shape_from_config(cfg)

    def test_omni_thinker_like(self):
        s = model_shape_from_path(os.path.join(FIXTURES, "qwen3-omni-thinker-like"))
        self.assertEqual(s.text.model_type, "qwen3_moe")
        self.assertEqual(s.params()["vision_tower"], siglip_so400m_tower(448, 14))
        self.assertAlmostEqual((s.weight_bytes() - s.rope_cache_bytes(2)) / 1e9, 63.18, places=2)  # "about 60 GB" of thinker weights
        self.assertEqual([e.name for e in s.encoders], ["vision", "audio"])


if __name__ == "__main__":
    unittest.main()
