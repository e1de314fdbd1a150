"""The CPU kernel path's per-layer operands over a quantized pool (layers/attention/quant_kernel_operands.py): views of
exactly the pool's buffers (the kernel writes the codes and scales the pool owns; a calibration's in-place scales are
what it reads), the codec's turns where the format stores a part turned (fp8 / int8 keys, int4 keys with w and
values, int2_hadamard both), the layer's ring where the pool has one; made once per layer and made again when the
parts the pool stores plain change (a checkpoint's fp8 scales leave its keys unturned)."""

import unittest

import torch

from sglang.srt.layers.attention.quant_kernel_operands import QuantOperandCache
from sglang.srt.mem_cache import kv_quant_codec as codec
from sglang.srt.mem_cache.quantized_kv_pool import create_kv_pool
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="cpu")

TURNED = {"fp8_e4m3": ("k",), "int8": ("k",), "int4": ("k", "v"), "int2_hadamard": ("k", "v")}


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape


class TestQuantKernelOperands(unittest.TestCase):
    def test_views_turns_and_rings(self):
        for fmt, turned in TURNED.items():
            pool = create_kv_pool(fmt, 64, 1, torch.bfloat16, 2, 64, 3, window_rows=5)
            ops = QuantOperandCache(pool)
            for lid in range(3):
                o = ops(lid)
                self.assertIs(ops(lid), o, fmt)  # kept
                self.assertTrue(same_storage(o.k_codes, pool.fields["k"][lid]), fmt)
                self.assertTrue(same_storage(o.v_codes, pool.fields["v"][lid]), fmt)
                scales = pool.fixed if fmt == "fp8_e4m3" else pool.fields
                self.assertTrue(same_storage(o.k_scale, scales["k_scale"][lid]), fmt)
                self.assertTrue(same_storage(o.v_scale, scales["v_scale"][lid]), fmt)
                r = codec.rotation(64)
                self.assertTrue(torch.equal(o.k_turn, r), fmt)
                self.assertEqual(o.v_turn is not None, "v" in turned, fmt)
                if "v" in turned:
                    self.assertTrue(torch.equal(o.v_turn, r) and torch.equal(o.v_back, r.T), fmt)
                self.assertEqual(o.k_smooth is not None, fmt == "int4", fmt)
                if fmt == "int4":
                    self.assertTrue(same_storage(o.k_smooth, pool.fixed["k_smooth"][lid]))
                if pool.window is None:
                    self.assertIsNone(o.ring_k, fmt)
                else:
                    # [ring rows, W + S, KV, D]: the kernel takes the ring rows and the entries a row from the shape
                    for got, want in zip((o.ring_k, o.ring_v), (pool.window.k[lid], pool.window.v[lid])):
                        self.assertTrue(same_storage(got, want), fmt)

    def test_made_again_when_the_plain_parts_change(self):
        pool = create_kv_pool("fp8_e4m3", 64, 1, torch.bfloat16, 2, 64, 2)
        ops = QuantOperandCache(pool)
        self.assertIsNotNone(ops(0).k_turn)
        pool.plain_parts.add("k")  # as a checkpoint's fp8 scales do: the keys are stored unturned
        self.assertIsNone(ops(0).k_turn)
        self.assertIsNone(ops(1).k_turn)


if __name__ == "__main__":
    unittest.main()
