"""The MLA latent pool (mem_cache/mla_pool.py) and torch_native's MLA attention over it (torch_native_mla.py).

- bytes: the pool holds exactly the plan's kv_cache term for DeepSeek-V3, V2-Lite and Kimi-K2's published configs,
  computed here from config.json by hand (layers x (kv_lora_rank + qk_rope_head_dim) x 2 B; 70,272 B per token for
  V3, the issue's "70 KB"), the same at every TP size (the latent is replicated, not split by heads);
- the value buffer is a view of the key rows (nothing stored twice), and only K rows are written;
- a quantized --kv-cache-dtype is refused naming the flag;
- attention: the absorbed MQA the model calls equals the EXPANDED form (every head's K/V decompressed with random
  W_UK / W_UV) in float64 (sglang.test.mla_reference), at page sizes 1 and 16, over prefill, a chunk after a cached
  prefix, ragged decode steps and decode row groups; a chunk over a cached prefix stays within the transient the plan
  declares for torch_native's extend.
"""

import json
import os
import unittest

import torch

from sglang.srt.mem_cache.mla_pool import MLATokenToKVPool, create_mla_pool
from sglang.srt.mem_plan.model_shapes import model_shape_from_config
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.mla_reference import MLAHarness, max_abs_diff

register_cpu_ci(est_time=20, suite="cpu")

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mem_plan", "fixtures")
MLA_FIXTURES = ("deepseek-v3", "deepseek-v2-lite", "kimi-k2-instruct")


def _config(name: str) -> dict:
    with open(os.path.join(FIXTURES, name, "config.json")) as f:
        return json.load(f)


class TestLatentPoolBytes(unittest.TestCase):
    def test_pool_bytes_equal_the_plans_cell_at_every_tp(self):
        for name in MLA_FIXTURES:
            cfg = _config(name)
            hand = cfg["num_hidden_layers"] * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 2  # bf16
            shape = model_shape_from_config(cfg)
            for tp in (1, 2, 8):
                with self.subTest(model=name, tp=tp):
                    cell = shape.kv_cell("auto", tp, "bfloat16")
                    self.assertEqual(cell.cell_bytes, hand)
                    self.assertEqual(cell.fixed_bytes, 0)
                    for tokens, page in ((40, 1), (64, 16)):
                        pool = MLATokenToKVPool(tokens, page, torch.bfloat16, cell.kv_lora_rank,
                                                cell.qk_rope_head_dim, cfg["num_hidden_layers"])
                        self.assertEqual(pool.mem_usage_bytes(), (tokens + page) * hand)
        self.assertEqual(model_shape_from_config(_config("deepseek-v3")).kv_cell("auto", 8).cell_bytes, 70_272)

    def test_value_is_a_view_of_the_key_rows(self):
        pool = MLATokenToKVPool(8, 4, torch.float32, kv_lora_rank=6, qk_rope_head_dim=2, layer_num=2)
        rows = torch.randn(3, 1, 8)
        loc = torch.tensor([5, 9, 4])
        pool.set_kv_buffer(1, loc, rows, rows[..., :6])
        k, v = pool.get_key_buffer(1), pool.get_value_buffer(1)
        self.assertEqual(v.data_ptr(), k.data_ptr())
        self.assertEqual(tuple(v.shape), (12, 1, 6))
        self.assertFalse(v.is_contiguous())
        self.assertTrue(torch.equal(k[loc], rows))
        gk, gv = pool.gather_kv(1, loc, torch.float64)
        self.assertEqual(gv.data_ptr(), gk.data_ptr())
        self.assertTrue(torch.equal(gv[:, 0], rows[:, 0, :6].double()))
        k[9, 0, 0] = 123.0  # one storage: a write through K is what V reads
        self.assertEqual(float(v[9, 0, 0]), 123.0)
        self.assertTrue(torch.equal(pool.get_key_buffer(0)[:4], torch.zeros(4, 1, 8)))  # the dummy page
        with self.assertRaisesRegex(ValueError, r"\[N, 1, 8\]"):
            pool.set_kv_buffer(0, loc, torch.randn(3, 2, 8), None)

    def test_quantized_latent_is_refused_naming_the_flag(self):
        for fmt in ("fp8_e4m3", "int8", "int4"):
            with self.assertRaisesRegex(ValueError, f"--kv-cache-dtype {fmt}"):
                create_mla_pool(fmt, 8, 1, torch.bfloat16, 8, 4, 1)
        self.assertIsInstance(create_mla_pool("bfloat16", 8, 1, torch.bfloat16, 8, 4, 1), MLATokenToKVPool)


class TestTorchNativeMLA(unittest.TestCase):
    def _run(self, h: MLAHarness, steps, tol: float):
        rows = [h.new_request() for _ in range(len(steps[0]))]
        for new_lens in steps:
            got, want = h.step(rows, new_lens)
            with self.subTest(page_size=h.pool.page_size, new_lens=list(new_lens)):
                self.assertLess(max_abs_diff(got, want), tol)

    def test_absorbed_equals_expanded_fp64(self):
        # prefill (no prefix), a second chunk over the cached prefix (one request idle at 1 token), ragged decodes
        steps = [(37, 5, 20), (11, 1, 29), (1, 1, 1), (1, 1, 1)]
        for page in (1, 16):
            self._run(MLAHarness("torch_native", page_size=page, seed=page), steps, tol=1e-5)

    def test_decode_row_groups_and_bf16(self):
        h = MLAHarness("torch_native", page_size=16, dtype=torch.bfloat16, seed=3)
        h.backend.decode_gather_tokens = 40  # a ragged batch of max_len 33 goes one request per row group
        self._run(h, [(30, 7, 18), (2, 1, 3), (1, 1, 1)], tol=0.05)

    def test_extend_stays_within_the_declared_transient(self):
        """A chunk over a cached prefix at DeepSeek's row width (576) and 16 heads peaks under the extend_attention
        bound the plan reserves for torch_native (backends.extend_attention_workspace_bytes): the scores stay tiled."""
        from sglang.srt.mem_plan.backends import extend_attention_workspace_bytes
        from sglang.srt.mem_plan.measure import cpu_peak_rss_bytes, measure_peak

        if cpu_peak_rss_bytes() <= 0:
            self.skipTest("no peak RSS on this platform")
        heads, prefix, chunk = 16, 1536, 512
        h = MLAHarness("torch_native", num_heads=heads, kv_lora_rank=512, qk_rope_head_dim=64, dtype=torch.bfloat16,
                       num_layers=1, num_reqs=1, context_len=2048, pool_tokens=2048)
        row = h.new_request()
        fb = h.batch([row], [prefix])
        h.backend.init_forward_metadata(fb)
        h.backend.forward(h.rand(prefix, heads, h.L).bfloat16(), h.rand(prefix, 1, h.L).bfloat16(), None, h.layers[0], fb)
        fb = h.batch([row], [chunk])
        q, k = h.rand(chunk, heads, h.L).bfloat16(), h.rand(chunk, 1, h.L).bfloat16()
        h.backend.init_forward_metadata(fb)
        with measure_peak("cpu") as m:
            out = h.backend.forward(q, k, None, h.layers[0], fb)
        self.assertEqual(tuple(out.shape), (chunk, heads * 512))
        bound = extend_attention_workspace_bytes(heads, 1, h.L, 2, chunk, prefix + chunk)
        self.assertLess(m.increase_bytes, bound, (m.increase_bytes, bound))


if __name__ == "__main__":
    unittest.main()
