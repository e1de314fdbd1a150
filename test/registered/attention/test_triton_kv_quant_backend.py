"""--attention-backend triton over a quantized KV pool (every --kv-cache-dtype format), in the Triton interpreter:
  * the backend against torch_native on the same pool (BackendHarness: prefill, extend over a cached prefix at page
    size 16, decode, GQA 3:1), fp32, max abs difference <= 1e-4; the formats with a recent window (int4,
    int2_hadamard, fp8) with it, as a server's pool has it (both backends read a request's first S cached tokens from
    its sink entries and its newest from the ring, each from the same ring state; a 60-token prompt puts codes between
    them) and int4 without one; after every step the ring the backend wrote equals torch_native's (same slots, same
    bf16 rows in the stored basis);
  * CUDA-graph decode: init_forward_metadata_capture_cuda_graph once, then two forwards over the graph's input
    tensors (as warm-up / capture / replay run them), each the next decode step: every kernel launch gets the pool's
    own code and scale buffers (views of pool.fields / pool.fixed, layer by layer: what a captured graph reads at
    replay), the window's own ring buffers, the planned graph workspace, the full split grid and the current token's
    fresh K/V; the recent window's tail is made by each forward itself (one per forward, shared by its layers: so a
    graph holds its kernels), without a host sync or a data-dependent shape; the output and the ring still equal
    torch_native's (both attend a forward's new tokens as computed, cached ones through their codes or the ring);
  * the rotated formats' matrices live in the planned kv_rotation buffer (mem_plan/backends.py declares it from
    kv_quant.rotated_parts, which must agree with the codec) and equal the pool's rotation.
The kernels' own accuracy per format is test_triton_kv_quant_interpreted.py's."""

import unittest

from interpreted_run import run_in_interpreter
from kv_quant_triton_cases import FORMATS, WINDOW_FORMATS

from sglang.srt.mem_cache import kv_quant_codec
from sglang.srt.mem_plan.backends import AttentionShape, BackendInputs, declare
from sglang.srt.mem_plan.kv_quant import rotated_parts
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="cpu")

TOL = 1e-4


class TestTritonKVQuantBackend(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.results = run_in_interpreter("kv_quant_backend")

    def test_matches_torch_native(self):
        for fmt in FORMATS + ("int4 no window",):
            r = self.results[fmt]
            with self.subTest(fmt=fmt):
                self.assertEqual(r["window"], fmt in WINDOW_FORMATS)
                self.assertLess(max(r["step_diffs"]), TOL, r["step_diffs"])
                self.assertLess(r["graph_diff"], TOL)

    def test_writes_the_ring_as_torch_native(self):
        for fmt in WINDOW_FORMATS:
            r = self.results[fmt]
            with self.subTest(fmt=fmt):
                self.assertEqual(r["step_ring_diffs"], [0.0] * 4)  # prefill, extend, two decode steps
                self.assertEqual(r["graph_ring_diffs"], [0.0] * 2)

    def test_checkpoint_scales_keep_fp8_keys_plain(self):
        """fp8 scales from a checkpoint were measured on plain keys: the pool stores them plain and the backend leaves
        the query unturned (its planned R unused), still equal to torch_native over the same pool."""
        r = self.results["fp8_e4m3 plain keys"]
        self.assertLess(max(r["step_diffs"]), TOL, r["step_diffs"])
        self.assertLess(r["graph_diff"], TOL)
        self.assertEqual(r["pool_turned_parts"], [])
        self.assertEqual(self.results["fp8_e4m3"]["pool_turned_parts"], ["k"])

    def test_cuda_graph_reads_the_pool_buffers(self):
        for fmt in FORMATS:
            r = self.results[fmt]
            with self.subTest(fmt=fmt):
                self.assertEqual(r["graph_launches"], 4)  # one per layer, two forwards
                self.assertTrue(r["graph_kv_are_pool_buffers"])
                self.assertEqual(r["graph_kv_codes_per_layer"], [True] * 4)
                self.assertTrue(r["graph_ring_is_window"])
                self.assertEqual(r["graph_host_syncs"], [])
                if fmt in WINDOW_FORMATS:
                    self.assertTrue(r["graph_tail_left_to_forward"])
                    self.assertEqual(r["graph_tail_per_forward"], [[True, True, True]])
                self.assertTrue(r["graph_uses_graph_workspace"])
                self.assertTrue(r["graph_grid_all_splits"])
                self.assertTrue(r["graph_fresh_kv"])

    def test_rotation_is_planned(self):
        for fmt in FORMATS:
            r = self.results[fmt]
            with self.subTest(fmt=fmt):
                # stored turned: the codec's rotated-basis parts, and int4's keys (turned with their multiplier)
                stored = set(kv_quant_codec.ROTATED_PARTS.get(fmt, ())) | ({"k"} if fmt == "int4" else set())
                self.assertEqual(set(rotated_parts(fmt)), stored)
                self.assertEqual(r["rotation_parts"], sorted(rotated_parts(fmt)))
                shape = AttentionShape(6, 32, 512, num_kv_splits=4, kv_rotated_parts=len(rotated_parts(fmt)))
                decl = {d.name: d for d in declare("triton", BackendInputs(shape, 4))}
                if rotated_parts(fmt):
                    self.assertTrue(r["rotation_in_planned_buffer"] and r["rotation_equals_pool"])
                    self.assertEqual(decl["kv_rotation"].shape, (len(rotated_parts(fmt)), 32, 32))
                    self.assertEqual(decl["kv_rotation"].num_bytes, len(rotated_parts(fmt)) * 32 * 32 * 4)
                else:
                    self.assertNotIn("kv_rotation", decl)


if __name__ == "__main__":
    unittest.main()
