"""`sglang plan` accepts and refuses what a start accepts and refuses, with the same message: the settings are
resolved once (configs/resolved.py). The server side is what a start runs before any weight loads:
ModelConfig.from_server_args (ModelRunner, so the Engine and `sglang serve`) for --context-length, and
launch/tp_config.check_tp_config (before any TP rank starts) for --tp-size."""

import contextlib
import io
import json
import os
import tempfile
import unittest
from unittest import mock

from sglang.cli.plan import main, run
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.mem_plan.arch_spec import PLANNED_NOT_SERVED
from sglang.srt.model_loader import resolve_model_path
from sglang.srt.server_args import ServerArgs
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=14, suite="cpu")

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


class TestArchitectureRefusals(unittest.TestCase):
    """mem_plan/arch_registry.py: a model_type the planner does not declare is refused by the plan (exit 2, the
    message, no traceback) and by a start with the same words; one it plans but this runtime does not serve is
    planned with arch_spec.PLANNED_NOT_SERVED among the notes, and a start refuses it with that note, before any
    weight loads."""

    def test_unknown_model_type(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(FIXTURES, "llama-3.1-8b", "config.json")) as f:
                cfg = dict(json.load(f), model_type="made_up_arch", architectures=["MadeUpForCausalLM"])
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(cfg, f)
            err = io.StringIO()
            with contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as exit_:
                main(["--model-path", d, "--gpu", "h100-80gb", "--json"])
            self.assertEqual(exit_.exception.code, 2)
            self.assertNotIn("Traceback", err.getvalue())
            # one line, no usage block: the flags were right, the model is what the planner does not know
            self.assertEqual(err.getvalue().count("\n"), 1, err.getvalue())
            self.assertTrue(err.getvalue().startswith("sglang plan: error: model_type 'made_up_arch'"))
            plan = plan_outcome(["--model-path", d, "--gpu", "h100-80gb"])
            server = server_outcome(d, device="cuda")
        print(f"unknown model_type: plan {plan}, server {server}")
        self.assertEqual(plan, server)
        self.assertIn("'made_up_arch'", plan[1])
        known = plan[1].rpartition("It knows: ")[2].rstrip(".").split(", ")
        self.assertEqual(known, sorted(known))
        self.assertTrue({"llama", "qwen3_moe", "gemma3_text", "deepseek_v3", "mistral"} <= set(known), known)

    def test_planned_but_not_served(self):
        model_dir = os.path.join(FIXTURES, "granite-3.1-8b-instruct")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            status = main(["--model-path", model_dir, "--gpu", "h100-80gb", "--json"])
        self.assertEqual(status, 0)
        note = f"{PLANNED_NOT_SERVED}: granite"
        self.assertIn(note, json.loads(out.getvalue())["plan"]["notes"])
        _, message = server_outcome(model_dir, device="cuda")
        print(f"granite: server {message}")
        self.assertTrue(message.startswith(note), message)
        # a served architecture plans without the note and starts past its config; Mistral with its sliding layers
        # too (mem_plan/arch_registry.SERVED_WITH_WINDOWS: its model masks each layer's window)
        for served in (QWEN, os.path.join(FIXTURES, "mistral-7b-v0.1")):
            with contextlib.redirect_stdout(io.StringIO()) as out:
                main(["--model-path", served, "--gpu", "h100-80gb", "--json"])
            self.assertFalse([n for n in json.loads(out.getvalue())["plan"]["notes"] if PLANNED_NOT_SERVED in n])
            self.assertEqual(server_outcome(served, device="cuda")[1], None)

    def test_served_architecture_with_sliding_layers(self):
        """Qwen2 is served, but this runtime's models attend over the whole context: a config whose layers slide is
        planned with its windows and the note, and a start refuses it instead of allocating a different pool."""
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(FIXTURES, "qwen2.5-7b-instruct", "config.json")) as f:
                cfg = dict(json.load(f), use_sliding_window=True, max_window_layers=20, sliding_window=4096)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(cfg, f)
            with contextlib.redirect_stdout(io.StringIO()) as out:
                self.assertEqual(main(["--model-path", d, "--gpu", "h100-80gb", "--json"]), 0)
            note = f"{PLANNED_NOT_SERVED}: qwen2 with sliding layers"
            self.assertIn(note, json.loads(out.getvalue())["plan"]["notes"])
            _, message = server_outcome(d, device="cuda")
        self.assertTrue(message.startswith(note), message)


if __name__ == "__main__":
    unittest.main()
