"""Quantized KV cache end to end through sglang.Engine (issue 23), the default model on CPU:

- plan == runtime for every format: the pool holds exactly the planned bytes, its cell is the hand-computed one
  (30 layers x 3 KV heads x the format's bytes per head: codes + every scale byte), /server_info's kv_cache reports
  it with the gain over bf16, and the served plan's pool is the dry run's (`sglang plan`) less what the measured
  terms took beyond their formulas, on the same budget;
- greedy outputs against the bf16 KV cache's: fp8 / int8 follow bf16 for the first tokens of every prompt, int4 for
  most, int2_hadamard still answers the factual prompt;
- with int4: chunked prefill gives exactly the tokens of a direct run of the same chunks over the same pool format
  (PagedForwardDriver on the engine's own weights); a cached prefix is hit and gives the same tokens twice; a pool
  too small for the batch forces retractions and every request still completes; pools intact afterwards;
- fp8 scales from a checkpoint: a tiny random Llama whose safetensors carry k_scale / v_scale tensors (per layer and
  per (layer, KV head)) starts with exactly those scales in the pool and in /server_info (no calibration), and its
  greedy tokens are a PagedForwardDriver's over an fp8 pool given the same scales by hand.
"""

import os
import tempfile
import unittest

import torch

from sglang import Engine
from sglang.srt.mem_plan import kv_quant
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import assert_idle_and_intact, shutdown

TIE_LOGIT = 0.25  # two bf16 steps of a logit near 16-32: a tie, not a different distribution

register_cpu_ci(est_time=30, suite="cpu")

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of"]
NEW_TOKENS = 12
PER_HEAD_BYTES = {"bfloat16": 256, "fp8_e4m3": 128, "fp8_e5m2": 128, "int8": 2 * (64 + 2), "int4": 2 * (32 + 4),
                  "int2_hadamard": (16 + 1) + (13 + 1)}  # d = 64: codes + scales, by hand
LAYERS, KV_HEADS = 30, 3


def greedy(engine, prompts=PROMPTS, n=NEW_TOKENS):
    outs = engine.generate(prompts, {"temperature": 0, "max_new_tokens": n, "ignore_eos": True})
    return [o["output_ids"] for o in outs], [o["text"] for o in outs]


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def dry_run_plan(fmt, cap_gb):
    from sglang.cli.plan import run

    status, result, _ = run(["--device", "cpu", "--max-total-memory-gb", str(cap_gb), "--kv-cache-dtype", fmt, "--json"])
    assert status == 0
    return result["plan"]


class TestKVQuantEngine(unittest.TestCase):
    CAP_GB = 1

    @classmethod
    def setUpClass(cls):
        engine = Engine(max_total_memory_gb=cls.CAP_GB, log_level="warning")
        try:
            cls.ref_ids, cls.ref_text = greedy(engine)
        finally:
            shutdown(engine)

    def check_plan_and_runtime(self, engine, fmt):
        runner = engine.scheduler.model_runner
        plan = runner.memory_plan
        info = engine.get_server_info()
        kv = info["kv_cache"]
        cell = LAYERS * KV_HEADS * PER_HEAD_BYTES[fmt]
        self.assertEqual(plan.kv_cell_bytes, cell)
        self.assertEqual(kv["bytes_per_token"], cell)
        self.assertEqual(kv["bf16_bytes_per_token"], LAYERS * KV_HEADS * 256)
        self.assertAlmostEqual(kv["capacity_gain_vs_bf16"], 256 / PER_HEAD_BYTES[fmt], places=3)
        fixed = LAYERS * KV_HEADS * {"fp8_e4m3": 8, "fp8_e5m2": 8, "int4": 64 * 4}.get(fmt, 0)  # scales, multipliers
        self.assertEqual(runner.token_to_kv_pool.mem_usage_bytes(), (plan.max_total_num_tokens + 1) * cell + fixed)
        self.assertEqual(plan.bytes_of("kv_cache"), runner.token_to_kv_pool.mem_usage_bytes())
        # the dry run on the same budget: its pool less what the measured terms took beyond their formulas
        planned = dry_run_plan(fmt, self.CAP_GB)
        self.assertEqual(planned["kv_cell_bytes"], cell)
        self.assertEqual(planned["kv_fixed_bytes"], fixed)
        want = {t["name"]: t["num_bytes"] for t in planned["terms"]}
        excess = sum(t.num_bytes - want[t.name] for t in plan.terms if t.name != "kv_cache")
        expected = planned["max_total_num_tokens"] - excess / cell
        self.assertLessEqual(abs(plan.max_total_num_tokens - expected), 2, (plan.max_total_num_tokens, expected))
        self.assertEqual(kv["quality_flag"], kv_quant.quality_flag(fmt) or None)
        return kv

    def run_format(self, fmt, min_prefix, min_prompts):
        engine = Engine(max_total_memory_gb=self.CAP_GB, kv_cache_dtype=fmt, log_level="warning")
        try:
            kv = self.check_plan_and_runtime(engine, fmt)
            ids, text = greedy(engine)
            prefixes = [common_prefix(a, b) for a, b in zip(ids, self.ref_ids)]
            print(f"\n{fmt}: {kv} prefixes shared with bf16 KV {prefixes}: {text}")
            self.assertGreaterEqual(sum(p >= min_prefix for p in prefixes), min_prompts, (prefixes, text, self.ref_text))
            assert_idle_and_intact(engine)
            return text, kv
        finally:
            shutdown(engine)

    def test_fp8_e4m3(self):
        _, kv = self.run_format("fp8_e4m3", 8, 3)
        self.assertIn("calibrated at startup", kv["scales"])
        lo, hi = kv["k_scale_range"]
        self.assertTrue(0 < lo < hi, kv)  # per-(layer, head) scales, not one constant

    def test_int8(self):
        self.run_format("int8", 8, 3)

    def test_int2_hadamard(self):
        text, _ = self.run_format("int2_hadamard", 1, 1)
        self.assertIn("Paris", text[0])


