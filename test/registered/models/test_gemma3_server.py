"""Gemma 3 behind the HTTP server, through the real openai client: a random checkpoint (test_gemma3.py's, window 16,
one global layer among sliding ones) with the SmolLM2 tokenizer. A completion of a prompt longer than 3x the window,
prefilled in 32-token chunks, is HF transformers' greedy continuation of the same ids and every prompt position's
logprob (echo) is HF's within 2e-3; a chat completion streamed and not gives the same text; a bad field is a 400
naming it and the server keeps serving."""

import os
import tempfile
import unittest

import torch

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import default_model_dir
from sglang.test.test_utils import openai_client, popen_launch_server

from test_gemma3 import WINDOW, make_gemma3  # noqa: E402 (the same directory)

register_cpu_ci(est_time=60, suite="cpu")

PROMPT = ("The river ran past the old mill, where the miller kept his sacks of grain and his dog slept by the door "
          "every afternoon while the wheel turned slowly in the brown water under the bridge. In the evening the "
          "miller's daughter walked along the bank to count the geese, and the baker from the village brought bread.")
MESSAGES = [{"role": "user", "content": "Name three colors."}]


class TestGemma3Server(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from transformers import AutoTokenizer

        cls.tmp = tempfile.TemporaryDirectory()
        cls.tok = AutoTokenizer.from_pretrained(default_model_dir())
        torch.manual_seed(0)
        cls.hf = make_gemma3(vocab_size=(len(cls.tok) + 63) // 64 * 64, eos_token_id=None, bos_token_id=None,
                             pad_token_id=None).float().eval()
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

    def test_prompt_logprobs_past_the_window_equal_hf(self):
        # every prompt position's logprob, prefilled in 32-token chunks: the window masks each chunk's early keys
        # (a random model's greedy text alone barely depends on them)
        ids = self.tok(PROMPT)["input_ids"]
        out = self.client.completions.create(model=self.model, prompt=PROMPT, max_tokens=1, temperature=0, echo=True,
                                             logprobs=0)
        ours = out.choices[0].logprobs.token_logprobs[1:len(ids)]
        with torch.no_grad():
            ref = torch.log_softmax(self.hf(torch.tensor([ids])).logits[0].double(), -1)
        want = ref[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].tolist()
        self.assertEqual(len(ours), len(want))
        for pos, (a, b) in enumerate(zip(ours, want), start=1):
            self.assertAlmostEqual(a, b, delta=2e-3, msg=f"prompt position {pos}")

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
