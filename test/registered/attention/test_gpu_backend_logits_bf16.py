"""GPU: the default model in bfloat16 with each backend stays close to torch_native in bfloat16: the top-5
log-probabilities of the first generated token agree within LOGPROB_TOL on the tokens both list, the top-1 token
is the same, and greedy continuations agree on most of their first tokens (bf16 rounding may flip a late near-tie)."""

import unittest

from backend_fixtures import engine_generate, for_each_platform_backend

from sglang.test.ci.ci_register import register_amd_ci, register_cuda_ci
from sglang.test.gpu_backends import PROMPTS, requires_gpu

register_cuda_ci(est_time=120, suite="stage-a-test-1-gpu")
register_amd_ci(est_time=120, suite="stage-a-test-1-gpu-amd")

LOGPROB_TOL = 0.25  # nats; bf16 logits of two attention kernels, measured in the CPU notes' range
MIN_SHARED_PREFIX_TOKENS = 4
MAX_NEW_TOKENS = 16


def run(backend: str) -> list:
    sampling = {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    return engine_generate(backend, "bfloat16", sampling, return_logprob=True, top_logprobs_num=5)


def shared_prefix(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@requires_gpu()
class TestGpuBackendLogitsBf16(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.reference = run("torch_native")

    def test_close_to_torch_native(self):
        for_each_platform_backend(self, self.check_close)

    def check_close(self, backend: str):
        for prompt, got, want in zip(PROMPTS, run(backend), self.reference):
            with self.subTest(prompt=prompt):
                top_got = {tid: lp for lp, tid, _ in got["meta_info"]["output_top_logprobs"][0]}
                top_want = {tid: lp for lp, tid, _ in want["meta_info"]["output_top_logprobs"][0]}
                shared = set(top_got) & set(top_want)
                self.assertGreaterEqual(len(shared), 3)
                self.assertLess(max(abs(top_got[t] - top_want[t]) for t in shared), LOGPROB_TOL)
                self.assertEqual(got["output_ids"][0], want["output_ids"][0])
                self.assertGreaterEqual(shared_prefix(got["output_ids"], want["output_ids"]),
                                        MIN_SHARED_PREFIX_TOKENS)


if __name__ == "__main__":
    unittest.main()
