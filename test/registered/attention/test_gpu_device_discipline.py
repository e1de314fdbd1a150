"""GPU counterpart of test/registered/engine/test_device_discipline.py: on a real device, per attention backend of the platform (with CUDA
graphs where the backend has them), structured output gives outputs its grammar accepts, and a decode step reads the
device from the host at most once -- counted by torch.cuda.set_sync_debug_mode("warn"), which warns on every
synchronizing call. What differs from the CPU harness (meta stand-in) shows up here."""

import contextlib
import json
import unittest
import warnings

import torch
from backend_fixtures import for_each_platform_backend

import sglang
from sglang.test.ci.ci_register import register_amd_ci, register_cuda_ci
from sglang.test.gpu_backends import ENGINE_KW, free_gpu_memory, requires_gpu

register_cuda_ci(est_time=150, suite="stage-a-test-1-gpu")
register_amd_ci(est_time=150, suite="stage-a-test-1-gpu-amd")

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"}}, "required": ["name", "age"]}
DECODE_SYNC_BUDGET = 1  # the sampled tokens with their logprobs


def _engine(backend: str):
    return sglang.Engine(attention_backend=backend, dtype="bfloat16", **ENGINE_KW)


def _syncs_per_decode_step(engine, count_syncs, num_steps: int = 6) -> list:
    """What count_syncs() (a context manager yielding a list) collects during each of num_steps decode steps of a
    mixed batch: greedy, top-p, penalties with min-p and a seed."""
    sched = engine.scheduler
    sampling = [{"max_new_tokens": 64, "temperature": 0, "ignore_eos": True},
                {"max_new_tokens": 64, "temperature": 0.8, "top_p": 0.9, "ignore_eos": True},
                {"max_new_tokens": 64, "temperature": 0.7, "repetition_penalty": 1.1, "frequency_penalty": 0.3,
                 "min_p": 0.05, "seed": 3, "ignore_eos": True}]
    batch = engine._build({"text": [f"Count from {i} upwards:" for i in range(len(sampling))],
                           "sampling_params": sampling})
    engine._submit(batch.reqs)  # queued; the steps below run them
    while sched.waiting_queue or sched.chunked_req is not None:
        sched.step()  # the prefills
    counts = []
    for _ in range(num_steps):
        with count_syncs() as syncs:
            sched.step()
        counts.append(syncs)
    return counts


@contextlib.contextmanager
def cuda_sync_warnings():
    """The messages torch.cuda.set_sync_debug_mode("warn") emits, one per synchronizing call."""
    found = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield found
        finally:
            torch.cuda.set_sync_debug_mode("default")
    found += [str(w.message)[:300] for w in caught if "synchroniz" in str(w.message).lower()]


@requires_gpu()
class TestDeviceDisciplineGpu(unittest.TestCase):
    def test_structured_output_per_backend(self):
        for_each_platform_backend(self, self.check_structured_output)

    def check_structured_output(self, backend: str):
        engine = _engine(backend)
        try:
            outs = engine.generate(["Give me a person:", "Another person:"],
                                   {"max_new_tokens": 64, "temperature": 0, "json_schema": json.dumps(SCHEMA)})
            for o in outs:
                value = json.loads(o["text"])
                self.assertEqual(set(value), {"name", "age"})
            out = engine.generate("Answer yes or no:", {"max_new_tokens": 8, "temperature": 0.5, "regex": "(yes|no)"})
            self.assertRegex(out["text"], r"^(yes|no)$")
        finally:
            engine.shutdown()
            free_gpu_memory()

    def test_decode_step_sync_budget(self):
        for_each_platform_backend(self, self.check_sync_budget)

    def check_sync_budget(self, backend: str):
        engine = _engine(backend)
        try:
            counts = _syncs_per_decode_step(engine, cuda_sync_warnings)
        finally:
            engine.shutdown()
            free_gpu_memory()
        self.assertTrue(all(len(c) <= DECODE_SYNC_BUDGET for c in counts), counts)


if __name__ == "__main__":
    unittest.main()