class TestInt4Behaviour(unittest.TestCase):
    """int4 under chunked prefill, prefix caching and retraction (one engine, a small pool)."""

    CHUNK = 64

    @classmethod
    def setUpClass(cls):
        cls.engine = Engine(kv_cache_dtype="int4", chunked_prefill_size=cls.CHUNK, max_total_tokens=768,
                            max_running_requests=8, log_level="warning")

    @classmethod
    def tearDownClass(cls):
        shutdown(cls.engine)

    def long_prompt_ids(self, seed, n=200):
        vocab = self.engine.scheduler.model_config.vocab_size
        return [(seed * 7919 + 31 * i) % (vocab - 100) + 50 for i in range(n)]

    def int4_driver(self):
        """PagedForwardDriver on the engine's weights over an int4 pool with the engine's calibrated multipliers."""
        from sglang.test.paged_forward import PagedForwardDriver

        runner = self.engine.scheduler.model_runner
        d = PagedForwardDriver(runner.model, runner.model_config, max_reqs=2, max_tokens=512, kv_format="int4")
        # the engine's calibrated key multipliers (none would be another format)
        self.assertFalse(torch.equal(runner.token_to_kv_pool.fixed["k_smooth"], d.kv_pool.fixed["k_smooth"]))
        d.kv_pool.fixed["k_smooth"].copy_(runner.token_to_kv_pool.fixed["k_smooth"])
        return d

    def test_chunked_prefill_equals_a_direct_chunked_run(self):
        prompt = self.long_prompt_ids(1)
        out = self.engine.generate(input_ids=[prompt], sampling_params={"temperature": 0, "max_new_tokens": 8,
                                                                        "ignore_eos": True})[0]
        d = self.int4_driver()
        row = d.new_request()
        for s in range(0, len(prompt), self.CHUNK):
            logits = d.extend([row], [prompt[s : s + self.CHUNK]])
        self.assert_driver_agrees(d, row, logits[0], out["output_ids"])
        assert_idle_and_intact(self.engine)

    def assert_driver_agrees(self, d, row, logits, tokens):
        """Each of the engine's greedy tokens is the driver's argmax over the same stored K/V, fed back step by step,
        up to a tie: bf16 logits one or two steps (1/8 near 16) apart, which two launches of SDPA over the same rows in
        different shapes (a 7- or 8-token chunk) can swap."""
        for i, tok in enumerate(tokens):
            logits = logits.float()
            self.assertGreaterEqual(float(logits[tok]), float(logits.max()) - TIE_LOGIT, (i, tokens, logits.topk(3)))
            logits = d.extend([row], [[tok]])[0]

    def test_plan_counts_the_calibrated_key_multipliers(self):
        runner = self.engine.scheduler.model_runner
        kv = self.engine.get_server_info()["kv_cache"]
        pool = runner.token_to_kv_pool
        self.assertEqual(kv["fixed_bytes"], LAYERS * KV_HEADS * 64 * 4)  # an fp32 key multiplier per channel and head
        self.assertEqual(runner.memory_plan.bytes_of("kv_cache"), pool.mem_usage_bytes())
        self.assertEqual(pool.mem_usage_bytes(), (runner.max_total_num_tokens + 1) * LAYERS * KV_HEADS
                         * PER_HEAD_BYTES["int4"] + kv["fixed_bytes"])
        self.assertIn("key multipliers calibrated at startup", kv["scales"])
        lo, hi = kv["k_smooth_range"]
        self.assertTrue(0 < lo < 1 < hi, kv)

    def test_prefix_cache_hit(self):
        prompt = self.long_prompt_ids(2)
        sp = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
        first, second, third = (self.engine.generate(input_ids=[prompt], sampling_params=sp)[0] for _ in range(3))
        self.assertGreaterEqual(second["meta_info"]["cached_tokens"], self.CHUNK)
        self.assertEqual(second["output_ids"], third["output_ids"])
        # the hit reads the first request's quantized prefix (its chunks' K/V) and prefills the rest over it: a direct
        # run of exactly that gives the same tokens (the first request itself attended its own fresh K/V inside each
        # chunk, so it may differ from the hit by quantization error)
        cached = second["meta_info"]["cached_tokens"]
        d = self.int4_driver()
        row = d.new_request()
        for s in range(0, cached, self.CHUNK):  # the first request's chunks, cut where the hit ends
            d.extend([row], [prompt[s : min(s + self.CHUNK, cached)]])
        self.assert_driver_agrees(d, row, d.extend([row], [prompt[cached:]])[0], second["output_ids"])
        assert_idle_and_intact(self.engine)

    def test_retraction_completes_every_request(self):
        sched = self.engine.scheduler
        before = sched.num_retractions
        # short prompts are all admitted at once; their decode then outgrows the pool: 8 x (24 + 100) > 768 tokens
        prompts = [self.long_prompt_ids(10 + i, 24) for i in range(8)]
        outs = self.engine.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": 100,
                                                                        "ignore_eos": True})
        self.assertTrue(all(len(o["output_ids"]) == 100 for o in outs))
        self.assertGreater(sched.num_retractions, before)
        assert_idle_and_intact(self.engine)


