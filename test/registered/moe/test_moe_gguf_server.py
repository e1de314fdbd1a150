"""A quantized GGUF MoE file behind the HTTP server, through the real openai client: a random-weight Qwen3-MoE
written as a Q4_0 file in llama.cpp's layout (moe_gguf_fixtures.py: synthetic byte-level vocabulary, a ChatML
template) is converted at start and served from its blocks (--quantization gguf); a chat completion streamed and not
gives the same text, and /server_info reports the quantization and the MoE workspace the runner allocated, equal to
the plan's term."""

import tempfile
import unittest

import requests

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.moe_fixtures import make_random_qwen3_moe
from sglang.test.moe_gguf_fixtures import write_moe_gguf
from sglang.test.test_utils import openai_client, popen_launch_server

register_cpu_ci(est_time=15, suite="cpu")

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MESSAGES = [{"role": "user", "content": "Name three colors."}]


class TestMoeGgufServer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        hf_dir = make_random_qwen3_moe(f"{cls.tmp.name}/hf")
        gguf_path = write_moe_gguf(hf_dir, f"{cls.tmp.name}/qwen3moe-Q4_0.gguf", "Q4_0", chat_template=CHATML)
        cls.server = popen_launch_server(gguf_path, other_args=[
            "--quantization", "gguf", "--model-cache-dir", f"{cls.tmp.name}/cache", "--max-total-tokens", "2048",
            "--context-length", "512", "--max-running-requests", "4", "--chunked-prefill-size", "128",
            "--random-seed", "0"])
        cls.client = openai_client(cls.server.base_url, timeout=60)
        cls.model = cls.client.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        cls.server.kill()
        cls.tmp.cleanup()

    def test_chat_completion_streamed_and_not(self):
        kwargs = dict(model=self.model, messages=MESSAGES, max_tokens=8, temperature=0,
                      extra_body={"ignore_eos": True})
        out = self.client.chat.completions.create(**kwargs)
        text = out.choices[0].message.content
        self.assertIsInstance(text, str)
        self.assertGreater(len(text), 0)
        self.assertEqual(out.usage.completion_tokens, 8)
        stream = self.client.chat.completions.create(**kwargs, stream=True)
        self.assertEqual("".join(c.choices[0].delta.content or "" for c in stream if c.choices), text)

    def test_server_info_shows_the_quantized_experts_workspace(self):
        info = requests.get(f"{self.server.base_url}/server_info", timeout=10).json()
        self.assertEqual(info["quantization"], "gguf")
        terms = {t["name"]: t for t in info["memory_plan"]["terms"]}
        self.assertIn("4/4-bit gate_up/down experts", terms["moe_workspace"]["detail"])
        self.assertGreater(terms["moe_workspace"]["num_bytes"], 0)
        self.assertEqual(info["memory_plan_per_rank"][0]["allocated_bytes"]["moe_workspace"],
                         terms["moe_workspace"]["num_bytes"])


if __name__ == "__main__":
    unittest.main()
