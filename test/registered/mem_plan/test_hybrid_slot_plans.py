"""The zoo's hybrid models planned as `sglang plan` plans them (issue 40): the exact balance cap (slots.py),
windowed layers whose window reaches the context priced full, and a model without full layers whose windowed pool is
its token pool (layer_pools.py).

References: the plan of the same inputs with the slot rule the cap replaced (no cap at all), a copy of the published
config with its sliding window removed, and byte counts written by hand from the published configs.
"""

import argparse
import dataclasses
import json
import os
import tempfile
import unittest

from sglang.cli.plan import device_facts, model_facts, parse_args, plan_inputs
from sglang.cli.plan import run as plan_run
from sglang.srt.configs.resolved import plan_backend
from sglang.srt.mem_plan import plan_memory
from sglang.srt.mem_plan import planner as P
from sglang.srt.mem_plan.gpu_presets import get_gpu_preset
from sglang.srt.mem_plan.layer_pools import NO_LAYER_POOLS, split_kv_cell
from sglang.srt.mem_plan.model_shapes import model_shape_from_path
from sglang.srt.mem_plan.slots import SlotRule
from sglang.srt.mem_plan.specs import KVCellSpec
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=12, suite="cpu")

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
BF16 = 2


def cli_inputs(model_dir: str, gpu: str, *flags: str):
    """PlanInputs as `sglang plan --model-path DIR --gpu GPU` builds them (cli/plan.py's steps)."""
    sa, ns = parse_args(["--model-path", model_dir, "--gpu", gpu, *flags])
    ns = argparse.Namespace(**{**vars(ns), "gpu": gpu})  # one card, as cli/plan.run hands each card on
    sa = dataclasses.replace(sa, attention_backend=plan_backend(sa.attention_backend,
                                                                get_gpu_preset(gpu).platform).name)
    model, _ = model_facts(sa, "cuda")
    return plan_inputs(sa, ns, model, device_facts(sa, ns, model))


def cli_plan(model_dir: str, gpu: str, *flags: str) -> dict:
    _, result, _ = plan_run(["--model-path", model_dir, "--gpu", gpu, *flags])
    return result["plan"]


class TestGemma2(unittest.TestCase):
    """Gemma-2-9B: 21 sliding layers (window 4,096) beside 21 full ones at context 8,192, one cell for both: the
    windowed pool is never more than the full pool's tokens, so it can never outweigh it and no cap binds."""

    def test_slots_not_capped(self):
        inputs = cli_inputs(os.path.join(FIXTURES, "gemma-2-9b"), "h100-80gb")
        self.assertEqual(inputs.kv_cell_bytes, 21 * 8 * 256 * 2 * BF16)
        self.assertEqual(inputs.layer_pools.windowed_cell_bytes, inputs.kv_cell_bytes)
        plan = plan_memory(inputs)
        # the reference: the same resolved inputs solved with the first-context rule before any cap existed
        r = P._Resolved.of(inputs)
        uncapped = P._plan_auto(dataclasses.replace(r, rule=SlotRule(8192, kind="first-context")))
        self.assertEqual((plan.max_total_num_tokens, plan.max_running_requests),
                         (uncapped.max_total_num_tokens, uncapped.max_running_requests))
        self.assertEqual(plan.max_running_requests, 4096)  # the additive cap gave 43
        self.assertNotEqual(plan.slot_regime, "balance")
        self.assertEqual(plan.windowed_tokens, plan.max_total_num_tokens)  # T_w = T: the windows are the full pool
        self.assertEqual(cli_plan(os.path.join(FIXTURES, "gemma-2-9b"), "h100-80gb")["max_total_num_tokens"],
                         plan.max_total_num_tokens)


