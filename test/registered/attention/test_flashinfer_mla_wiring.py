"""FlashInfer's MLA wiring on CPU (layers/attention/flashinfer_mla.py), through a stand-in BatchMLAPagedAttentionWrapper
with flashinfer-python 0.7.4's parameter lists (flashinfer_mla_standin.py) that attends from exactly the arguments it
gets. The backend runs over the latent pool (mem_cache/mla_pool.py) through prefill, extends over cached prefixes,
decode steps and a late request (mla_backend_steps.py), and its output, through W_UV, is compared with the
EXPANDED multi-head form in float64 (random W_UK / W_UV): a wrong ckv / kpe split of the row, page table, kv lengths,
causal flag or softmax scale is far outside bf16's tolerance. The plan() / run() arguments are checked directly:
the planned workspace and page-id buffer, host arrays for what plan() reads on the host, the layer's MLA scale
(not head_dim ** -0.5), views of the pool's own storage for the caches, one plan per forward.
"""

import unittest

import torch
from flashinfer_mla_standin import add_mla_wrapper
from mla_backend_steps import MLA_STEPS, backend_calls_in, mla_harness, run_mla_steps, worst_error

from sglang.test.attention_standins import AllocationRecorder, install, make_aiter, make_flashinfer
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="cpu")

BF16_TOL = 3e-2  # bf16 query and rows: a few ulps at |out| ~ 1; a wrong key set or split is off by O(0.1..1)
FP16_TOL = 3e-3
STEP_ALLOC_LIMIT_BYTES = 64 * 1024  # the outputs and index arrays of these tiny batches; the workspace is 384 MiB


class TestFlashInferMLAWiring(unittest.TestCase):
    def run_steps(self, page_size, dtype=torch.bfloat16, tol=BF16_TOL):
        with install(add_mla_wrapper(make_flashinfer())) as fi:
            h = mla_harness("flashinfer", page_size=page_size, dtype=dtype)
            for i, err in enumerate(run_mla_steps(h)):
                with self.subTest(page_size=page_size, dtype=dtype, step=i):
                    self.assertLess(err, tol)
        return h, fi.calls

    def test_equals_the_expanded_form_page_sizes_1_4_16(self):
        for page_size in (1, 4, 16):
            self.run_steps(page_size)

    def test_fp16(self):
        self.run_steps(16, dtype=torch.float16, tol=FP16_TOL)

    def test_plan_and_run_arguments(self):
        h, calls = self.run_steps(4)
        b, pool = h.backend.buffers, h.pool
        init = calls.named("mla_init")[-1]  # the backend's one wrapper (the harness built a first backend too)
        self.assertEqual(init["float_workspace_buffer"].data_ptr(), b["workspace"].data_ptr())
        self.assertEqual(calls.named("prefill_init") + calls.named("decode_init"), [])  # no paged MHA wrappers
        plans, runs = calls.named("mla_plan"), calls.named("mla_run")
        self.assertTrue(all(c["wrapper"] is init["wrapper"] for c in plans + runs))
        self.assertEqual(len(plans), len(MLA_STEPS))  # one plan per forward
        self.assertEqual(len(runs), len(MLA_STEPS) * len(h.layers))
        decode = [all(n == 1 for n in lens) and i > 0 for i, (_, lens) in enumerate(MLA_STEPS)]
        for plan, is_decode in zip(plans, decode):
            self.assertEqual(plan["causal"], not is_decode)
            self.assertEqual((plan["head_dim_ckv"], plan["head_dim_kpe"]), (h.R, h.P))
            self.assertEqual((plan["num_heads"], plan["page_size"]), (h.H, 4))
            self.assertEqual(plan["sm_scale"], h.layers[0].scaling)
            self.assertNotAlmostEqual(plan["sm_scale"], h.L ** -0.5)
            self.assertEqual(plan["q_data_type"], torch.bfloat16)
            for name in ("qo_indptr", "kv_indptr", "kv_len_arr"):  # read on the host by plan(): host arrays
                self.assertEqual(plan[name].device.type, "cpu")
                self.assertNotEqual(plan[name].data_ptr(), b["kv_indptr_0"].data_ptr())
            self.assertEqual(plan["kv_indices"].data_ptr(), b["kv_indices_0"].data_ptr())  # the planned buffer
        for run in runs:
            # the caches are views of the layer's rows: ckv the first kv_lora columns, kpe the rest
            layer = [i for i in range(len(h.layers))
                     if run["ckv_cache"].data_ptr() == pool.get_key_buffer(i).data_ptr()]
            self.assertEqual(len(layer), 1)
            row = pool.get_key_buffer(layer[0])
            self.assertEqual(run["kpe_cache"].data_ptr(), row.data_ptr() + h.R * row.element_size())
            self.assertEqual(run["ckv_cache"].stride(1), h.L)

    def test_a_step_allocates_nothing_large(self):
        with install(add_mla_wrapper(make_flashinfer())):
            h = mla_harness("flashinfer", page_size=16, dtype=torch.bfloat16)
            rows = [h.new_request() for _ in range(3)]
            h.step(rows, [40, 3, 17])
            for lens in ([1, 1, 1], [2, 5, 1]):
                rec = AllocationRecorder()
                with backend_calls_in(h, recorder=rec):
                    self.assertLess(worst_error(*h.step(rows, lens)), BF16_TOL)
                self.assertGreater(len(rec.sizes), 0)  # the backend's calls were recorded
                self.assertLess(rec.largest_bytes, STEP_ALLOC_LIMIT_BYTES)

    def test_refusals(self):
        with install(add_mla_wrapper(make_flashinfer())):
            with self.assertRaisesRegex(ValueError, "CUDA graphs over MLA.*--disable-cuda-graph"):
                mla_harness("flashinfer", graph_bs=2, dtype=torch.bfloat16)
            with self.assertRaisesRegex(ValueError, "float16/bfloat16.*--dtype bfloat16"):
                mla_harness("flashinfer", dtype=torch.float32)
            h = mla_harness("flashinfer", dtype=torch.bfloat16)
            h.layers[1].scaling *= 2
            with self.assertRaisesRegex(NotImplementedError, "one plan per forward"):
                h.step([h.new_request()], [4])


class TestAiterRefusesMLA(unittest.TestCase):
    def test_refused_naming_the_backends_that_serve_it(self):
        with install(make_aiter()):
            with self.assertRaisesRegex(NotImplementedError, "aiter: MLA .*--attention-backend triton"):
                mla_harness("aiter", dtype=torch.bfloat16)


if __name__ == "__main__":
    unittest.main()
