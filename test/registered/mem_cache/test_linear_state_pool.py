"""The linear-state pool (mem_cache/linear_state_pool.py) and the runner's side of it (model_executor/linear_state.py).

- bytes: the pool built from a model's TextShape with plan.state_slots rows holds exactly the plan's linear_state term
  (`sglang plan`'s own inputs) for Qwen3-Next-80B-A3B, Nemotron-H-8B and Nemotron-3-Nano-30B-A3B's published configs,
  and its bytes per slot equal the per-layer state computed here from config.json's numbers by hand, at tp 1 and 2;
- layout: get(name, layer) is a contiguous [rows, units / tp, unit_elems] view in the tensor's dtype; writing one
  (layer, row) touches no other layer, row or tensor;
- the runner: a hybrid's KV pool holds its full-attention layers only, its request-slot pool gets the state pool
  (state_slots rows for the real one, the dummy + one row for scratch pools), allocated_bytes reports it at the plan's
  per-slot bytes; quantized KV and a model without full-attention layers are refused, naming why;
- the scheduler: prefix caching is off for a model with linear layers, with the reason /server_info shows.
"""

import argparse
import dataclasses
import json
import os
import types
import unittest

import torch

from sglang.cli.plan import device_facts, model_facts, parse_args, plan_inputs
from sglang.srt.configs.resolved import plan_backend, resolve_model
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.linear_state_pool import LinearStatePool, linear_state_pool, prefix_cache_off_reason
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_plan import plan_memory
from sglang.srt.mem_plan.arch_spec import StateTensor
from sglang.srt.mem_plan.gpu_presets import get_gpu_preset
from sglang.srt.mem_plan.model_shapes import model_shape_from_config
from sglang.srt.model_executor.linear_state import attach_linear_state
from sglang.srt.model_executor.model_runner_kv_cache_mixin import ModelRunnerKVCacheMixin
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="cpu")

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mem_plan", "fixtures")
BF16, FP32 = 2, 4


def _config(name: str) -> dict:
    with open(os.path.join(FIXTURES, name, "config.json")) as f:
        return json.load(f)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def qwen3_next_slot_bytes(cfg: dict, tp: int) -> int:
    """Per request slot, by hand: every layer but each full_attention_interval-th keeps conv inputs of the q, k (nk
    heads x 2 dk) and v (nv x dv) channels over K - 1 columns in bf16, and an nv x dk x dv fp32 recurrent state."""
    n_lin = sum(1 for i in range(cfg["num_hidden_layers"]) if (i + 1) % cfg["full_attention_interval"])
    nk, nv = cdiv(cfg["linear_num_key_heads"], tp), cdiv(cfg["linear_num_value_heads"], tp)
    dk, dv, k = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    return n_lin * ((nk * 2 * dk + nv * dv) * (k - 1) * BF16 + nv * dk * dv * FP32)


def nemotron_h_slot_bytes(cfg: dict, tp: int) -> int:
    """Per request slot, by hand: each "M" block keeps conv inputs of the x (nh x hd) and B, C (ng x 2 N) channels over
    K - 1 columns in bf16, and an nh x hd x N fp32 SSM state."""
    n_mamba = cfg["hybrid_override_pattern"].count("M")
    nh, ng = cdiv(cfg["mamba_num_heads"], tp), cdiv(cfg["n_groups"], tp)
    hd, n, k = cfg["mamba_head_dim"], cfg["ssm_state_size"], cfg["conv_kernel"]
    return n_mamba * ((nh * hd + ng * 2 * n) * (k - 1) * BF16 + nh * hd * n * FP32)


def cli_plan(model_dir: str, gpu: str, *flags: str):
    """The plan `sglang plan --model-path DIR --gpu GPU FLAGS` computes for one card."""
    sa, ns = parse_args(["--model-path", model_dir, "--gpu", gpu, *flags])
    ns = argparse.Namespace(**{**vars(ns), "gpu": gpu})
    sa = dataclasses.replace(sa, attention_backend=plan_backend(sa.attention_backend,
                                                                get_gpu_preset(gpu).platform).name)
    model, _ = model_facts(sa, "cuda")
    return plan_memory(plan_inputs(sa, ns, model, device_facts(sa, ns, model)))


