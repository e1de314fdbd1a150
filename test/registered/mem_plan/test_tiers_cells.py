"""Upstream tier table and auto-y (§12.1), KV cell sizes (§12.4) and backend workspace sizes (§12.2-12.4)."""

import unittest

from sglang.srt.mem_plan import KVCellSpec, kv_dtype_bytes, req_to_token_bytes
from sglang.srt.mem_plan.backends import (
    AttentionShape,
    BackendInputs,
    aiter_decode_workspace_per_req_bytes,
    workspace_spec,
)
from sglang.srt.mem_plan.budget import default_safety_margin_bytes
from sglang.srt.mem_plan.gpu_presets import GPU_PRESETS, get_gpu_preset
from sglang.srt.mem_plan.tiers import classic_auto_mem_fraction, tier_defaults, upstream_mem_fraction
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="cpu")

GiB = 2**30
MiB = 2**20

# (gpu_mem MiB, chunked_prefill_size, cuda_graph_max_bs, classic auto mem_fraction_static), §12.1
CLASSIC_TABLE = {
    "T4": (15360, 2048, 8, 0.757),
    "RTX 4090": (24564, 2048, 24, 0.847),
    "A10": (23028, 2048, 24, 0.837),
    "A100-40G": (40960, 4096, 32, 0.833),
    "L40S": (46068, 4096, 32, 0.851),
    "A100-80G": (81920, 8192, 256, 0.836),
    "H100-80G": (81559, 8192, 256, 0.835),
    "H20-96G": (97871, 8192, 256, 0.863),
    "H200": (143771, 8192, 256, 0.907),
    "B200": (183359, 16384, 512, 0.857),
    "MI300X": (196592, 16384, 512, 0.867),
    "MI355X": (294896, 16384, 512, 0.911),
}


class TestTiers(unittest.TestCase):
    def test_classic_table(self):
        for name, (mib, chunk, graph_bs, y) in CLASSIC_TABLE.items():
            with self.subTest(name):
                self.assertEqual(tier_defaults(mib), (chunk, graph_bs))
                self.assertEqual(classic_auto_mem_fraction(mib), y)

    def test_variants_and_adjustments(self):
        self.assertEqual(tier_defaults(24564, variant="current"), (4096, 48))
        self.assertEqual(tier_defaults(24564, tp_size=4), (2048, 80))
        self.assertEqual(tier_defaults(81559, tp_size=8), (8192, 512))
        self.assertEqual(tier_defaults(None), (4096, 160))
        self.assertEqual(classic_auto_mem_fraction(None), 0.88)
        self.assertEqual(classic_auto_mem_fraction(81559, speculative="eagle"), 0.810)
        self.assertAlmostEqual(upstream_mem_fraction(294896, "aiter", 262144), 0.77435, places=12)
        self.assertAlmostEqual(upstream_mem_fraction(196592, "aiter", 262144), 0.73695, places=12)
        self.assertEqual(upstream_mem_fraction(196592, "aiter", 8192), 0.867)

    def test_presets(self):
        for key in ("h100-80gb", "h200", "h20", "a100-40gb", "a100-80gb", "l40s", "rtx-4090", "b200", "mi300x",
                    "mi325x", "mi355x"):
            p = get_gpu_preset(key)
            self.assertLess(p.pre_load_free_bytes, p.memory_total_bytes)
        self.assertEqual(get_gpu_preset("H100").memory_total_mib, 81559)
        self.assertEqual(get_gpu_preset("mi355x").pre_load_free_gib, 287.18)
        self.assertEqual(get_gpu_preset("mi355x").platform, "rocm")
        self.assertEqual(len(GPU_PRESETS), 11)
        with self.assertRaises(KeyError):
            get_gpu_preset("tpu-v5")


class TestCellSizes(unittest.TestCase):
    def test_mha_gqa(self):
        self.assertEqual(KVCellSpec(32, 2, 8, 128).cell_bytes, 131_072)  # Llama-3.1-8B bf16
        self.assertEqual(KVCellSpec(32, 1, 8, 128).cell_bytes, 65_536)  # fp8
        self.assertEqual(KVCellSpec(48, 2, 4, 128).cell_bytes, 98_304)  # Qwen3-30B-A3B
        self.assertEqual(KVCellSpec(80, 2, 8, 128, tp_size=4).cell_bytes, 81_920)  # Llama-3.1-70B TP4
        # kv heads replicated when tp > num_kv_heads: Qwen3-30B-A3B (4 KV heads) at TP8 keeps 1 head per rank
        self.assertEqual(KVCellSpec(48, 2, 4, 128, tp_size=8).num_kv_heads_per_rank, 1)
        self.assertEqual(KVCellSpec(48, 2, 4, 128, tp_size=8).cell_bytes, 24_576)

    def test_mla(self):
        self.assertEqual(KVCellSpec(61, 2, kv_lora_rank=512, qk_rope_head_dim=64).cell_bytes, 70_272)
        self.assertEqual(KVCellSpec(61, 1, kv_lora_rank=512, qk_rope_head_dim=64).cell_bytes, 35_136)
        self.assertEqual(KVCellSpec(61, 2, kv_lora_rank=512, qk_rope_head_dim=64, tp_size=8).cell_bytes, 70_272)

    def test_dtype_bytes(self):
        self.assertEqual(kv_dtype_bytes("auto", "bfloat16"), 2)
        self.assertEqual(kv_dtype_bytes("fp8_e4m3"), 1)
        self.assertEqual(kv_dtype_bytes("auto", "float32"), 4)
        with self.assertRaises(ValueError):
            kv_dtype_bytes("int3")


