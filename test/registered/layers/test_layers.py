"""Small layers against straightforward references: linear fast paths, RMSNorm, rotary embedding, merged loaders."""

import math
import unittest

import torch
import torch.nn.functional as F

from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, linear
from sglang.srt.layers.rotary_embedding import get_rope
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=3, suite="cpu")


class TestLayers(unittest.TestCase):
    def test_linear_fast_paths_match_f_linear(self):
        torch.manual_seed(0)
        w = torch.randn(96, 64)
        b = torch.randn(96)
        for rows in (1, 5, 200):
            x = torch.randn(rows, 64)
            ref = F.linear(x, w, b)
            out = linear(x.bfloat16(), w.bfloat16(), b.bfloat16()).float()
            self.assertEqual(out.shape, (rows, 96))
            self.assertTrue(out.is_contiguous())
            torch.testing.assert_close(out, ref, atol=0.3, rtol=0.05)
            torch.testing.assert_close(linear(x, w, b), ref)  # fp32 is exactly F.linear

    def test_rmsnorm_with_residual(self):
        norm = RMSNorm(32, eps=1e-6)
        norm.weight.data = torch.randn(32)
        x, r = torch.randn(4, 32), torch.randn(4, 32)
        s = x + r
        ref = norm.weight * s / torch.sqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6)
        out, res = norm(x, r)
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(res, s)

    def test_rope_matches_rotation_formula(self):
        rope = get_rope(16, 16, 128, 10000.0, {"rope_type": "default"}, dtype=torch.float32)
        q, k = torch.randn(3, 2, 16), torch.randn(3, 1, 16)
        pos = torch.tensor([0, 5, 77])
        q2, k2 = rope(pos, q, k)
        torch.testing.assert_close(q2[0], q[0])  # position 0 is the identity
        for i, p in enumerate(pos.tolist()):
            for j in range(8):
                theta = p * 10000.0 ** (-2 * j / 16)
                c, s = math.cos(theta), math.sin(theta)
                x1, x2 = k[i, 0, j], k[i, 0, j + 8]
                torch.testing.assert_close(k2[i, 0, j], x1 * c - x2 * s, atol=1e-4, rtol=1e-4)
                torch.testing.assert_close(k2[i, 0, j + 8], x2 * c + x1 * s, atol=1e-4, rtol=1e-4)

    def test_model_layers_share_one_rope_table_of_the_planned_size(self):
        """Every attention layer of a built model uses the same cos/sin table; its bytes are the plan's rope term."""
        import tempfile

        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.model_loader.loader import build_model
        from sglang.test.engine_fixtures import make_random_qwen3

        with tempfile.TemporaryDirectory() as d:
            cfg = ModelConfig.from_pretrained(make_random_qwen3(d), dtype="float32", device="cpu")
            model = build_model(cfg, "cpu")
        tables = {id(m.cos_sin_cache): m.cos_sin_cache for m in model.modules() if hasattr(m, "cos_sin_cache")}
        self.assertEqual(len(tables), 1)
        (table,) = tables.values()
        self.assertEqual(table.numel() * table.element_size(), cfg.shape.rope_cache_bytes(4))
        self.assertEqual(tuple(table.shape), (cfg.hf_config.max_position_embeddings, cfg.head_dim))

    def test_merged_weight_loaders(self):
        qkv = QKVParallelLinear(8, 4, total_num_heads=2, total_num_kv_heads=1)
        wq, wk, wv = torch.randn(8, 8), torch.randn(4, 8), torch.randn(4, 8)
        for shard, w in (("q", wq), ("k", wk), ("v", wv)):
            qkv.weight.weight_loader(qkv.weight, w, shard)
        torch.testing.assert_close(qkv.weight.data, torch.cat([wq, wk, wv]))
        gu = MergedColumnParallelLinear(8, [6, 6])
        wg, wu = torch.randn(6, 8), torch.randn(6, 8)
        gu.weight.weight_loader(gu.weight, wu, 1)
        gu.weight.weight_loader(gu.weight, wg, 0)
        torch.testing.assert_close(gu.weight.data, torch.cat([wg, wu]))


if __name__ == "__main__":
    unittest.main()
