"""Windowed attention layers (sliding window, attention sinks, logit cap) through the attention backends, against a
brute-force fp64 reference (window_cases.py): a hybrid pool whose windowed layers live in their own buffer behind a
non-identity slot map (Gemma 3 / gpt-oss) and a windowed-only pool (Mistral); positions the window left behind
read as NaN, so reading one of them fails. Prompts 3x the window, chunked prefill across the window edge, a cached
prefix, mixed decode, page sizes 1 and 4; and the same over the real SWAKVPool and its allocators (swa_pool.py,
swa_allocator.py), whose freed windowed pages are handed out again. Triton runs under the interpreter in a child
process (interpreted_run.py says why). FlashInfer runs through the stand-in library (its wrappers made to honour window_left and sinks: wiring,
not flashinfer's numerics), bf16. What is not wired is refused with a message naming the way out (FlashInfer: a
logit cap, a full-pool window shorter than the context, CUDA graphs; AITER: any windowed layer or sink)."""

import os
import subprocess
import sys
import unittest

import torch
from window_cases import (HYBRID_LAYERS, RESULT_PREFIX, WINDOW, WINDOWED_ONLY_LAYERS, FakeWindowedPool,
                          WindowScenario, all_cases, make_windowed_flashinfer, run_scenario)

from sglang.jit_kernel.cpu_ops import get_ops_for_dtype
from sglang.srt.layers.attention.attention_registry import create_attention_backend
from sglang.srt.layers.attention.window_metadata import build_window_table, window_start
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.test.attention_standins import install, make_aiter
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="cpu")

HERE = os.path.dirname(os.path.abspath(__file__))
TOL_FP32 = 1e-4
BF16_TOL = 2e-2  # the stand-in rounds an fp64 result to bf16: one ulp at |out| ~ 2; a wrong key set is off by O(1)
GPT_OSS_LAYERS = [(0, False, True, 0.0), (WINDOW, True, True, 0.0), (WINDOW, True, False, 0.0)]


def run_interpreted(backend: str) -> dict:
    import json

    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, os.path.join(HERE, "window_cases.py"), backend], env=env, cwd=HERE,
                         capture_output=True, text=True, timeout=900)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if out.returncode != 0 or not lines:
        raise AssertionError(f"interpreted run failed (rc {out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}")
    return json.loads(lines[-1][len(RESULT_PREFIX):])


class TestWindowTables(unittest.TestCase):
    def test_key_ranges_and_translation(self):
        """Each request's slice is req_to_token[row, max(0, first - W + 1):seq_len], and windowed_slots maps it
        through the pool's map."""
        pool = FakeWindowedPool(1, torch.float32, 2, 16, [1], 2, windowed_only=False)
        r2t = ReqToTokenPool(3, 64)
        r2t.req_to_token[1, :40] = torch.arange(100, 140)
        r2t.req_to_token[2, :9] = torch.arange(200, 209)
        rows, first, seq = torch.tensor([2, 1]), [3, 30], [9, 31]
        t = build_window_table(5, r2t.req_to_token, rows, first, seq, pool)
        self.assertEqual(t.starts, [0, 26])
        self.assertEqual(t.request_slots(0, t.token_slots).tolist(), list(range(200, 209)))
        self.assertEqual(t.request_slots(1, t.token_slots).tolist(), list(range(126, 131)))
        self.assertEqual(t.windowed_slots.tolist(), pool.slot_map[t.token_slots].tolist())
        self.assertNotEqual(t.windowed_slots.tolist(), t.token_slots.tolist())
        self.assertIs(t.slots_for(0), t.token_slots)  # a layer in the full pool reads token-pool slots
        self.assertEqual(window_start(30, 0), 0)


