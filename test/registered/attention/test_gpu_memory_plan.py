"""GPU: the memory plan holds on a real device, for torch_native and each GPU backend. In a fresh process per
backend, a stress run (more concurrent long requests than the pool holds at once, so requests queue and the pool
fills) never reserves more device memory than the plan's total; the KV pool and the backend's buffers are exactly
the plan's kv_cache and declared attention_workspace bytes."""

import json
import subprocess
import sys
import unittest

from sglang.test.ci.ci_register import register_amd_ci, register_cuda_ci
from sglang.test.gpu_backends import HALF_ONLY_BACKENDS, platform_backends, require_library, requires_gpu

register_cuda_ci(est_time=150, suite="stage-a-test-1-gpu")
register_amd_ci(est_time=150, suite="stage-a-test-1-gpu-amd")

STRESS = """
import json, random, sys
import torch
import sglang

backend = sys.argv[1]
torch.cuda.reset_peak_memory_stats()
engine = sglang.Engine(attention_backend=backend, dtype="bfloat16", max_total_tokens=32768,
                       max_running_requests=48, log_level="warning")
runner = engine.scheduler.model_runner
plan = engine.get_server_info()["memory_plan"]
rng = random.Random(0)
vocab = engine.get_server_info()["vocab_size"]
# 96 requests of 400-1200 prompt tokens + 128 new tokens: ~85k tokens wanted against a 32k-token pool
prompts = [[rng.randrange(3, vocab) for _ in range(rng.randrange(400, 1200))] for _ in range(96)]
outs = engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 128, "temperature": 0,
                                                          "ignore_eos": True})
assert all(o["meta_info"]["completion_tokens"] == 128 for o in outs)
got = runner.allocated_bytes()
print("RESULT=" + json.dumps({
    "plan_total_bytes": plan["total_bytes"],
    "plan_kv_bytes": [t["num_bytes"] for t in plan["terms"] if t["name"] == "kv_cache"][0],
    "plan_workspace_bytes": [t["num_bytes"] for t in plan["terms"] if t["name"] == "attention_workspace"][0],
    "kv_bytes": got["kv_cache"],
    "workspace_persistent_bytes": got["attention_workspace_persistent"],
    "declared_persistent_bytes": runner.attn_backend.declared_persistent_bytes(),
    "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
}))
engine.shutdown()
"""


def stress(backend: str) -> dict:
    r = subprocess.run([sys.executable, "-c", STRESS, backend], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT=")][-1]
    return json.loads(line[len("RESULT="):])


@requires_gpu()
class TestGpuMemoryPlan(unittest.TestCase):
    def test_peak_within_plan_and_pools_exact(self):
        for backend in ["torch_native"] + platform_backends():
            with self.subTest(backend=backend):
                if backend != "torch_native":
                    require_library(backend)
                r = stress(backend)
                print(backend, json.dumps(r))
                self.assertLessEqual(r["peak_reserved_bytes"], r["plan_total_bytes"])
                self.assertEqual(r["kv_bytes"], r["plan_kv_bytes"])
                self.assertEqual(r["workspace_persistent_bytes"], r["declared_persistent_bytes"])
                self.assertLessEqual(r["declared_persistent_bytes"], r["plan_workspace_bytes"])
                if backend in HALF_ONLY_BACKENDS:  # their workspaces are real, sizeable terms
                    self.assertGreater(r["workspace_persistent_bytes"], 0)


if __name__ == "__main__":
    unittest.main()
