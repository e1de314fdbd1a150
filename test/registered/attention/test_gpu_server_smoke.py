"""GPU: `sglang serve` with each GPU attention backend answers the openai client (chat, completion, streaming),
rejects a bad request with a 4xx and keeps serving, and holds no KV tokens when idle (memory integrity ok)."""

import unittest

import requests

from sglang.test.ci.ci_register import register_amd_ci, register_cuda_ci
from sglang.test.gpu_backends import SERVER_ARGS, platform_backends, require_library, requires_gpu
from sglang.test.test_utils import popen_launch_server

register_cuda_ci(est_time=120, suite="stage-a-test-1-gpu")
register_amd_ci(est_time=120, suite="stage-a-test-1-gpu-amd")


@requires_gpu()
class TestGpuServerSmoke(unittest.TestCase):
    def smoke(self, backend: str):
        import openai

        server = popen_launch_server(other_args=SERVER_ARGS + ["--attention-backend", backend, "--dtype", "bfloat16"])
        try:
            client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none")
            model = client.models.list().data[0].id
            chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi."}],
                                                  max_tokens=8, temperature=0)
            self.assertGreater(chat.usage.completion_tokens, 0)
            self.assertTrue(chat.choices[0].message.content)
            comp = client.completions.create(model=model, prompt="The three primary colors are", max_tokens=8,
                                             temperature=0)
            self.assertGreater(comp.usage.completion_tokens, 0)
            chunks = list(client.completions.create(model=model, prompt="Count: 1, 2, 3,", max_tokens=8,
                                                    temperature=0, stream=True))
            streamed = "".join(c.choices[0].text for c in chunks if c.choices)
            self.assertTrue(streamed)
            with self.assertRaises(openai.BadRequestError):
                client.completions.create(model=model, prompt="x", max_tokens=-1)
            again = client.completions.create(model=model, prompt="The three primary colors are", max_tokens=8,
                                              temperature=0)
            self.assertEqual(again.choices[0].text, comp.choices[0].text)  # still serving, deterministic
            requests.post(f"{server.base_url}/flush_cache", timeout=30)
            info = requests.get(f"{server.base_url}/server_info", timeout=30).json()
            self.assertEqual(info["memory_integrity"], "ok")
            self.assertEqual(info["internal_states"][0]["num_used_tokens"], 0)
        finally:
            server.kill()

    def test_each_backend(self):
        for backend in platform_backends():
            with self.subTest(backend=backend):
                require_library(backend)
                self.smoke(backend)


if __name__ == "__main__":
    unittest.main()
