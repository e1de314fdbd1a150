"""Mistral (a 16-token window on every layer: the windowed pool is the token pool, pages freed as the window moves)
behind the HTTP server, through the real openai client: test_mistral.py's random fp32 checkpoint, its vocabulary
resized to the SmolLM2 tokenizer's. Against HF transformers' fp32 greedy tokens on the same checkpoint:
- a completion of a prompt longer than 3x the window, prefilled in 24-token chunks (every chunk edge cuts a window);
- a shared prefix 3x the window cached by a 1-token request (its window still held when it is inserted), then two
  prompts extending it: each a prefix-cache hit (usage.prompt_tokens_details.cached_tokens, --enable-cache-report)
  that decodes HF's tokens;
- a bad field is a 400 naming it, and the server keeps serving."""

import os
import tempfile
import unittest

import torch

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import default_model_dir
from sglang.test.test_utils import openai_client, popen_launch_server
from sglang.test.windowed_server_checks import WindowedServerChecks

from test_mistral import WINDOW, make_mistral  # noqa: E402 (the same directory)

register_cpu_ci(est_time=30, suite="cpu")

CHUNK = 24
assert CHUNK % WINDOW != 0  # chunk edges fall inside windows
PROMPT = ("The river ran past the old mill, where the miller kept his sacks of grain and his dog slept by the door "
          "every afternoon while the wheel turned slowly in the brown water under the bridge, and the children of the "
          "village came down the lane each evening to watch the swallows dip over the pond beyond the orchard wall.")


class TestMistralServer(WindowedServerChecks, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from transformers import AutoTokenizer

        cls.tmp = tempfile.TemporaryDirectory()
        cls.tok = AutoTokenizer.from_pretrained(default_model_dir())
        torch.manual_seed(0)
        cls.hf = make_mistral(WINDOW).float().eval()
        cls.hf.resize_token_embeddings(len(cls.tok), pad_to_multiple_of=64)
        cls.vocab = cls.hf.config.vocab_size
        path = os.path.join(cls.tmp.name, "model")
        cls.hf.save_pretrained(path)
        cls.tok.save_pretrained(path)
        cls.server = popen_launch_server(path, other_args=["--dtype", "float32", "--chunked-prefill-size", str(CHUNK),
                                                           "--enable-cache-report", "--random-seed", "0"])
        cls.client = openai_client(cls.server.base_url, timeout=60)
        cls.model = cls.client.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        cls.server.kill()
        cls.tmp.cleanup()

    def test_completion_past_the_window_equals_hf(self):
        ids = self.tok(PROMPT)["input_ids"]
        self.assertGreater(len(ids), 3 * WINDOW)
        text, usage = self.complete(PROMPT, 16)
        self.assertEqual((usage.prompt_tokens, usage.completion_tokens), (len(ids), 16))
        self.assertEqual(text, self.tok.decode(self.hf_greedy(ids, 16)))

    def test_prefix_hit_equals_hf(self):
        self.check_prefix_hit(WINDOW)

    def test_bad_field_is_a_400_and_the_server_keeps_serving(self):
        self.check_bad_field()


if __name__ == "__main__":
    unittest.main()
