"""AITER backend wiring on CPU, through a stand-in `aiter` module (sglang.test.attention_standins).

This checks wiring, not numerics: the stand-in has the real signatures of aiter.paged_attention_ragged (decode,
the kernel whose per-slot workspace PR #18263 sizes) and aiter.mha_batch_prefill_func (prefill) from amd-aiter
0.1.7, checks what they assume (NHD caches, int32 CSR arrays, fp16/bf16, fp32 scales, a workspace big enough for the
kernel's layout at this batch), and computes attention with torch from the arguments it receives, which is compared
with torch_native over the same pools. The workspace handed to every decode call must be the planned buffer.
"""

import unittest

import torch
from backend_fixtures import check_steps

from sglang.srt.mem_plan.backends import aiter_decode_workspace_per_req_bytes, declare
from sglang.test.attention_harness import BackendHarness
from sglang.test.attention_standins import install, make_aiter
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="cpu")

BF16_TOL = 2e-2
CONTEXT_LEN = 4096  # 16 partitions: the workspace (52 KiB here) outweighs any per-step index array


class TestAiterWiring(unittest.TestCase):
    def run_steps(self, page_size, dtype=torch.bfloat16, context_len=CONTEXT_LEN):
        with install(make_aiter()) as aiter:
            h = BackendHarness("aiter", page_size=page_size, dtype=dtype, context_len=context_len)
            rows = [h.new_request() for _ in range(4)]
            # 300 tokens: two 256-token partitions for the decode kernel; per step the forward allocates the page
            # indices and the output, never a second workspace
            check_steps(self, h, rows, [[5, 300, 9, 1], [3, 1, 8, 2], [1, 1, 1, 1], [1, 1, 1, 1]], BF16_TOL,
                        h.backend.buffers["workspace"].numel() // 2)
        return h, aiter.calls

    def test_outputs_match_torch_native(self):
        for page_size in (1, 16):
            self.run_steps(page_size)

    def test_fp16(self):
        self.run_steps(1, dtype=torch.float16)

    def test_decode_gets_the_planned_workspace(self):
        h, calls = self.run_steps(1)
        ws = h.backend.buffers["workspace"]
        shape = h.inputs.shape
        self.assertEqual(ws.numel(), h.inputs.num_reqs * aiter_decode_workspace_per_req_bytes(
            shape.num_q_heads, shape.head_dim, shape.context_len))
        # one persistent workspace, as declared (the plan charges the same list)
        self.assertEqual([d.name for d in declare("aiter", h.inputs) if d.name == "workspace"], ["workspace"])
        decodes = calls.named("paged_attention_ragged")
        self.assertEqual(len(decodes), 2 * h.num_layers)
        for call in decodes:
            self.assertEqual(call["workspace_buffer"].data_ptr(), ws.data_ptr())
            self.assertEqual(call["max_num_partitions"], 16)  # ceil(4096 / 256)
            self.assertEqual(call["partition_size"], 256)
            self.assertEqual(call["block_size"], 1)
            self.assertEqual(call["kv_indptr"].data_ptr(), h.backend.buffers["kv_indptr"].data_ptr())
            self.assertEqual(call["k_scale"].data_ptr(), h.backend.buffers["kv_scales"].data_ptr())
            self.assertEqual(float(call["k_scale"]), 1.0)
        prefills = calls.named("mha_batch_prefill_func")
        self.assertEqual(len(prefills), 2 * h.num_layers)
        for call in prefills:
            self.assertTrue(call["causal"])
            self.assertEqual(call["cu_seqlens_q"].data_ptr(), h.backend.buffers["qo_indptr"].data_ptr())

    def test_refusals(self):
        with install(make_aiter()):
            with self.assertRaisesRegex(ValueError, "float16/bfloat16"):
                BackendHarness("aiter", dtype=torch.float32)
            for fmt in ("fp8_e4m3", "fp8_e5m2", "int8", "int4", "int2_hadamard"):  # no fp8 prefill in AITER
                with self.assertRaisesRegex(ValueError, f"cannot read --kv-cache-dtype {fmt}.*--attention-backend "
                                                        "triton"):
                    BackendHarness("aiter", kv_format=fmt)


if __name__ == "__main__":
    unittest.main()
