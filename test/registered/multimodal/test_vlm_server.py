"""End to end through the HTTP server with the real openai client: chat with images (data URLs, several per
message, an allowed local file), streaming and not; /generate with image_data; malformed base64, non-image bytes,
zero-size and oversized images each get a 400 that says what is wrong, and the server keeps serving."""

import base64
import os
import tempfile
import unittest

import openai
import requests

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=40, suite="cpu")

from sglang.test.mm_fixtures import IMAGE_SIZE, data_url, make_image, make_random_llava  # noqa: E402
from sglang.test.test_utils import openai_client, popen_launch_server  # noqa: E402

# the processor does not resize: images must be IMAGE_SIZE square, and bigger ones are refused with the limit
NO_RESIZE = {"do_resize": False, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
             "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
MAX_PIXELS = IMAGE_SIZE * IMAGE_SIZE


def image_part(url):
    return {"type": "image_url", "image_url": {"url": url}}


class TestVlmServer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.model_dir = os.path.join(cls.tmp.name, "model")
        cls.media_dir = os.path.join(cls.tmp.name, "media")
        os.makedirs(cls.media_dir)
        make_random_llava(cls.model_dir, preprocessor=NO_RESIZE)
        cls.local_image = os.path.join(cls.media_dir, "a.png")
        make_image(7).save(cls.local_image)
        cls.server = popen_launch_server(
            cls.model_dir,
            other_args=["--max-total-tokens", "4096", "--max-running-requests", "8", "--context-length", "1024",
                        "--max-image-pixels", str(MAX_PIXELS), "--allowed-local-media-path", cls.media_dir,
                        "--random-seed", "0"])
        cls.client = openai_client(cls.server.base_url, timeout=60)
        cls.model = cls.client.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        cls.server.kill()
        cls.tmp.cleanup()

    def chat(self, parts, **kw):
        return self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": parts}], max_tokens=6, temperature=0, **kw)

    def test_chat_with_image_streaming_and_not(self):
        parts = [{"type": "text", "text": "What is in this picture?"}, image_part(data_url(make_image(0)))]
        full = self.chat(parts)
        text = full.choices[0].message.content
        self.assertEqual(full.usage.completion_tokens, 6)
        text_only = self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": "What is in this picture?"}], max_tokens=1)
        self.assertEqual(full.usage.prompt_tokens, text_only.usage.prompt_tokens + 16)  # 16 image tokens
        streamed = "".join(c.choices[0].delta.content or "" for c in self.chat(parts, stream=True) if c.choices)
        self.assertEqual(streamed, text)

    def test_two_images_and_local_file(self):
        parts = [image_part(data_url(make_image(1))), {"type": "text", "text": " versus "},
                 image_part("file://" + self.local_image)]
        out = self.chat(parts)
        self.assertEqual(out.usage.completion_tokens, 6)

    def test_generate_with_image_data(self):
        r = requests.post(f"{self.server.base_url}/generate", timeout=60, json={
            "text": "Caption: <image>", "image_data": data_url(make_image(2)),
            "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}})
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(len(r.json()["output_ids"]), 5)

    def test_bad_images_are_400_and_server_keeps_serving(self):
        zero = base64.b64decode(
            "iVBORw0KGgoAAAANSUhEUgAAAAAAAAAKCAIAAAAVcsgj")  # a PNG header declaring 0x10 pixels
        cases = {
            "data:image/png;base64,%%%not-base64%%%": "not valid base64",
            "data:image/png;base64," + base64.b64encode(b"just some text").decode(): "could not be decoded",
            "data:image/png;base64," + base64.b64encode(zero).decode(): "zero size",
            data_url(make_image(3, IMAGE_SIZE + 16, IMAGE_SIZE + 16)): f"limit of {MAX_PIXELS:,} pixels",
            "file:///etc/hostname": "outside the allowed media directory",
        }
        for url, fragment in cases.items():
            with self.assertRaises(openai.BadRequestError) as ctx:
                self.chat([{"type": "text", "text": "hi"}, image_part(url)])
            self.assertIn(fragment, str(ctx.exception), url[:40])
        r = requests.post(f"{self.server.base_url}/generate", timeout=60,
                          json={"text": "x", "image_data": "data:image/png;base64,@@@"})
        self.assertEqual(r.status_code, 400)
        self.assertIn("base64", r.text)
        ok = self.chat([image_part(data_url(make_image(4)))])
        self.assertEqual(ok.usage.completion_tokens, 6)


if __name__ == "__main__":
    unittest.main()
