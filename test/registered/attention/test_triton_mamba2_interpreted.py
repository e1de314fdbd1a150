"""The Triton Mamba-2 SSD kernels (triton_ops/mamba2_ssd.py: chunked extend, decode step) under the Triton
interpreter on CPU against the float64 token-by-token recurrence (mamba2_ssd_cases.py): a varlen batch at chunk sizes
below a tile, not a power of two and spanning several tiles; head / state widths that pad the dot tiles; dt_limit;
fp16 inputs; rows without an initial state that hold NaN; one request extended in two calls cut inside a chunk; and
decode steps. The work runs in a child process with TRITON_INTERPRET=1 (interpreted_run.py says why)."""

import json
import os
import subprocess
import sys
import unittest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=45, suite="cpu")

HERE = os.path.dirname(os.path.abspath(__file__))
TOL = {"fp32": 2e-5, "fp16": 2e-3}  # relative to the output's scale; a wrong A is off by > 1e-1


def run_interpreted(timeout_s: float = 600) -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, os.path.join(HERE, "triton_mamba2_cases.py")], env=env, cwd=HERE,
                         capture_output=True, text=True, timeout=timeout_s)
    prefix = "RESULT_JSON:"
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(prefix)]
    if out.returncode != 0 or not lines:
        raise AssertionError(f"interpreted run failed (rc {out.returncode}):\n{out.stdout[-3000:]}\n"
                             f"{out.stderr[-5000:]}")
    return json.loads(lines[-1][len(prefix):])


class TestTritonMamba2Interpreted(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.result = run_interpreted()

    def test_kernels_equal_the_fp64_recurrence(self):
        errors = {k: v for k, v in self.result.items() if not k.startswith("broken")}
        self.assertEqual(len(errors), 7)
        for key, err in errors.items():
            with self.subTest(case=key):
                self.assertLessEqual(err, TOL[key.split("|")[1]], f"{key}: relative error {err:.3g}")

    def test_comparison_can_fail(self):
        """The extend kernel run with a wrong A is far outside the tolerance."""
        self.assertGreater(self.result["broken|extend_A"], 1e-2)


if __name__ == "__main__":
    unittest.main()
