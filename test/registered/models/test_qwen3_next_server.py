"""Qwen3-Next behind the HTTP server, through the real openai client: test_qwen3_next_engine's random checkpoint (2
Gated DeltaNet + 2 gated full-attention layers, routed + shared experts) with the SmolLM2 tokenizer, started with a
1 GB memory budget so the plan sizes the pools, and 5-token prefill chunks. Against HF transformers' fp32 greedy
tokens on the same checkpoint (its generate: chunked delta rule over the prompt, then recurrent steps): 8 prompts in
one batched completion. `sglang plan` with the same flags predicts the start's KV tokens within 3% and its state slots
exactly; /server_info shows the state pool (bytes per slot == config.json's count == the plan's term per slot, on
every rank's allocation) and that prefix caching is off, with the reason. A bad field is a 400 naming it and the
server keeps serving."""

import contextlib
import io
import json
import os
import tempfile
import unittest

import requests
import torch

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import default_model_dir
from sglang.test.test_utils import openai_client, popen_launch_server
from sglang.test.windowed_server_checks import WindowedServerChecks, random_ids

from test_qwen3_next_engine import make_qwen3_next, state_bytes_per_slot  # noqa: E402 (the same directory)

register_cpu_ci(est_time=75, suite="cpu")

CHUNK = 5
KV_TOKENS_TOLERANCE = 0.03
START_FLAGS = ["--dtype", "float32", "--max-total-memory-gb", "1", "--chunked-prefill-size", str(CHUNK)]


def plan_dry_run(path: str) -> dict:
    """`sglang plan --json` with the server's flags: the plan it would start with."""
    from sglang.cli.plan import main as plan_main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        status = plan_main(["--device", "cpu", "--model-path", path, *START_FLAGS, "--json"])
    out = json.loads(buf.getvalue())
    assert status == 0, out
    return out["plan"]


class TestQwen3NextServer(WindowedServerChecks, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from transformers import AutoTokenizer

        cls.tmp = tempfile.TemporaryDirectory()
        cls.tok = AutoTokenizer.from_pretrained(default_model_dir())
        torch.manual_seed(5)
        cls.hf = make_qwen3_next(vocab_size=(len(cls.tok) + 63) // 64 * 64)
        cls.path = os.path.join(cls.tmp.name, "model")
        cls.hf.save_pretrained(cls.path)
        cls.tok.save_pretrained(cls.path)
        cls.vocab = cls.hf.config.vocab_size
        cls.server = popen_launch_server(cls.path, other_args=[*START_FLAGS, "--random-seed", "0"])
        cls.client = openai_client(cls.server.base_url, timeout=120)
        cls.model = cls.client.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        cls.server.kill()
        cls.tmp.cleanup()

    def server_info(self) -> dict:
        return requests.get(f"{self.server.base_url}/server_info", timeout=30).json()

    def test_eight_prompts_in_chunks_equal_hf(self):
        prompts = [random_ids(1, 9 + 4 * i, seed=i, vocab=self.vocab)[0] for i in range(8)]
        out = self.client.completions.create(model=self.model, prompt=prompts, max_tokens=8, temperature=0,
                                             extra_body={"ignore_eos": True, "skip_special_tokens": False})
        texts = [c.text for c in sorted(out.choices, key=lambda c: c.index)]
        self.assertEqual(texts, [self.tok.decode(self.hf_greedy(p, 8)) for p in prompts])

    def test_plan_predicts_the_start_and_its_state_pool(self):
        info = self.server_info()
        served, kv = info["memory_plan"], info["kv_cache"]
        per_slot = state_bytes_per_slot(self.path)  # tp=1: the whole count on the one rank
        self.assertEqual(kv["state_bytes_per_slot"], per_slot)
        self.assertEqual(kv["state_slots"], served["state_slots"])
        self.assertEqual(kv["state_layers"], 2)
        terms = {t["name"]: t["num_bytes"] for t in served["terms"]}
        self.assertEqual(terms["linear_state"], per_slot * served["state_slots"])
        for rank in info["memory_plan_per_rank"]:
            self.assertEqual(rank["allocated_bytes"]["linear_state"], terms["linear_state"])
        planned = plan_dry_run(self.path)
        tokens = served["max_total_num_tokens"]
        self.assertLessEqual(abs(planned["max_total_num_tokens"] - tokens), KV_TOKENS_TOLERANCE * tokens,
                             (planned["max_total_num_tokens"], tokens))
        self.assertEqual(planned["state_slots"], served["state_slots"])
        print(f"Qwen3-Next tp=1: plan {planned['max_total_num_tokens']} KV tokens / start {tokens} "
              f"({(planned['max_total_num_tokens'] - tokens) / tokens:+.2%}), {served['state_slots']} state slots of "
              f"{per_slot:,} B")

    def test_prefix_caching_is_off_with_the_reason(self):
        cache = self.server_info()["prefix_cache"]
        self.assertFalse(cache["enabled"])
        self.assertIn("recurrent state", cache["reason"])

    def test_bad_field_is_a_400_and_the_server_keeps_serving(self):
        self.check_bad_field()


if __name__ == "__main__":
    unittest.main()