class TestTorchNativeWindow(unittest.TestCase):
    def test_every_case_within_tolerance(self):
        errors = all_cases("torch_native")
        self.assertEqual(len(errors), 6)
        for case, err in errors.items():
            with self.subTest(case=case):
                self.assertLessEqual(err, TOL_FP32, f"{case}: max abs error {err:.3g}")

    def test_cpu_kernel_path(self):
        """bf16 with a head dim the CPU kernels are built for: the windowed layers go through sgl-kernel's
        decode / extend attention with the window, the sinks, the cap and the slot map (cpu_kernel_ops.WINDOW_KERNELS)."""
        if get_ops_for_dtype(torch.bfloat16) is None:
            self.skipTest("no bf16 CPU kernels at this CPU level")
        sc = WindowScenario("torch_native", HYBRID_LAYERS, False, 1, dtype=torch.bfloat16, head_dim=32)
        self.assertIsNotNone(sc.backend.windowed.kernel_ops)
        for page_size in (1, 4):
            for name, layers, only in (("hybrid", HYBRID_LAYERS, False), ("windowed_only", WINDOWED_ONLY_LAYERS, True)):
                with self.subTest(page_size=page_size, case=name):
                    err = run_scenario("torch_native", layers, only, page_size, dtype=torch.bfloat16, head_dim=32)
                    self.assertLessEqual(err, BF16_TOL)

    def test_layers_cover_the_features(self):
        """The hybrid case holds a sink layer without a window, a windowed sink layer, a capped windowed layer and a
        window priced full (in the full pool): what gpt-oss, Gemma 2/3 and Ministral need."""
        kinds = {(w > 0, pooled, s, cap > 0) for w, pooled, s, cap in HYBRID_LAYERS}
        self.assertEqual(kinds, {(False, False, True, False), (True, True, True, False), (True, True, False, True),
                                 (True, False, False, False)})


class TestTritonWindowInterpreted(unittest.TestCase):
    def test_every_case_within_tolerance(self):
        errors = run_interpreted("triton")
        # FlashInfer's windowed page table on a GPU comes from the page-id kernel: each request from its first page,
        # through the slot map
        self.assertEqual(errors.pop("page_ids_mismatches"), 0)
        self.assertEqual(len(errors), 6)
        for case, err in errors.items():
            with self.subTest(case=case):
                self.assertLessEqual(err, TOL_FP32, f"{case}: max abs error {err:.3g}")


class TestFlashInferWindowWiring(unittest.TestCase):
    def test_outputs_match_reference(self):
        with install(make_windowed_flashinfer()):
            for page_size in (1, 4):
                for name, layers, only in (("gpt_oss", GPT_OSS_LAYERS, False), ("windowed_only", WINDOWED_ONLY_LAYERS, True)):
                    with self.subTest(page_size=page_size, case=name):
                        err = run_scenario("flashinfer", layers, only, page_size, dtype=torch.bfloat16, num_wrappers=2)
                        self.assertLessEqual(err, BF16_TOL)

    def step_error(self, layers, **kw):
        sc = WindowScenario("flashinfer", layers, False, 1, dtype=torch.bfloat16, **kw)
        sc.step([sc.new_request()], [3])

    def test_unwired_layers_refused(self):
        with install(make_windowed_flashinfer()):
            with self.assertRaisesRegex(NotImplementedError, "caps its logits.*--attention-backend triton"):
                self.step_error([(WINDOW, True, False, 1.5)], num_wrappers=2)
            with self.assertRaisesRegex(NotImplementedError, "window lives in the full pool.*--attention-backend"):
                self.step_error([(6, False, False, 0.0)], num_wrappers=2)
            with self.assertRaisesRegex(NotImplementedError, "declared 1 wrapper"):
                self.step_error([(WINDOW, True, False, 0.0)], num_wrappers=1)

    def test_cuda_graphs_refused_at_start(self):
        with install(make_windowed_flashinfer()):
            with self.assertRaisesRegex(ValueError, "--disable-cuda-graph"):
                WindowScenario("flashinfer", GPT_OSS_LAYERS, False, 1, dtype=torch.bfloat16, num_wrappers=2,
                               graph_bs=2)


class TestAiterRefusesWindows(unittest.TestCase):
    def test_windowed_pool_refused_at_start(self):
        sc = WindowScenario("torch_native", GPT_OSS_LAYERS, False, 1, dtype=torch.bfloat16)
        with install(make_aiter()):
            with self.assertRaisesRegex(ValueError, "sliding-window layers.*--attention-backend triton"):
                create_attention_backend("aiter", inputs=sc.backend_inputs, model_config=sc.backend.model_config,
                                         req_to_token_pool=sc.r2t, token_to_kv_pool=sc.pool, device="cpu")


if __name__ == "__main__":
    unittest.main()
