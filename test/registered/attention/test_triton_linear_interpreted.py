"""The Triton causal conv1d and gated delta rule kernels (triton_ops/causal_conv1d.py, triton_ops/gated_delta_rule.py)
under the Triton interpreter on CPU, against fp64 per-token loops of their recurrences (linear_reference.py) and,
for the decode steps, the torch forms: varlen batches with lengths on both sides of the conv window and of the
chunk, zero-length requests, has_initial_state mixed with stale nan rows, GQA q/k heads, with and without the
l2norm, a prompt cut inside the window / across chunks == the whole, bf16 conv. The cases run in a child process
with TRITON_INTERPRET=1 (linear_triton_cases.py; interpreted_run.py says why)."""

import json
import os
import subprocess
import sys
import unittest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=40, suite="cpu")

HERE = os.path.dirname(os.path.abspath(__file__))
RESULT_PREFIX = "RESULT_JSON:"
FP32_TOL = 1e-5
BF16_TOL = 5e-2


def run_interpreted(timeout_s: float = 600) -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, os.path.join(HERE, "linear_triton_cases.py")], env=env,
                         capture_output=True, text=True, timeout=timeout_s)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if out.returncode != 0 or not lines:
        raise AssertionError(f"interpreted run failed (rc {out.returncode}):\n{out.stdout[-3000:]}\n"
                             f"{out.stderr[-5000:]}")
    return json.loads(lines[-1][len(RESULT_PREFIX):])


class TestTritonLinearInterpreted(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.result = run_interpreted()

    def check(self, prefix: str, count: int):
        cases = {k: v for k, v in self.result.items() if k.startswith(prefix)}
        self.assertEqual(len(cases), count, sorted(cases))
        for key, error in cases.items():
            with self.subTest(case=key):
                self.assertLessEqual(error, FP32_TOL, key)

    def test_conv_extend_and_decode(self):
        self.check("conv_extend|", 4)
        self.check("conv_decode|", 4)
        self.check("conv_cut|", 2)

    def test_conv_bf16(self):
        self.assertLessEqual(self.result["conv_bf16|y"], BF16_TOL)
        self.assertEqual(self.result["conv_bf16|state"], 0.0)  # the state holds inputs: copied, not computed
        self.assertEqual(self.result["conv_bf16|dtypes"], 0.0)

    def test_gated_delta_rule_chunked_extend_and_decode(self):
        self.check("gdr_extend|", 4)
        self.check("gdr_decode|", 4)
        self.check("gdr_cut|", 2)

    def test_public_ops_dispatch_to_the_kernels(self):
        """causal_conv1d_* / gated_delta_rule_* with their device test forced to a GPU's answer == their torch run."""
        self.check("dispatch|", 4)

    def test_comparison_can_fail(self):
        """The extend kernel without the l2norm the reference applies is far outside the tolerance."""
        self.assertGreater(self.result["broken|gdr_extend_without_l2norm"], 1e-2)


if __name__ == "__main__":
    unittest.main()