class TestWorkspaces(unittest.TestCase):
    def test_aiter(self):
        # Llama-3.1-8B: 32 heads x 512 partitions x (512 + 8) = 8.125 MiB per slot; 16.25 GiB at 2048 slots
        self.assertEqual(aiter_decode_workspace_per_req_bytes(32, 128, 131072), 8_519_680)
        self.assertEqual(2048 * 8_519_680, int(16.25 * GiB))
        # Qwen3-30B-A3B at 256k: 16.25 MiB per slot; 32.5 / 51.75 / 65.0 GiB at 2048 / 3261 / 4096 slots
        per = aiter_decode_workspace_per_req_bytes(32, 128, 262144)
        self.assertEqual(per, 17_039_360)
        for slots, gib in ((2048, 32.5), (3261, 51.75), (4096, 65.0)):
            self.assertAlmostEqual(slots * per / GiB, gib, places=2)
        # PR #36563 consistency checks
        self.assertEqual(2048 * aiter_decode_workspace_per_req_bytes(8, 128, 131072), int(4.0625 * GiB))
        self.assertEqual(4096 * aiter_decode_workspace_per_req_bytes(16, 192, 262144), int(48.5 * GiB))
        # MLA: no decode workspace, only the (R + 1) int32 indptr buffers and a full context of int32 token slots
        mla = workspace_spec("aiter", AttentionShape(128, 576, 131072, v_head_dim=512, is_mla=True))
        self.assertEqual((mla.fixed_bytes, mla.per_req_bytes), (12, 3 * 4 + 131072 * 4))

    def test_flashinfer(self):
        ws = workspace_spec("flashinfer", AttentionShape(32, 128, 131072, architectures=("LlamaForCausalLM",)))
        self.assertEqual(ws.fixed_bytes - 12, 384 * MiB + 8 * MiB)  # float + int (plan-info) workspaces
        # per slot: 3 int32 indptr entries + one context of int32 page ids (page size 1: 131072 x 4 B = 0.5 MiB),
        # the buffer every batch's page ids go to, graphs included (so nothing per graph batch)
        self.assertEqual((ws.per_req_bytes, ws.per_graph_bs_bytes), (3 * 4 + 131072 * 4, 0))
        paged = workspace_spec("flashinfer", BackendInputs(AttentionShape(32, 128, 131072), 0, page_size=16))
        self.assertEqual(paged.per_req_bytes, 3 * 4 + 131072 // 16 * 4)
        qwen = workspace_spec("flashinfer", AttentionShape(32, 128, 131072, architectures=("Qwen3MoeForCausalLM",)))
        self.assertEqual(qwen.fixed_bytes - 12, 512 * MiB + 8 * MiB)

    def test_triton_and_torch_native(self):
        ws = workspace_spec("triton", AttentionShape(32, 128, 131072, num_kv_splits=8))
        # graph attn_logits at bs 256: 256 x 32 heads x 8 splits x 128 x 4 B = 32 MiB (+ lse); no kv indices
        self.assertEqual(256 * 32 * 8 * 128 * 4, 32 * MiB)
        self.assertEqual(ws.per_graph_bs_bytes, 32 * 8 * 128 * 4 + 32 * 8 * 4)
        self.assertEqual(workspace_spec("torch_native", AttentionShape(32, 128, 131072)).bytes_for(4096, 256), 0)

    def test_req_to_token(self):
        self.assertAlmostEqual(req_to_token_bytes(2048, 131072, 4) / GiB, 1.0005, places=4)  # upstream's int32
        self.assertEqual(req_to_token_bytes(2048, 131072), 2049 * 131076 * 8)  # ours: int64
        self.assertAlmostEqual(req_to_token_bytes(4096, 262144, 4) / GiB, 4.0, places=2)

    def test_safety_margin_rule(self):
        self.assertEqual(default_safety_margin_bytes(80 * GiB), GiB)
        self.assertEqual(default_safety_margin_bytes(GiB), 64 * MiB)
        self.assertEqual(default_safety_margin_bytes(10 * GiB), int(10 * GiB * 0.02))


if __name__ == "__main__":
    unittest.main()