class TestWindowReachesContext(unittest.TestCase):
    """Ministral-8B: 27 sliding layers of window 32,768 at context 32,768 never drop a token: all-full, upstream's
    rule, the tokens of the same config with no sliding window at all."""

    MINISTRAL = os.path.join(FIXTURES, "ministral-8b-instruct-2410")

    def test_ministral_is_planned_all_full(self):
        with open(os.path.join(self.MINISTRAL, "config.json")) as f:
            cfg = json.load(f)
        self.assertEqual((cfg["sliding_window"], cfg["max_position_embeddings"]), (32768, 32768))
        no_window = {k: v for k, v in cfg.items() if k != "layer_types"} | {"sliding_window": None}
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(no_window, f)
            for gpu in ("h100-80gb", "mi300x"):
                plain, plan = cli_plan(d, gpu), cli_plan(self.MINISTRAL, gpu)
                self.assertEqual(plain["layer_kinds"], "")
                for key in ("max_total_num_tokens", "max_running_requests", "kv_cell_bytes", "slot_regime",
                            "windowed_tokens", "total_bytes"):
                    self.assertEqual(plan[key], plain[key], (gpu, key))
        self.assertEqual(plan["kv_cell_bytes"], 36 * 8 * 128 * 2 * BF16)
        self.assertEqual(plan["layer_kinds"], "9 full, 27 sliding (window >= context: full)")
        self.assertNotIn("kv_windowed", [t["name"] for t in plan["terms"]])
        _, _, text = plan_run(["--model-path", self.MINISTRAL, "--gpu", "h100-80gb"])
        self.assertIn("Layers: 9 full, 27 sliding (window >= context: full).", text)

    def test_the_bound_decides_with_its_page_slack(self):
        """A window W is priced full when W + 2 (page - 1) >= the context: one slot's windowed share would be a whole
        context. Below that it keeps its windowed pool."""
        text = model_shape_from_path(self.MINISTRAL).text
        cell = KVCellSpec(36, BF16, 8, 128)
        for ctx, page, as_full in ((32768, 1, True), (32769, 1, False), (32768 + 30, 16, True),
                                   (32768 + 31, 16, False), (None, 1, False)):
            full, pools = split_kv_cell(text, cell, 1, ctx, page)
            self.assertEqual(pools.sliding_layers, 0 if as_full else 27, (ctx, page))
            self.assertEqual(pools.sliding_as_full, 27 if as_full else 0)
            self.assertEqual(full.num_layers, 36 if as_full else 9)
            self.assertEqual(pools.per_slot_layers, not as_full)
        self.assertEqual(split_kv_cell(text, cell, 1, 32768)[0], cell)

    def test_chunked_layers_too(self):
        """Llama-4-Scout: 36 chunked layers (attention_chunk_size 8,192) beside 12 full: full at a context of 8,192."""
        text = model_shape_from_path(os.path.join(FIXTURES, "llama-4-scout-17b-16e")).text
        cell = KVCellSpec(48, BF16, 8, 128)
        self.assertEqual(text.attention_chunk_size, 8192)
        full, pools = split_kv_cell(text, cell, 1, 8192)
        self.assertEqual((full, pools.chunked_layers, pools.chunked_as_full), (cell, 0, 36))
        self.assertEqual(pools.describe_kinds(), "12 full, 36 chunked (chunk >= context: full)")
        full, pools = split_kv_cell(text, cell, 1, 8193)
        self.assertEqual((full.num_layers, pools.chunked_layers, pools.window_tokens), (12, 36, 8192))
        plan = cli_plan(os.path.join(FIXTURES, "llama-4-scout-17b-16e"), "mi300x", "--tp", "4",
                        "--context-length", "8192")
        self.assertEqual(plan["layer_kinds"], "12 full, 36 chunked (chunk >= context: full)")
        self.assertEqual(plan["windowed_tokens"], 0)

    def test_all_full_untouched(self):
        text = model_shape_from_path(os.path.join(FIXTURES, "llama-3.1-8b")).text
        cell = KVCellSpec(32, BF16, 8, 128)
        self.assertEqual(split_kv_cell(text, cell, 1, 4096, 16), (cell, NO_LAYER_POOLS))


