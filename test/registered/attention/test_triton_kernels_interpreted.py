"""The Triton attention kernels (layers/attention/triton_ops) under the Triton interpreter on CPU, against a plain
float64 torch reference (triton_attention_cases.py, not the backend's code): split-KV decode + merge and paged
extend with cached prefixes, GQA (4:1 and 3:1) and MHA, page sizes 1 and 16, mixed sequence lengths in one batch,
a value dim != head dim, with both tile sets (the GPU tiles make these small shapes span several KV blocks, query
blocks and splits). Max abs error <= 1e-5 in fp32 and <= 2e-3 in fp16. The interpreter computes bf16 dot products
wrongly, so bf16 is checked only by the GPU variant (test_triton_attention_gpu.py). The kernels run in a child
process with TRITON_INTERPRET=1 (interpreted_run.py says why)."""

import unittest

import torch
from interpreted_run import run_in_interpreter
from triton_attention_cases import DECODE_CASES, EXTEND_CASES, TOL

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="cpu")

DTYPES = {str(d): d for d in TOL}


class TestTritonKernelsInterpreted(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.errors = run_in_interpreter("kernels")

    def test_every_case_within_tolerance(self):
        cases = {k: v for k, v in self.errors.items() if not k.startswith("sensitivity")}
        # 2 tile sets x 2 dtypes x 2 page sizes x (decode + extend cases), + the v_dim case per tile set
        self.assertEqual(len(cases), 2 * 2 * 2 * (len(DECODE_CASES) + len(EXTEND_CASES)) + 2)
        for key, err in cases.items():
            kind, tiles, dtype, page_size, case = key.split("|")
            with self.subTest(kind=kind, tiles=tiles, dtype=dtype, page_size=page_size, case=case):
                self.assertLessEqual(err, TOL[DTYPES[dtype]], f"{key}: max abs error {err:.3g}")
        print("max abs error fp32 %.2e, fp16 %.2e" % (
            max(v for k, v in cases.items() if "float32" in k), max(v for k, v in cases.items() if "float16" in k)))

    def test_comparison_can_fail(self):
        """A kernel run with a wrong softmax scale is far outside the tolerance."""
        self.assertGreater(self.errors["sensitivity|decode"], 1e-2)
        self.assertGreater(self.errors["sensitivity|extend"], 1e-2)


if __name__ == "__main__":
    unittest.main()
