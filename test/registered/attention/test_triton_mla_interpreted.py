"""The Triton MLA kernels and the Triton backend's MLA path under the Triton interpreter on CPU, against the EXPANDED
multi-head form in float64 (random W_UK / W_UV; triton_mla_cases.py): the absorbed decode (split-KV over the latent
rows, triton_ops/mla_decode.py) and the absorbed extend with a cached prefix (triton_ops/mla_extend.py), page sizes
1 and 16, mixed lengths, both tile sets and the GPU's heads / rows per program (these shapes then span several key
blocks, splits, query blocks and head blocks), fp32 and fp16; then TritonAttnBackend over the latent pool
(mem_cache/mla_pool.py) through prefill, extends over cached prefixes and decode steps (mla_backend_steps.py). The
work runs in a child process with TRITON_INTERPRET=1 (interpreted_run.py says why)."""

import json
import os
import subprocess
import sys
import unittest

import torch
from triton_mla_cases import DECODE_CASES, EXTEND_CASES, RESULT_PREFIX, TOL

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=90, suite="cpu")

HERE = os.path.dirname(os.path.abspath(__file__))
DTYPES = {str(d): d for d in TOL}


def run_interpreted(timeout_s: float = 600) -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, os.path.join(HERE, "triton_mla_cases.py")], env=env, capture_output=True,
                         text=True, timeout=timeout_s)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if out.returncode != 0 or not lines:
        raise AssertionError(f"interpreted run failed (rc {out.returncode}):\n{out.stdout[-3000:]}\n"
                             f"{out.stderr[-5000:]}")
    return json.loads(lines[-1][len(RESULT_PREFIX):])


class TestTritonMLAInterpreted(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.result = run_interpreted()

    def test_absorbed_kernels_equal_the_expanded_form(self):
        errors = {k: v for k, v in self.result["kernels"].items() if not k.startswith("broken")}
        # 2 tile sets x 2 dtypes x 2 page sizes x (decode + extend cases)
        self.assertEqual(len(errors), 2 * 2 * 2 * (len(DECODE_CASES) + len(EXTEND_CASES)))
        for key, err in errors.items():
            kind, tiles, dtype, page_size, case = key.split("|")
            with self.subTest(kind=kind, tiles=tiles, dtype=dtype, page_size=page_size, case=case):
                self.assertLessEqual(err, TOL[DTYPES[dtype]], f"{key}: max abs error {err:.3g}")

    def test_comparison_can_fail(self):
        """The kernels run with a wrong softmax scale are far outside the tolerance."""
        for key in ("broken|decode_scale", "broken|extend_scale"):
            self.assertGreater(self.result["kernels"][key], 1e-2, key)

    def test_backend_over_the_latent_pool(self):
        """Prefill, extends over cached prefixes, decode steps and a late request, through TritonAttnBackend; once
        more with the decode steps set up by its CUDA-graph hook (the graph workspace, every split launched)."""
        runs = dict(self.result["backend"])
        self.assertTrue(runs.pop("graph_workspace_written"))  # the graph decode used the planned graph workspace
        self.assertFalse(runs.pop("eager_workspace_written"))  # ... not the eager one
        self.assertEqual(set(runs), {f"{torch.float32}|1", f"{torch.float32}|16", f"{torch.float16}|16", "graph"})
        for key, step_errors in runs.items():
            dtype = torch.float32 if key == "graph" else DTYPES[key.split("|")[0]]
            for i, err in enumerate(step_errors):
                with self.subTest(run=key, step=i):
                    self.assertLessEqual(err, TOL[dtype])


if __name__ == "__main__":
    unittest.main()