class TestPoolBytes(unittest.TestCase):
    CASES = (("qwen3-next-80b-a3b-instruct", qwen3_next_slot_bytes, "h200", (2, 4)),
             ("nemotron-h-8b-base-8k", nemotron_h_slot_bytes, "h100-80gb", (1, 2)),
             ("nemotron-3-nano-30b-a3b", nemotron_h_slot_bytes, "h100-80gb", (1, 2)))

    def test_bytes_per_slot_by_hand_at_tp_1_and_2(self):
        for name, by_hand, _, _ in self.CASES:
            cfg = _config(name)
            text = model_shape_from_config(cfg).text
            for tp in (1, 2):
                pool = linear_state_pool(text, tp, 3, "meta")  # meta: shapes and bytes, no memory
                with self.subTest(name=name, tp=tp):
                    self.assertEqual(pool.bytes_per_slot(), by_hand(cfg, tp))
                    self.assertEqual(pool.mem_usage_bytes(), 3 * by_hand(cfg, tp))

    def test_pool_at_state_slots_is_the_plans_term(self):
        for name, by_hand, gpu, tps in self.CASES:
            path = os.path.join(FIXTURES, name)
            text = model_shape_from_config(_config(name)).text
            for tp in tps:
                plan = cli_plan(path, gpu, "--tp-size", str(tp))
                pool = linear_state_pool(text, tp, plan.state_slots, "meta")
                with self.subTest(name=name, tp=tp):
                    self.assertEqual(plan.state_slots, plan.max_running_requests + 1)
                    self.assertEqual(pool.num_rows, plan.state_slots)
                    self.assertEqual(pool.mem_usage_bytes(), plan.bytes_of("linear_state"))
                    self.assertEqual(pool.bytes_per_slot(), by_hand(_config(name), tp))


SMALL = (StateTensor("conv", 3, 2 * 3, "bfloat16"), StateTensor("rec", 5, 4 * 2, "float32"))


class TestPoolLayout(unittest.TestCase):
    def test_views_are_disjoint_per_tensor_layer_and_row(self):
        pool = LinearStatePool(SMALL, num_linear_layers=3, tp=2, num_rows=4)
        shapes = {"conv": (4, 2, 6), "rec": (4, 3, 8)}  # units ceil(3 / 2) = 2, ceil(5 / 2) = 3
        dtypes = {"conv": torch.bfloat16, "rec": torch.float32}
        for name in pool.names:
            for layer in range(3):
                view = pool.get(name, layer)
                self.assertEqual(tuple(view.shape), shapes[name])
                self.assertEqual(view.dtype, dtypes[name])
                self.assertTrue(view.is_contiguous())
                self.assertEqual(float(view.abs().sum()), 0.0)  # zero-filled
        ids = {}
        for t, name in enumerate(pool.names):
            for layer in range(3):
                for row in range(4):
                    ids[name, layer, row] = 1 + t * 100 + layer * 10 + row
                    pool.get(name, layer)[row].fill_(ids[name, layer, row])
        for (name, layer, row), v in ids.items():  # every element still holds what its own (layer, row) wrote
            self.assertTrue(bool((pool.buffers[name][layer, row] == v).all()), (name, layer, row))
        self.assertEqual(pool.mem_usage_bytes(), 3 * 4 * (2 * 6 * 2 + 3 * 8 * 4))
        self.assertEqual(pool.info(), {  # /server_info's kv_cache fields
            "state_bytes_per_slot": 3 * (2 * 6 * 2 + 3 * 8 * 4), "state_slots": 4, "state_layers": 3,
            "state_tensors": {"conv": {"shape": [2, 6], "dtype": "bfloat16"},
                              "rec": {"shape": [3, 8], "dtype": "float32"}}})

    def test_bad_lookups_name_what_exists(self):
        pool = LinearStatePool(SMALL, num_linear_layers=2, tp=1, num_rows=2)
        with self.assertRaisesRegex(KeyError, "conv.*rec"):
            pool.get("ssm", 0)
        with self.assertRaisesRegex(IndexError, "0..1"):
            pool.get("conv", 2)
        with self.assertRaisesRegex(ValueError, "dummy row"):
            LinearStatePool(SMALL, num_linear_layers=2, tp=1, num_rows=1)


# A small Qwen3-Next: 8 layers, every 4th full attention (6 linear + 2 full), fp32 so every state is 4-byte.
TINY_QWEN3_NEXT = dict(
    architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next", hidden_size=64, num_hidden_layers=8,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128, intermediate_size=64,
    max_position_embeddings=512, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
    linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
    shared_expert_intermediate_size=32, full_attention_interval=4, torch_dtype="float32")


class FakeRunner(ModelRunnerKVCacheMixin):
    """The mixin over a resolved config (no weights): what the pools are built from."""

    def __init__(self, cfg: dict, tp: int = 1, kv_cache_dtype: str = "auto"):
        facts = resolve_model(cfg, "cpu", kv_cache_dtype=kv_cache_dtype, planning=True)
        self.model_config = types.SimpleNamespace(
            facts=facts, shape=facts.shape, dtype_name=facts.dtype, kv_cache_dtype_name=facts.kv_cache_dtype,
            kv_cache_dtype=torch.float32, dtype=torch.float32, head_dim=cfg["head_dim"],
            num_hidden_layers=cfg["num_hidden_layers"])
        self.server_args = types.SimpleNamespace(tp_size=tp, page_size=1, attention_backend="torch_native")
        self.device, self.context_len = "cpu", 64