class TestCapStillBinds(unittest.TestCase):
    def test_gemma3_27b_h100_one_full_context(self):
        """Gemma-3-27B (a windowed token 425,984 B, 5.2 x the full one's 81,920 B): the cap binds, and the first full
        context still comes before a second slot."""
        plan = cli_plan(os.path.join(FIXTURES, "gemma-3-27b-it"), "h100-80gb")
        T, R = plan["max_total_num_tokens"], plan["max_running_requests"]
        self.assertEqual((plan["kv_cell_bytes"], plan["windowed_cell_bytes"]), (81_920, 425_984))
        self.assertGreaterEqual(plan["full_context_requests"], 1)
        chunk = plan["chunked_prefill_size"]
        self.assertEqual(R, min(1 + (T - 131072) * 512 // 131072, (T * 81_920 // 425_984 - chunk) // 1024))
        self.assertLessEqual((R * 1024 + chunk) * 425_984, T * 81_920)

    def test_nemotron_h_8b_h100(self):
        """Nemotron-H-8B on an H100: 4 attention layers (8 KV heads x 128) and 24 Mamba-2 layers whose state per
        request is (conv: 128 heads x 64 + 2 x 8 groups x 128 channels, 3 columns, bf16) + (ssm: 128 x 64 x 128,
        fp32). No window: the cap is R x state <= T x cell, as the additive form had it (E2's plan: 1,906,484 tokens,
        305 slots, before the activation term grew with the Mamba projections)."""
        cell = 4 * 8 * 128 * 2 * BF16
        state = 24 * ((128 * 64 + 2 * 8 * 128) * 3 * BF16 + 128 * 64 * 128 * 4)
        self.assertEqual((cell, state), (16_384, 102_137_856))
        inputs = cli_inputs(os.path.join(FIXTURES, "nemotron-h-8b-base-8k"), "h100-80gb")
        plan = plan_memory(inputs)
        self.assertEqual((plan.kv_cell_bytes, plan.state_bytes_per_slot), (cell, state))
        T, R = plan.max_total_num_tokens, plan.max_running_requests
        self.assertEqual(R, T * cell // state)
        self.assertEqual(plan.slot_regime, "balance")
        self.assertEqual(plan.bytes_of("linear_state"), (R + 1) * state)
        self.assertLess(abs(T / 1_906_484 - 1), 0.02)
        self.assertLess(abs(R / 305 - 1), 0.02)
        more = plan_memory(dataclasses.replace(inputs, max_total_tokens=T + 1))  # and the solve is still exact
        self.assertEqual(more.max_total_num_tokens, T)


class TestNoFullLayer(unittest.TestCase):
    """Every layer sliding: the windowed pool is the token pool, and the slots follow upstream's rule with a request's
    most tokens in it, L = min(context, W + 2 (page - 1)), for the context (layer_pools.py)."""

    PHI3 = os.path.join(FIXTURES, "phi-3-mini-4k-instruct")  # window 2,047, context 4,096
    MISTRAL = os.path.join(FIXTURES, "mistral-7b-v0.1")  # window 4,096, context 32,768

    def test_phi3_mini_upstream_rule_at_the_window(self):
        plan = cli_plan(self.PHI3, "h100-80gb", "--max-total-tokens", "12000")
        L = min(4096, 2047 + 2 * (plan["page_size"] - 1))
        self.assertEqual((plan["has_full_pool"], plan["kv_cell_bytes"], plan["window_slot_tokens"]), (False, 0, L))
        self.assertEqual((plan["max_total_num_tokens"], plan["windowed_tokens"]), (12000, 12000))
        R = min(max(12000 * 512 // L, 2048), 4096, 12000 // 2)  # 3,001: at context 4,096 it would be the floor
        self.assertEqual((plan["max_running_requests"], plan["slot_regime"]), (R, "linear"))
        self.assertEqual(plan["full_context_requests"], min(R, 12000 // L))
        self.assertEqual(plan["limited_by"], "--max-total-tokens")

    def test_phi3_mini_auto_slots_as_upstream(self):
        result = plan_run(["--model-path", self.PHI3, "--gpu", "h100-80gb"])[1]
        plan = result["plan"]
        self.assertEqual(plan["max_running_requests"], result["upstream"]["max_running_requests"])
        self.assertEqual(plan["max_running_requests"], 4096)
        self.assertEqual(plan["windowed_tokens"], plan["max_total_num_tokens"])
        self.assertEqual(plan["full_context_requests"], plan["windowed_tokens"] // 2047)
        self.assertLess(plan["headroom_bytes"], plan["windowed_cell_bytes"])  # one more token would not fit

    def test_mistral_user_slots_bound_the_pool(self):
        """--max-running-requests 64: no set of 64 requests holds more than 64 x 4,096 + one forward's tokens, so the
        pool stops there though the budget buys more."""
        plan = cli_plan(self.MISTRAL, "h100-80gb", "--max-running-requests", "64")
        bound = 64 * 4096 + max(plan["chunked_prefill_size"], 64)
        self.assertEqual((plan["max_running_requests"], plan["max_total_num_tokens"]), (64, bound))
        self.assertEqual(plan["windowed_tokens"], bound)
        self.assertTrue(plan["limited_by"].startswith("the windowed bound"), plan["limited_by"])
        self.assertGreater(plan["headroom_bytes"], plan["windowed_cell_bytes"])
        self.assertEqual(plan["full_context_requests"], min(64, bound // 4096))


if __name__ == "__main__":
    unittest.main()
