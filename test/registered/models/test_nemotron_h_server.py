"""Nemotron-H behind the HTTP server, through the real openai client: test_nemotron_h_engine's random Mamba-2 hybrid
(blocks "M-M*-M") with the SmolLM2 tokenizer, 7-token prefill chunks and a 1 GB memory budget. Against HF
transformers' fp32 greedy tokens on the same checkpoint (one batched, left-padded generate): 8 prompts in one batched
completion, prefilled in chunks that cut through the conv window. A repeated prompt is no prefix hit (prefix caching
is off for a model with per-request state, /server_info says why) and still decodes HF's tokens. `sglang plan` with
the server's flags predicts its start: KV tokens within 3%, the same state slots and state bytes per slot, and the
linear_state term exactly. A bad field is a 400 naming it and the server keeps serving."""

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
from sglang.test.hf_greedy_reference import batched_greedy_texts
from sglang.test.test_utils import openai_client, popen_launch_server
from sglang.test.windowed_server_checks import WindowedServerChecks, random_ids

from test_nemotron_h_engine import make_nemotron_h, state_bytes_per_slot  # noqa: E402 (the same directory)

register_cpu_ci(est_time=45, suite="cpu")

CHUNK = 7
KV_TOKENS_TOLERANCE = 0.03
FLAGS = ["--dtype", "float32", "--max-total-memory-gb", "1", "--chunked-prefill-size", str(CHUNK)]


class TestNemotronHServer(WindowedServerChecks, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from transformers import AutoTokenizer

        cls.tmp = tempfile.TemporaryDirectory()
        cls.tok = AutoTokenizer.from_pretrained(default_model_dir())
        torch.manual_seed(5)
        cls.hf = make_nemotron_h(vocab_size=(len(cls.tok) + 63) // 64 * 64)
        cls.path = os.path.join(cls.tmp.name, "model")
        cls.hf.save_pretrained(cls.path)
        cls.tok.save_pretrained(cls.path)
        cls.vocab = cls.hf.config.vocab_size
        cls.server = popen_launch_server(cls.path, other_args=FLAGS + ["--random-seed", "0", "--enable-cache-report"])
        cls.client = openai_client(cls.server.base_url, timeout=120)
        cls.model = cls.client.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        cls.server.kill()
        cls.tmp.cleanup()

    def test_eight_prompts_in_chunks_equal_hf(self):
        prompts = [random_ids(1, 20 + 5 * i, seed=i, vocab=self.vocab)[0] for i in range(8)]
        self.assertGreater(max(map(len, prompts)), 6 * CHUNK)
        out = self.client.completions.create(model=self.model, prompt=prompts, max_tokens=10, temperature=0,
                                             extra_body={"ignore_eos": True, "skip_special_tokens": False})
        texts = [c.text for c in sorted(out.choices, key=lambda c: c.index)]
        self.assertEqual(texts, batched_greedy_texts(self.hf, self.tok, prompts, 10))

    def test_repeated_prompt_is_no_prefix_hit(self):
        prompt = random_ids(1, 30, seed=20, vocab=self.vocab)[0]
        self.complete(prompt, 1)
        text, usage = self.complete(prompt, 8)
        cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
        self.assertEqual(cached, 0)
        self.assertEqual(text, self.tok.decode(self.hf_greedy(prompt, 8)))
        info = requests.get(f"{self.server.base_url}/server_info", timeout=30).json()
        self.assertIn("prefix caching is off: nemotron_h keeps per-request recurrent state", json.dumps(info))

    def test_plan_predicts_the_start(self):
        from sglang.cli.plan import main as plan_main

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            status = plan_main(["--device", "cpu", "--model-path", self.path, "--json"] + FLAGS)
        planned = json.loads(buf.getvalue())["plan"]
        self.assertEqual(status, 0, planned)
        info = requests.get(f"{self.server.base_url}/server_info", timeout=30).json()
        served, kv = info["memory_plan"], info["kv_cache"]
        want = planned["max_total_num_tokens"]
        self.assertLessEqual(abs(served["max_total_num_tokens"] - want), KV_TOKENS_TOLERANCE * want, (served, want))
        self.assertEqual(served["state_slots"], planned["state_slots"])
        per_slot = state_bytes_per_slot(self.path)
        self.assertEqual(planned["state_bytes_per_slot"], per_slot)
        self.assertEqual(kv["state_bytes_per_slot"], per_slot, kv)
        self.assertEqual(kv["state_slots"], served["state_slots"], kv)
        terms = {t["name"]: t["num_bytes"] for t in served["terms"]}
        self.assertEqual(terms["linear_state"], served["state_slots"] * per_slot)
        allocated = info["memory_plan_per_rank"][0]["allocated_bytes"]
        self.assertEqual(allocated["linear_state"], terms["linear_state"])

    def test_bad_field_is_a_400_and_the_server_keeps_serving(self):
        self.check_bad_field()


if __name__ == "__main__":
    unittest.main()
