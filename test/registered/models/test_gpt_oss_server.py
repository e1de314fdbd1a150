"""gpt-oss behind the HTTP server, through the real openai client: a random checkpoint (test_gpt_oss.py's, window 16)
with the SmolLM2 tokenizer, its full layers in a 256-token pool. Against HF transformers' fp32 greedy tokens on the same
checkpoint: a completion of a prompt longer than 3x the window, prefilled in chunks; a shared prefix 3x the window
cached by a 1-token request, then prompts extending it (prefix-cache hits: cached_tokens covers the prefix); ten
concurrent requests that overfill the pool (decode retracts: sglang:num_retracted_requests_total moves). A chat
completion streamed and not gives the same text; a bad field is a 400 naming it and the server keeps serving."""

import os
import re
import tempfile
import threading
import unittest

import requests
import torch

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import default_model_dir
from sglang.test.test_utils import openai_client, popen_launch_server

from test_gpt_oss import WINDOW, make_gpt_oss  # noqa: E402 (the same directory)

register_cpu_ci(est_time=75, suite="cpu")

PROMPT = ("The river ran past the old mill, where the miller kept his sacks of grain and his dog slept by the door "
          "every afternoon while the wheel turned slowly in the brown water under the bridge, and the children of the "
          "village came down the lane each evening to watch the swallows dip over the pond beyond the orchard wall.")
MESSAGES = [{"role": "user", "content": "Name three colors."}]
POOL = 256  # 10 x (48 prompt + 40 new) overfill it


def _random_ids(n, length, seed, vocab):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (length,), generator=g).tolist() for _ in range(n)]


class TestGptOssServer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from transformers import AutoTokenizer

        cls.tmp = tempfile.TemporaryDirectory()
        cls.tok = AutoTokenizer.from_pretrained(default_model_dir())
        torch.manual_seed(0)
        cls.hf = make_gpt_oss(vocab_size=(len(cls.tok) + 63) // 64 * 64, eos_token_id=None, bos_token_id=None)
        path = os.path.join(cls.tmp.name, "model")
        cls.hf.save_pretrained(path)
        cls.tok.save_pretrained(path)
        cls.vocab = cls.hf.config.vocab_size
        cls.server = popen_launch_server(path, other_args=["--dtype", "float32", "--max-total-tokens", str(POOL),
                                                           "--chunked-prefill-size", "32", "--random-seed", "0",
                                                           "--enable-cache-report", "--enable-metrics"])
        cls.client = openai_client(cls.server.base_url, timeout=60)
        cls.model = cls.client.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        cls.server.kill()
        cls.tmp.cleanup()

    def test_completion_past_the_window_equals_hf(self):
        ids = self.tok(PROMPT)["input_ids"]
        self.assertGreater(len(ids), 3 * WINDOW)
        out = self.client.completions.create(model=self.model, prompt=PROMPT, max_tokens=12, temperature=0,
                                             extra_body={"ignore_eos": True})
        with torch.no_grad():
            ref = self.hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids):]
        self.assertEqual(out.choices[0].text, self.tok.decode(ref))
        self.assertEqual(out.usage.prompt_tokens, len(ids))

    def hf_greedy(self, ids, n):
        with torch.no_grad():
            return self.hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)[0, len(ids):].tolist()

    def complete(self, ids, n):
        """Greedy completion of token ids: (its text, the usage)."""
        out = self.client.completions.create(model=self.model, prompt=ids, max_tokens=n, temperature=0,
                                             extra_body={"ignore_eos": True, "skip_special_tokens": False})
        return out.choices[0].text, out.usage

    def retractions(self) -> float:
        text = requests.get(f"{self.server.base_url}/metrics", timeout=30).text
        return float(re.search(r"^sglang:num_retracted_requests_total(?:\{[^}]*\})? (\S+)$", text, re.M).group(1))

    def test_prefix_hit_equals_hf(self):
        prefix = _random_ids(1, 3 * WINDOW, seed=2, vocab=self.vocab)[0]
        self.complete(prefix, 1)  # ends as its prefill does: the window's tokens are cached with the prefix
        for suffix in ([11, 12, 13, 14, 15, 16, 17], [300, 301]):
            ids = prefix + suffix
            text, usage = self.complete(ids, 10)
            cached = usage.prompt_tokens_details.cached_tokens
            self.assertGreaterEqual(cached, 2 * WINDOW)  # the prefix, borrowed with its window
            self.assertLess(cached, len(ids))
            self.assertEqual(text, self.tok.decode(self.hf_greedy(ids, 10)))

    def test_retraction_decodes_hf_tokens(self):
        prompts = _random_ids(10, 3 * WINDOW, seed=3, vocab=self.vocab)
        before, outs = self.retractions(), [None] * len(prompts)

        def run(i):
            outs[i] = self.complete(prompts[i], 40)[0]

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertGreater(self.retractions(), before)
        for ids, text in zip(prompts, outs):
            self.assertEqual(text, self.tok.decode(self.hf_greedy(ids, 40)))

    def test_chat_streamed_equals_not_streamed(self):
        out = self.client.chat.completions.create(model=self.model, messages=MESSAGES, max_tokens=8, temperature=0,
                                                  extra_body={"ignore_eos": True})
        text = out.choices[0].message.content
        self.assertEqual(out.usage.completion_tokens, 8)
        stream = self.client.chat.completions.create(model=self.model, messages=MESSAGES, max_tokens=8, temperature=0,
                                                     extra_body={"ignore_eos": True}, stream=True)
        self.assertEqual("".join(c.choices[0].delta.content or "" for c in stream if c.choices), text)

    def test_bad_field_is_a_400_and_the_server_keeps_serving(self):
        import openai

        with self.assertRaises(openai.BadRequestError) as err:
            self.client.completions.create(model=self.model, prompt="hi", max_tokens=-3)
        self.assertIn("max_tokens", str(err.exception))
        out = self.client.completions.create(model=self.model, prompt="hi", max_tokens=2, temperature=0)
        self.assertEqual(out.usage.completion_tokens, 2)


if __name__ == "__main__":
    unittest.main()
