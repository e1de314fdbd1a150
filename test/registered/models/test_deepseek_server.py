"""DeepSeek-V3 behind the HTTP server, through the real openai client: test_deepseek_engine's random V3 (MLA with
q_lora, noaux_tc grouped routing with a correction bias, YaRN, a dense first layer, shared experts) with the SmolLM2
tokenizer, a 256-token latent pool and 16-token prefill chunks. Against HF transformers' fp32 greedy tokens on the
same checkpoint (one batched generate per check): 8 prompts in one batched completion; a shared prefix cached by a
1-token request, then prompts extending it (cached_tokens covers the prefix); ten concurrent requests that overfill
the pool (decode retracts: sglang:num_retracted_requests_total moves). A bad field is a 400 naming it and the server
keeps serving; /server_info names the latent pool."""

import os
import tempfile
import unittest

import requests
import torch

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import default_model_dir
from sglang.test.test_utils import openai_client, popen_launch_server
from sglang.test.windowed_server_checks import WindowedServerChecks, random_ids

from test_deepseek_engine import KV_LORA, ROPE, make_deepseek  # noqa: E402 (the same directory)

register_cpu_ci(est_time=30, suite="cpu")

POOL = 256  # 10 x (24 prompt + 32 new) overfill it
CHUNK = 16


class TestDeepseekV3Server(WindowedServerChecks, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from transformers import AutoTokenizer

        cls.tmp = tempfile.TemporaryDirectory()
        cls.tok = AutoTokenizer.from_pretrained(default_model_dir())
        torch.manual_seed(3)
        cls.hf = make_deepseek("v3", vocab_size=(len(cls.tok) + 63) // 64 * 64)
        path = os.path.join(cls.tmp.name, "model")
        cls.hf.save_pretrained(path)
        cls.tok.save_pretrained(path)
        cls.vocab = cls.hf.config.vocab_size
        cls.server = popen_launch_server(path, other_args=["--dtype", "float32", "--max-total-tokens", str(POOL),
                                                           "--chunked-prefill-size", str(CHUNK), "--random-seed", "0",
                                                           "--enable-cache-report", "--enable-metrics"])
        cls.client = openai_client(cls.server.base_url, timeout=120)
        cls.model = cls.client.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        cls.server.kill()
        cls.tmp.cleanup()

    def hf_batch_greedy(self, prompts, n):
        """HF's n greedy tokens after each prompt, one left-padded batched generate (EOS ignored: the config has
        none)."""
        width = max(map(len, prompts))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.no_grad():
            out = self.hf.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                                   pad_token_id=0)
        return [self.tok.decode(row) for row in out[:, width:].tolist()]

    def test_eight_prompts_in_chunks_equal_hf(self):
        prompts = [random_ids(1, 20 + 5 * i, seed=i, vocab=self.vocab)[0] for i in range(8)]
        self.assertGreater(max(map(len, prompts)), 3 * CHUNK)
        out = self.client.completions.create(model=self.model, prompt=prompts, max_tokens=10, temperature=0,
                                             extra_body={"ignore_eos": True, "skip_special_tokens": False})
        texts = [c.text for c in sorted(out.choices, key=lambda c: c.index)]
        self.assertEqual(texts, self.hf_batch_greedy(prompts, 10))

    def test_prefix_hit_equals_hf(self):
        prefix = random_ids(1, 40, seed=20, vocab=self.vocab)[0]
        self.complete(prefix, 1)  # caches the prefix
        prompts = [prefix + [11, 12, 13], prefix + [300]]
        got = []
        for ids in prompts:
            text, usage = self.complete(ids, 8)
            self.assertGreaterEqual(usage.prompt_tokens_details.cached_tokens, len(prefix) - 1)
            got.append(text)
        self.assertEqual(got, self.hf_batch_greedy(prompts, 8))

    def test_retraction_decodes_hf_tokens(self):
        prompts = random_ids(10, 24, seed=30, vocab=self.vocab)
        retracted = "sglang:num_retracted_requests_total"
        want = self.hf_batch_greedy(prompts, 32)
        # one completion request of ten prompts: when the first five run together (each admitted reserving 0.7 of
        # its 32 new tokens) they outgrow the pool and decode retracts. Whether they overlap is up to the OS on a
        # loaded machine (ten client threads, or the batch's ten requests, may reach the scheduler spread out), so
        # the batch is sent again, each time checked against HF, until one retracted
        for _ in range(4):
            before = self.metric(retracted)
            out = self.client.completions.create(model=self.model, prompt=prompts, max_tokens=32, temperature=0,
                                                 extra_body={"ignore_eos": True, "skip_special_tokens": False})
            self.assertEqual([c.text for c in sorted(out.choices, key=lambda c: c.index)], want)
            if self.metric(retracted) > before:
                break
        else:
            self.fail("four batches of ten requests never retracted")

    def test_server_info_names_the_latent_pool(self):
        info = requests.get(f"{self.server.base_url}/server_info", timeout=30).json()
        text = str(info)
        self.assertIn("mla_latent", text)
        self.assertIn(f"'row_width': {KV_LORA + ROPE}", text)

    def test_bad_field_is_a_400_and_the_server_keeps_serving(self):
        self.check_bad_field()


if __name__ == "__main__":
    unittest.main()
