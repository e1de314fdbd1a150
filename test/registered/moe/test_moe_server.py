"""A MoE checkpoint behind the HTTP server, through the real openai client: a random-weight Qwen3-MoE with the SmolLM2
tokenizer (its chat template) answers a chat completion, streamed and not, with the same text; /server_info shows the
plan's moe_workspace term."""

import tempfile
import unittest

import requests

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.moe_fixtures import make_random_qwen3_moe
from sglang.test.test_utils import openai_client, popen_launch_server

register_cpu_ci(est_time=15, suite="cpu")

MESSAGES = [{"role": "user", "content": "Name three colors."}]


class TestMoeServer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        model_dir = make_random_qwen3_moe(f"{cls.tmp.name}/model", tokenizer=True)
        cls.server = popen_launch_server(model_dir, other_args=["--max-total-tokens", "2048", "--context-length",
                                                                "512", "--max-running-requests", "4",
                                                                "--chunked-prefill-size", "128", "--random-seed", "0"])
        cls.client = openai_client(cls.server.base_url, timeout=60)
        cls.model = cls.client.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        cls.server.kill()
        cls.tmp.cleanup()

    def test_chat_completion_returns_text(self):
        out = self.client.chat.completions.create(model=self.model, messages=MESSAGES, max_tokens=8, temperature=0,
                                                  extra_body={"ignore_eos": True})
        text = out.choices[0].message.content
        self.assertIsInstance(text, str)
        self.assertGreater(len(text), 0)
        self.assertEqual(out.usage.completion_tokens, 8)
        stream = self.client.chat.completions.create(model=self.model, messages=MESSAGES, max_tokens=8, temperature=0,
                                                     extra_body={"ignore_eos": True}, stream=True)
        self.assertEqual("".join(c.choices[0].delta.content or "" for c in stream if c.choices), text)

    def test_server_info_shows_the_moe_workspace(self):
        info = requests.get(f"{self.server.base_url}/server_info", timeout=10).json()
        terms = {t["name"]: t for t in info["memory_plan"]["terms"]}
        self.assertGreater(terms["moe_workspace"]["num_bytes"], 0)
        self.assertEqual(info["memory_plan_per_rank"][0]["allocated_bytes"]["moe_workspace"],
                         terms["moe_workspace"]["num_bytes"])


if __name__ == "__main__":
    unittest.main()