class TestRunnerPools(unittest.TestCase):
    def test_hybrid_pools(self):
        for tp in (1, 2):
            runner = FakeRunner(TINY_QWEN3_NEXT, tp)
            pools = runner.layer_pools()
            self.assertEqual((pools.full_layers, pools.linear_layers), (2, 6))
            # 6 linear layers of (q, k: 2 x 8 per key head; v: 8 per value head) x 3 columns + 4 x 8 x 8, all fp32
            by_hand = 6 * ((cdiv(2, tp) * 16 + cdiv(4, tp) * 8) * 3 * FP32 + cdiv(4, tp) * 64 * FP32)
            self.assertEqual(pools.state_bytes_per_slot, by_hand)
            r2t = ReqToTokenPool(5, 64)
            kv = runner._kv_pool(32, r2t, 0)
            self.assertEqual(kv.layer_num, 2)  # the full-attention layers only
            self.assertEqual(tuple(kv.k_buffer.shape), (2, 33, cdiv(2, tp), 16))
            attach_linear_state(runner, r2t, pools, 6)  # state_slots: 5 slots + the dummy
            runner.req_to_token_pool, runner.token_to_kv_pool = r2t, kv
            runner.attn_backend = types.SimpleNamespace(allocated_bytes=lambda: 0)
            self.assertEqual(runner.allocated_bytes()["linear_state"], 6 * pools.state_bytes_per_slot)
            self.assertEqual(r2t.linear_state.get("recurrent", 5).shape, (6, cdiv(4, tp), 64))
            self.check_allocation_and_info(runner, pools)
            scratch = ReqToTokenPool(8, 64)
            attach_linear_state(runner, scratch, pools)
            self.assertEqual(scratch.linear_state.num_rows, 2)  # the dummy row and the profile forward's request
            with self.assertRaisesRegex(ValueError, "state rows"):
                attach_linear_state(runner, ReqToTokenPool(2, 64), pools, 4)

    def check_allocation_and_info(self, runner, pools):
        """check_allocation holds the state pool to the plan's linear_state term; /server_info's kv_cache shows it."""
        got = runner.allocated_bytes()
        terms = dict(got, linear_state=6 * pools.state_bytes_per_slot, attention_workspace=0)
        runner.attn_backend.declared_persistent_bytes = lambda: 0
        runner.memory_plan = types.SimpleNamespace(bytes_of=terms.__getitem__, max_total_num_tokens=32,
                                                   kv_window_rows=0)
        runner.check_allocation()
        terms["linear_state"] += 1
        with self.assertRaises(AssertionError):
            runner.check_allocation()
        runner.token_to_kv_pool_allocator = TokenToKVPoolAllocator(32, 1)
        info = runner.kv_cache_info()
        self.assertEqual((info["state_bytes_per_slot"], info["state_slots"], info["state_layers"]),
                         (pools.state_bytes_per_slot, 6, 6))

    def test_dense_model_gets_no_state(self):
        cfg = dict(TINY_QWEN3_NEXT, architectures=["LlamaForCausalLM"], model_type="llama")
        runner = FakeRunner(cfg)
        r2t = ReqToTokenPool(2, 64)
        self.assertEqual(runner._kv_pool(16, r2t, 0).layer_num, 8)
        attach_linear_state(runner, r2t, runner.layer_pools())
        self.assertIsNone(r2t.linear_state)
        self.assertEqual(prefix_cache_off_reason(runner.model_config.shape.text), "")

    def test_refusals_name_the_reason(self):
        runner = FakeRunner(TINY_QWEN3_NEXT, kv_cache_dtype="fp8_e4m3")
        with self.assertRaisesRegex(ValueError, "--kv-cache-dtype fp8_e4m3 .*--kv-cache-dtype auto"):
            runner._kv_pool(16, ReqToTokenPool(2, 64), 0)
        all_linear = dict(TINY_QWEN3_NEXT, layer_types=["linear_attention"] * 8)
        with self.assertRaisesRegex(ValueError, "every layer keeps a linear state.*full-attention"):
            FakeRunner(all_linear)._kv_pool(16, ReqToTokenPool(2, 64), 0)


class TestPrefixCacheOff(unittest.TestCase):
    def reason(self, cfg: dict, **flags) -> str:
        sa = types.SimpleNamespace(**{"disable_radix_cache": False, "is_embedding": False, **flags})
        mc = types.SimpleNamespace(shape=model_shape_from_config(cfg))
        return Scheduler._prefix_cache_off_reason(types.SimpleNamespace(server_args=sa, model_config=mc))

    def test_linear_models_keep_no_prefix_cache(self):
        for name in ("qwen3-next-80b-a3b-instruct", "nemotron-h-8b-base-8k"):
            cfg = _config(name)
            self.assertEqual(self.reason(cfg), f"prefix caching is off: {cfg['model_type']} keeps per-request "
                             "recurrent state (linear attention / SSM layers); a prefix hit would need a state snapshot")

    def test_other_models_keep_it_unless_told(self):
        dense = dict(TINY_QWEN3_NEXT, architectures=["LlamaForCausalLM"], model_type="llama")
        self.assertEqual(self.reason(dense), "")
        self.assertEqual(self.reason(dense, disable_radix_cache=True), "--disable-radix-cache")


if __name__ == "__main__":
    unittest.main()
