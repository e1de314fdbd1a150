"""FlashInfer backend wiring on CPU, through a stand-in `flashinfer` module (sglang.test.attention_standins).

This checks wiring, not numerics: the stand-in has the real wrappers' signatures (flashinfer-python 0.7.2), checks
what the kernels assume (int32 CSR arrays, NHD paged cache [pages, page_size, KV, D], fp16/bf16, fixed CUDA-graph
buffers), and computes attention with torch from the page table it is handed. Comparing that with torch_native over
the same pools catches a wrong page table (indptr / indices / last-page lengths), a wrong causal alignment or a
wrong pool view; the planned workspaces must be the objects the library gets, and a step allocates nothing large.
An fp8 pool reaches the library with its fp8 dtype and per-layer k_scale / v_scale; the int formats are refused.
"""

import unittest

import torch
from backend_fixtures import check_steps

from sglang.srt.layers.attention.attention_registry import create_attention_backend
from sglang.srt.mem_plan.backends import FLASHINFER_INT_WORKSPACE_BYTES
from sglang.test.attention_harness import BackendHarness, max_abs_diff
from sglang.test.attention_standins import install, make_flashinfer
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="cpu")

BF16_TOL = 2e-2  # one or two bf16 ulps at |out| ~ 1; a wrong key set is off by O(0.1..1)
STEP_ALLOC_LIMIT_BYTES = 64 * 1024  # index arrays of these tiny batches; the workspace is 384 MiB


