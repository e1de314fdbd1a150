"""GPU variant of the Triton backend engine tests: --attention-backend triton against torch_native through
sglang.Engine on the GPU in fp32 -- the default model (same greedy tokens), and the random-weight Qwen3 with a
mixed-length batch and cached-prefix (radix hit) requests at page sizes 1 and 16. CUDA graphs are off here, so the
eager Triton path is what is compared. Skips without a GPU (fails instead inside a GPU suite)."""

import unittest

from interpreted_run import run_engine

from sglang.test.ci.ci_register import register_amd_ci, register_cuda_ci
from sglang.test.engine_fixtures import PROMPTS, make_random_qwen3
from sglang.test.gpu_backends import requires_gpu

register_cuda_ci(est_time=120, suite="stage-a-test-1-gpu")
register_amd_ci(est_time=120, suite="stage-a-test-1-gpu-amd")

MAX_NEW = 16
GPU_KW = dict(max_total_memory_gb=8, disable_cuda_graph=True)


def ids_of(result):
    return [[o["output_ids"] for o in batch] for batch in result["outputs"]]


# the CPU variants run the Triton interpreter: test_triton_backend_engine.py, test_triton_backend_default_model.py
@requires_gpu()
class TestTritonBackendGpu(unittest.TestCase):
    def test_default_model_fp32_greedy(self):
        ref = run_engine(None, "torch_native", GPU_KW, [PROMPTS], MAX_NEW)
        got = run_engine(None, "triton", GPU_KW, [PROMPTS], MAX_NEW)
        self.assertEqual(ids_of(got), ids_of(ref))
        self.assertEqual(got["num_retractions"], 0)

    def test_random_qwen3_mixed_and_prefix(self):
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            path = make_random_qwen3(tmp + "/m")
            shared = [(i * 11) % 400 + 3 for i in range(70)]
            mixed = [[5, 17, 300, 42, 9], [7] * 12, [(i * 37) % 500 + 2 for i in range(300)]]
            batches = [mixed, [shared], [shared + [9, 8, 7]], [shared + list(range(30, 60))]]
            kw = dict(GPU_KW, skip_tokenizer_init=True)
            ref = run_engine(path, "torch_native", kw, batches, MAX_NEW)
            for page_size in (1, 16):
                with self.subTest(page_size=page_size):
                    got = run_engine(path, "triton", dict(kw, page_size=page_size), batches, MAX_NEW)
                    self.assertEqual(ids_of(got), ids_of(ref))
                    self.assertGreater(got["outputs"][2][0]["cached_tokens"], 0)


if __name__ == "__main__":
    unittest.main()