def make_llama_with_kv_scales(path, k_scale, v_scale):
    """A 2-layer random Llama (SmolLM2's tokenizer) whose checkpoint also holds model.layers.<i>.self_attn.k_scale /
    v_scale (k_scale[i], v_scale[i]: a scalar per layer or one per KV head)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from sglang.test.engine_fixtures import default_model_dir

    tok = AutoTokenizer.from_pretrained(default_model_dir())
    cfg = LlamaConfig(vocab_size=(len(tok) + 63) // 64 * 64, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      max_position_embeddings=512, tie_word_embeddings=False, eos_token_id=None,
                      bos_token_id=tok.bos_token_id, initializer_range=0.3)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    for i in range(2):
        tensors[f"model.layers.{i}.self_attn.k_scale"] = k_scale[i]
        tensors[f"model.layers.{i}.self_attn.v_scale"] = v_scale[i]
    save_file(tensors, file, metadata={"format": "pt"})


class TestFp8CheckpointScales(unittest.TestCase):
    def run_checkpoint(self, k_scale, v_scale):
        from sglang.test.paged_forward import PagedForwardDriver

        with tempfile.TemporaryDirectory() as tmp:
            make_llama_with_kv_scales(tmp, k_scale, v_scale)
            engine = Engine(model_path=tmp, kv_cache_dtype="fp8_e4m3", max_total_tokens=1024, log_level="warning")
            try:
                kv = engine.get_server_info()["kv_cache"]
                pool = engine.scheduler.model_runner.token_to_kv_pool
                want_k = torch.stack([s.reshape(-1) for s in k_scale]).float().expand(2, 2)
                want_v = torch.stack([s.reshape(-1) for s in v_scale]).float().expand(2, 2)
                self.assertEqual(kv["scales"], "checkpoint k_scale / v_scale, plain keys")
                self.assertEqual(kv["turned_parts"], [])  # the scales were measured on plain keys: none turned
                self.assertTrue(torch.equal(pool.fixed["k_scale"], want_k), pool.fixed["k_scale"])
                self.assertTrue(torch.equal(pool.fixed["v_scale"], want_v), pool.fixed["v_scale"])
                self.assertEqual(kv["k_scale_range"], [float(want_k.min()), float(want_k.max())])
                prompt = [(31 * i + 7) % 4000 + 20 for i in range(40)]
                out = engine.generate(input_ids=[prompt], sampling_params={"temperature": 0, "max_new_tokens": 8,
                                                                           "ignore_eos": True})[0]["output_ids"]
                runner = engine.scheduler.model_runner
                d = PagedForwardDriver(runner.model, runner.model_config, max_reqs=2, max_tokens=256,
                                       kv_format="fp8_e4m3")
                d.kv_pool.load_scales(want_k, want_v, "by hand", keys_turned=False)
                self.assertEqual(out, d.greedy(prompt, 8))
                assert_idle_and_intact(engine)
            finally:
                shutdown(engine)

    def test_per_layer_scales(self):
        # scales far from any calibration's (amax x 2 / 448): a calibrated pool would show other values
        self.run_checkpoint([torch.tensor(0.0125), torch.tensor(0.0375)], [torch.tensor(0.02), torch.tensor(0.005)])

    def test_per_head_scales(self):
        self.run_checkpoint([torch.tensor([0.01, 0.03]), torch.tensor([0.02, 0.04])],
                            [torch.tensor([0.015, 0.005]), torch.tensor([0.0075, 0.025])])


if __name__ == "__main__":
    unittest.main()