class TestFlashInferWiring(unittest.TestCase):
    def run_steps(self, page_size, dtype=torch.bfloat16):
        with install(make_flashinfer()) as fi:
            h = BackendHarness("flashinfer", page_size=page_size, dtype=dtype)
            rows = [h.new_request() for _ in range(3)]
            # prefill, extend over a cached prefix, decode
            check_steps(self, h, rows, [[5, 17, 9], [3, 1, 8], [1, 1, 1], [1, 1, 1]], BF16_TOL,
                        STEP_ALLOC_LIMIT_BYTES)
            late = h.new_request()  # a request joining while the others hold long prefixes
            got, want = h.step(rows + [late], [2, 4, 1, 11])
            self.assertLess(max_abs_diff(got, want), BF16_TOL)
        return h, fi.calls

    def test_outputs_match_torch_native_page_sizes_1_4_16(self):
        for page_size in (1, 4, 16):
            self.run_steps(page_size)

    def test_fp16(self):
        self.run_steps(4, dtype=torch.float16)

    def test_plan_once_per_forward_with_the_planned_buffers(self):
        h, calls = self.run_steps(4)
        b = h.backend.buffers
        self.assertEqual(b["int_workspace"].numel(), FLASHINFER_INT_WORKSPACE_BYTES)
        # both wrappers got the planned workspaces, the very same storage
        for init in calls.named("prefill_init") + calls.named("decode_init"):
            self.assertEqual(init["float_workspace_buffer"].data_ptr(), b["workspace"].data_ptr())
        resets = calls.named("reset_workspace_buffer")
        self.assertEqual(len(resets), 2)
        for r in resets:
            self.assertEqual(r["float_workspace_buffer"].data_ptr(), b["workspace"].data_ptr())
            self.assertEqual(r["int_workspace_buffer"].data_ptr(), b["int_workspace"].data_ptr())
        # one plan per forward (5 forwards: 3 extend, 2 decode), one run per layer per forward
        self.assertEqual(len(calls.named("prefill_plan")), 3)
        self.assertEqual(len(calls.named("decode_plan")), 2)
        self.assertEqual(len(calls.named("prefill_run")), 3 * h.num_layers)
        self.assertEqual(len(calls.named("decode_run")), 2 * h.num_layers)
        for plan in calls.named("prefill_plan"):
            self.assertTrue(plan["causal"])
            self.assertEqual(plan["page_size"], 4)
            self.assertEqual(plan["sm_scale"], h.head_dim ** -0.5)
            # plan() reads the small arrays on the host: it gets the host arrays the planned buffers were filled from
            # (handing it the device buffers would make flashinfer copy them back, a sync per step)
            self.assert_host_copy(plan["qo_indptr"], b["qo_indptr"])
            self.assert_host_copy(plan["paged_kv_indptr"], b["kv_indptr_0"])
            self.assert_host_copy(plan["paged_kv_last_page_len"], b["kv_last_page_len"])
            self.assertEqual(plan["paged_kv_indices"].data_ptr(), b["kv_indices_0"].data_ptr())  # the planned buffer
        for plan in calls.named("decode_plan"):
            self.assert_host_copy(plan["indptr"], b["kv_indptr_0"])
            self.assert_host_copy(plan["last_page_len"], b["kv_last_page_len"])
            self.assertEqual(plan["indices"].data_ptr(), b["kv_indices_0"].data_ptr())
            self.assertEqual(plan["q_data_type"], torch.bfloat16)

    def assert_host_copy(self, arg, buffer):
        """A host int32 array, not the planned buffer (its values are checked by the outputs matching the reference:
        the stand-in attends through exactly the arrays plan() received)."""
        self.assertEqual((arg.device.type, arg.dtype), ("cpu", torch.int32))
        self.assertNotEqual(arg.data_ptr(), buffer.data_ptr())
        self.assertLessEqual(len(arg), len(buffer))

    def test_cuda_graph_decode_uses_the_planned_fixed_buffers(self):
        with install(make_flashinfer()) as fi:
            h = BackendHarness("flashinfer", page_size=4, graph_bs=2, num_reqs=4)
            rows = [h.new_request() for _ in range(2)]
            h.step(rows, [7, 13])
            fb = h.batch(rows, [1, 1])
            h.backend.init_forward_metadata_capture_cuda_graph(2, fb.req_pool_indices, fb.seq_lens_cpu)
            init = fi.calls.named("decode_init")[-1]
            b = h.backend.buffers
            self.assertTrue(init["use_cuda_graph"])
            self.assertEqual(init["paged_kv_indices_buffer"].data_ptr(), b["kv_indices_0"].data_ptr())
            self.assertEqual(init["paged_kv_indptr_buffer"].data_ptr(), b["kv_indptr_0"].data_ptr())
            self.assertEqual(len(init["paged_kv_indptr_buffer"]), 3)
            self.assertEqual(init["paged_kv_last_page_len_buffer"].data_ptr(), b["kv_last_page_len"].data_ptr())
            qkv = h.qkv(2)
            got = [h.backend.forward(q, k, v, layer, fb) for layer, (q, k, v) in zip(h.layers, qkv)]
            self.assertLess(max_abs_diff(got, h.run(h.reference, fb, qkv)), BF16_TOL)
            # replay: the same wrapper re-planned for longer sequences reads the same fixed buffers
            fb2 = h.batch(rows, [1, 1])
            h.backend.init_forward_metadata_replay_cuda_graph(2, fb2.req_pool_indices, fb2.seq_lens_cpu)
            self.assertIs(fi.calls.named("decode_plan")[-1]["wrapper"], init["wrapper"])
            qkv = h.qkv(2)
            got = [h.backend.forward(q, k, v, layer, fb2) for layer, (q, k, v) in zip(h.layers, qkv)]
            self.assertLess(max_abs_diff(got, h.run(h.reference, fb2, qkv)), BF16_TOL)
            with self.assertRaisesRegex(ValueError, "graph batch 3"):
                h.backend.init_forward_metadata_capture_cuda_graph(3, fb.req_pool_indices, fb.seq_lens_cpu)

    def test_refuses_float32_and_foreign_scaling(self):
        with install(make_flashinfer()):
            with self.assertRaisesRegex(ValueError, "float16/bfloat16.*--dtype bfloat16"):
                BackendHarness("flashinfer", dtype=torch.float32)
            h = BackendHarness("flashinfer")
            rows = [h.new_request()]
            fb = h.batch(rows, [4])
            h.backend.init_forward_metadata(fb)
            q, k, v = h.qkv(4)[0]
            h.layers[0].scaling = 0.5
            with self.assertRaisesRegex(NotImplementedError, "scales by 0.5"):
                h.backend.forward(q, k, v, h.layers[0], fb)

    def test_fp8_pool_gets_its_dtype_and_per_layer_scales(self):
        """An fp8 pool: plan() gets the fp8 kv_data_type (the stand-in checks the cache against it), run() the
        layer's k_scale / v_scale floats, and the outputs equal torch_native reading the same codes and scales."""
        cases = [(fmt, dtype, turned) for fmt, dtype in (("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2))
                 for turned in (True, False)]
        for fmt, dtype, turned in cases:
            with self.subTest(fmt=fmt, keys_turned=turned), install(make_flashinfer()) as fi:
                h = BackendHarness("flashinfer", page_size=4, kv_format=fmt)
                k_scales, v_scales = torch.tensor([0.02, 0.05]), torch.tensor([0.04, 0.01])
                # per layer, as calibration leaves them for flashinfer (keys stored turned: the query is turned too),
                # or a checkpoint's (keys stored plain)
                h.pool.load_scales(k_scales, v_scales, "test", keys_turned=turned)
                self.assertEqual(h.pool.rotation("k") is not None, turned)
                h.backend = create_attention_backend("flashinfer", inputs=h.inputs, model_config=h.reference.model_config,
                                                     req_to_token_pool=h.r2t, token_to_kv_pool=h.pool, device="cpu")
                # flashinfer's paged API reads a forward's new tokens back from the fp8 pool; torch_native attends
                # them as computed unless told to read them back too, as here
                h.reference.fresh_reads = False
                rows = [h.new_request() for _ in range(3)]
                # a prefill without a cached prefix: torch_native attends to the fresh K/V, flashinfer to the fp8
                # pool (it reads only the pool); every later step reads the pool in both
                h.step(rows, [5, 17, 9])
                check_steps(self, h, rows, [[3, 1, 8], [1, 1, 1], [1, 1, 1]], BF16_TOL, STEP_ALLOC_LIMIT_BYTES)
                runs = fi.calls.named("prefill_run") + fi.calls.named("decode_run")
                self.assertEqual(len(runs), 4 * h.num_layers)
                for run in runs:
                    # the cache handed over is a view of the pool's own codes of that layer
                    layer = [i for i in range(h.num_layers)
                             if run["paged_kv_cache"][0].data_ptr() == h.pool.k_buffer[i].data_ptr()][0]
                    self.assertEqual(run["paged_kv_cache"][0].dtype, dtype)
                    self.assertAlmostEqual(run["k_scale"], float(k_scales[layer]))
                    self.assertAlmostEqual(run["v_scale"], float(v_scales[layer]))

    def test_refuses_int_formats_and_per_head_scales(self):
        with install(make_flashinfer()):
            for fmt in ("int8", "int4", "int2_hadamard"):
                with self.assertRaisesRegex(ValueError, f"cannot read --kv-cache-dtype {fmt}.*--attention-backend "
                                                        "triton"):
                    BackendHarness("flashinfer", kv_format=fmt)
            h = BackendHarness("flashinfer", kv_format="fp8_e4m3")
            h.pool.load_scales(torch.tensor([[0.1, 0.2], [0.1, 0.1]]), torch.ones(2), "per head")
            with self.assertRaisesRegex(ValueError, "one fp8 k scale per layer.*--attention-backend triton"):
                create_attention_backend("flashinfer", inputs=h.inputs, model_config=h.reference.model_config,
                                         req_to_token_pool=h.r2t, token_to_kv_pool=h.pool, device="cpu")


if __name__ == "__main__":
    unittest.main()
