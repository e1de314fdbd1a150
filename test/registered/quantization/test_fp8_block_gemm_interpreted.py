"""The block-fp8 GEMM (layers/quantization/fp8_block_gemm.py: per-token-group activation quantization + 128x128
block-scaled fp8 weights) and the fp8 linear layers that serve an fp8 block checkpoint on a GPU
(fp8_block_linear.py), run under the Triton interpreter on CPU against an fp64 reference built from the test's own
quantization (fp8_gemm_cases.py, in a child process with TRITON_INTERPRET=1):
- the activation quantization == the reference's fp8 values exactly, scales to fp32 rounding;
- the GEMM (whole and ragged M / N / K, interpreter and GPU tiles) within 1e-6 of the max |reference| (the fp8
  products are exact, the fp32 accumulation is the only rounding); a run with inverted weight scales is far off;
- QKV (q, k, v shards), gate/up and down layers loaded shard by shard through their weight and weight_scale_inv
  loaders, forward through the kernels, within 1e-6; a gate/up whose halves end inside a 128-row block is refused."""

import json
import os
import subprocess
import sys
import unittest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=45, suite="cpu")

HERE = os.path.dirname(os.path.abspath(__file__))
TOL = 1e-6


def run_cases() -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, os.path.join(HERE, "fp8_gemm_cases.py")], env=env, capture_output=True,
                         text=True, timeout=600)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT_JSON:")]
    if out.returncode != 0 or not lines:
        raise AssertionError(f"interpreted run failed (rc {out.returncode}):\n{out.stdout[-3000:]}\n"
                             f"{out.stderr[-5000:]}")
    return json.loads(lines[-1][len("RESULT_JSON:"):])


class TestFp8BlockGemmInterpreted(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.r = run_cases()

    def test_activation_quantization_is_the_reference(self):
        cases = {k: v for k, v in self.r.items() if k.startswith("act_quant|")}
        self.assertEqual(len(cases), 3)
        for key, (same_fp8, scale_err) in cases.items():
            self.assertTrue(same_fp8, key)
            self.assertLessEqual(scale_err, 1e-6, key)

    def test_gemm_within_tolerance_and_wrong_scales_are_not(self):
        gemm = {k: v for k, v in self.r.items() if k.startswith("gemm|")}
        self.assertEqual(len(gemm), 6)
        for key, err in gemm.items():
            self.assertLessEqual(err, TOL, key)
        print("block fp8 GEMM max error / max |ref|: %.2e" % max(gemm.values()))
        for key, err in self.r.items():
            if key.startswith("sensitivity|"):
                self.assertGreater(err, 1e-2, key)

    def test_layers_load_their_shards_and_run_the_kernels(self):
        self.assertEqual(self.r["layer|methods"], [True, True, True])
        for name in ("QKVParallelLinear", "MergedColumnParallelLinear", "RowParallelLinear"):
            err, unloaded = self.r[f"layer|{name}"]
            self.assertLessEqual(err, TOL, name)
            self.assertIsNone(unloaded, name)
        self.assertIn("inside an fp8 block of 128", self.r["layer|ragged_refused"])


if __name__ == "__main__":
    unittest.main()
