"""gpt-oss behind the HTTP server, through the real openai client: a random checkpoint (test_gpt_oss.py's, window 16)
with the SmolLM2 tokenizer. A completion of a prompt longer than 3x the window, prefilled in chunks, is HF
transformers' greedy continuation of the same ids; a chat completion streamed and not gives the same text; a bad
field is a 400 naming it and the server keeps serving."""

import os
import tempfile
import unittest

import torch

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import default_model_dir
from sglang.test.test_utils import openai_client, popen_launch_server

from test_gpt_oss import WINDOW, make_gpt_oss  # noqa: E402 (the same directory)

register_cpu_ci(est_time=40, suite="cpu")

PROMPT = ("The river ran past the old mill, where the miller kept his sacks of grain and his dog slept by the door "
          "every afternoon while the wheel turned slowly in the brown water under the bridge, and the children of the "
          "village came down the lane each evening to watch the swallows dip over the pond beyond the orchard wall.")
MESSAGES = [{"role": "user", "content": "Name three colors."}]


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
        cls.server = popen_launch_server(path, other_args=["--dtype", "float32", "--max-total-tokens", "1024",
                                                           "--chunked-prefill-size", "32", "--random-seed", "0"])
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
