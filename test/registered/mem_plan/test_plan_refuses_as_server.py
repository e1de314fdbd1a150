"""`sglang plan` accepts and refuses what a start accepts and refuses, with the same message: the settings are
resolved once (configs/resolved.py). The server side is what a start runs before any weight loads:
ModelConfig.from_server_args (ModelRunner, so the Engine and `sglang serve`) for --context-length, and
launch/tp_config.check_tp_config (before any TP rank starts) for --tp-size."""

import contextlib
import io
import os
import unittest
from unittest import mock

from sglang.cli.plan import run
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_loader import resolve_model_path
from sglang.srt.server_args import ServerArgs
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="cpu")

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
QWEN = os.path.join(FIXTURES, "qwen3-30b-a3b")  # max_position_embeddings 40960
ALLOW_LONGER_CONTEXT_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"


def plan_outcome(argv):
    """(context_len, None) when the dry run accepts the flags, else (None, its error message)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            _, result, _ = run(argv)
    except SystemExit:
        return None, err.getvalue().strip().rpartition("error: ")[2]
    return result["context_len"], None


def server_outcome(model_dir, **flags):
    """(context_len, None) when a start gets past its model config with these flags, else (None, its message)."""
    try:
        return ModelConfig.from_server_args(ServerArgs(**flags), model_dir).context_len, None
    except ValueError as e:
        return None, str(e)


def tp_outcome(tp_size):
    """(True, None) when a start of the bundled model on CPU takes --tp-size, else (None, its message)."""
    from sglang.srt.launch.tp_config import check_tp_config

    try:
        check_tp_config(ServerArgs(tp_size=tp_size, device="cpu"))
        return True, None
    except ValueError as e:
        return None, str(e)


class TestPlanRefusesAsServer(unittest.TestCase):
    def assert_same(self, plan_argv, model_dir, context_length, **flags):
        argv = plan_argv + ["--context-length", str(context_length)]
        plan, server = plan_outcome(argv), server_outcome(model_dir, context_length=context_length, **flags)
        print(f"--context-length {context_length}: plan {plan}, server {server}")
        self.assertEqual(plan, server)
        return plan

    def test_bundled_model_on_cpu(self):
        model_dir = resolve_model_path(ServerArgs())
        plan_argv = ["--device", "cpu", "--total-memory-gb", "4"]
        self.assertEqual(self.assert_same(plan_argv, model_dir, 4096), (4096, None))
        _, message = self.assert_same(plan_argv, model_dir, 10000)
        self.assertIn("max_position_embeddings=8192", message)

    def test_tp_size(self):
        """SmolLM2 has 9 attention heads and 3 KV heads: --tp-size 3 splits it, 2 does not."""
        for tp, want in ((3, True), (2, None)):
            plan = plan_outcome(["--device", "cpu", "--total-memory-gb", "4", "--tp-size", str(tp)])
            server = tp_outcome(tp)
            print(f"--tp-size {tp}: plan {plan}, server {server}")
            self.assertEqual(server[0], want)
            self.assertEqual((plan[0] is not None, plan[1]), (server[0] is not None, server[1]))

    def test_gpu_preset(self):
        plan_argv = ["--model-path", QWEN, "--gpu", "h100-80gb"]
        self.assertEqual(self.assert_same(plan_argv, QWEN, 40960, device="cuda"), (40960, None))
        _, message = self.assert_same(plan_argv, QWEN, 262144, device="cuda")
        self.assertIn(ALLOW_LONGER_CONTEXT_ENV, message)
        with mock.patch.dict(os.environ, {ALLOW_LONGER_CONTEXT_ENV: "1"}):  # both honour the override
            self.assertEqual(self.assert_same(plan_argv, QWEN, 262144, device="cuda"), (262144, None))


if __name__ == "__main__":
    unittest.main()
