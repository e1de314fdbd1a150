"""Qwen2.5-VL end to end through the HTTP server with the real openai client: a chat with an image_url and a
video_url (a tiny mp4 made with PyAV) answers HF transformers' greedy tokens for the same templated prompt, streaming
and not; a video from an allowed local file; /generate with image_data + video_data. More videos than
--limit-mm-data-per-request allows, a corrupt video and a video outside the media directory each get a 400 that
names the problem, and the server keeps serving; /health stays fast while a long video decodes off the loop."""

import os
import tempfile
import threading
import time
import unittest
from types import SimpleNamespace

import openai
import requests
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="cpu", serial=True)  # asserts a time or CPU measure: run alone

from sglang.test.mm_fixtures import data_url, make_image  # noqa: E402
from sglang.test.qwen_vl_fixtures import (  # noqa: E402
    hf_qwen_vl_greedy,
    make_random_qwen2_5_vl,
    make_video,
    video_data_url,
)
from sglang.test.test_utils import openai_client, popen_launch_server  # noqa: E402

MAX_NEW = 6
# /health while a video decodes: well under the decode itself (~1 s here); the loop answers in ~10 ms, and in up to
# ~160 ms when another test group keeps both cores busy (fresh-clone CI, 2026-11-30). A loop blocked by the decode
# would answer after most of the request's time: the bound is a third of that, at most MAX_HEALTH_S.
MAX_HEALTH_S = 0.4


def video(seed, **kw):
    return make_video(seed, width=84, height=56, **kw)


class TestQwenVlServer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from transformers import AutoConfig, AutoTokenizer, Qwen2_5_VLForConditionalGeneration

        from sglang.srt.multimodal.processors.qwen2_5_vl import Qwen2_5_VLProcessor

        cls.tmp = tempfile.TemporaryDirectory()
        cls.model_dir = os.path.join(cls.tmp.name, "model")
        cls.media_dir = os.path.join(cls.tmp.name, "media")
        os.makedirs(cls.media_dir)
        make_random_qwen2_5_vl(cls.model_dir)
        cls.local_video = os.path.join(cls.media_dir, "clip.mp4")
        with open(cls.local_video, "wb") as f:
            f.write(video(9))
        cls.server = popen_launch_server(
            cls.model_dir,
            other_args=["--max-total-tokens", "4096", "--max-running-requests", "8", "--context-length", "1024",
                        "--limit-mm-data-per-request", '{"video": 1, "image": 2}',
                        "--allowed-local-media-path", cls.media_dir, "--random-seed", "0"])
        cls.client = openai_client(cls.server.base_url, timeout=60)
        cls.model = cls.client.models.list().data[0].id
        # the reference: HF's model on our processor's output for the prompt the server templates
        cls.tok = AutoTokenizer.from_pretrained(cls.model_dir)
        args = SimpleNamespace(allowed_local_media_path=cls.media_dir, max_image_pixels=None, max_video_frames=64,
                               mm_item_limits=lambda: {})
        cls.proc = Qwen2_5_VLProcessor(AutoConfig.from_pretrained(cls.model_dir), cls.model_dir, args)
        cls.hf = Qwen2_5_VLForConditionalGeneration.from_pretrained(cls.model_dir, dtype=torch.float32).eval()

    @classmethod
    def tearDownClass(cls):
        cls.server.kill()
        cls.tmp.cleanup()

    def chat(self, parts, **kw):
        return self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": parts}], max_tokens=MAX_NEW, temperature=0, **kw)

    def hf_reply(self, text, images=None, videos=None):
        """HF's greedy ids for a user message whose image/video parts became the model's placeholders."""
        prompt = self.tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                              add_generation_prompt=True)
        mm = self.proc.process(self.tok.encode(prompt, add_special_tokens=False), images, videos)
        return hf_qwen_vl_greedy(self.hf, mm, self.proc.image_token_id, self.proc.video_token_id, MAX_NEW), mm

    def test_chat_image_and_video_equal_hf(self):
        img, vid = data_url(make_image(0, 112, 84)), video_data_url(video(1))
        parts = [{"type": "text", "text": "Compare "}, {"type": "image_url", "image_url": {"url": img}},
                 {"type": "text", "text": " with "}, {"type": "video_url", "video_url": {"url": vid}}]
        out = self.chat(parts, logprobs=True)
        text = "Compare <|vision_start|><|image_pad|><|vision_end|> with <|vision_start|><|video_pad|><|vision_end|>"
        ref, mm = self.hf_reply(text, [img], [vid])
        self.assertEqual(out.usage.prompt_tokens, len(mm.input_ids))
        self.assertEqual(out.usage.completion_tokens, MAX_NEW)
        self.assertEqual([c.token for c in out.choices[0].logprobs.content], [self.tok.decode([t]) for t in ref])
        streamed = "".join(c.choices[0].delta.content or "" for c in self.chat(parts, stream=True) if c.choices)
        self.assertEqual(streamed, out.choices[0].message.content)

    def test_local_video_file_and_generate(self):
        out = self.chat([{"type": "video_url", "video_url": {"url": "file://" + self.local_video}},
                         {"type": "text", "text": "What moves?"}])
        self.assertEqual(out.usage.completion_tokens, MAX_NEW)
        text = "Look <|vision_start|><|image_pad|><|vision_end|> and <|vision_start|><|video_pad|><|vision_end|>"
        img, vid = data_url(make_image(2, 56, 84)), video_data_url(video(3))
        r = requests.post(f"{self.server.base_url}/generate", timeout=60, json={
            "text": text, "image_data": [img], "video_data": [vid],
            "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}})
        self.assertEqual(r.status_code, 200, r.text)
        mm = self.proc.process(self.tok.encode(text), [img], [vid])
        expect = hf_qwen_vl_greedy(self.hf, mm, self.proc.image_token_id, self.proc.video_token_id, MAX_NEW)
        self.assertEqual(r.json()["output_ids"], expect)

    def test_bad_videos_are_400_and_server_keeps_serving(self):
        clip = video_data_url(video(4))
        vpart = lambda url: {"type": "video_url", "video_url": {"url": url}}  # noqa: E731
        with self.assertRaises(openai.BadRequestError) as ctx:
            self.chat([vpart(clip), vpart(clip), {"type": "text", "text": "two clips"}])
        self.assertIn("2 video items", str(ctx.exception))
        self.assertIn("--limit-mm-data-per-request", str(ctx.exception))
        cases = {
            "data:video/mp4;base64," + "QUJD" * 200: "could not be decoded",
            video_data_url(video(5)[:400]): "could not be decoded",
            "data:video/mp4;base64,%%%": "not valid base64",
            "file:///etc/hostname": "outside the allowed media directory",
        }
        for url, fragment in cases.items():
            with self.assertRaises(openai.BadRequestError) as ctx:
                self.chat([vpart(url), {"type": "text", "text": "hi"}])
            self.assertIn(fragment, str(ctx.exception), url[:40])
        r = requests.post(f"{self.server.base_url}/generate", timeout=60,
                          json={"text": "x", "video_data": "data:video/mp4;base64,QUJD"})
        self.assertEqual(r.status_code, 400)
        ok = self.chat([vpart(clip), {"type": "text", "text": "one clip"}])
        self.assertEqual(ok.usage.completion_tokens, MAX_NEW)

    def test_health_stays_fast_while_a_long_video_decodes(self):
        long_clip = video_data_url(make_video(6, num_frames=1200, width=480, height=360, fps=30))
        done = {}

        def send():
            t0 = time.perf_counter()
            done["reply"] = self.chat([{"type": "video_url", "video_url": {"url": long_clip}},
                                       {"type": "text", "text": "long"}])
            done["s"] = time.perf_counter() - t0

        worker = threading.Thread(target=send)
        worker.start()
        lags = []
        while worker.is_alive():
            t0 = time.perf_counter()
            self.assertEqual(requests.get(f"{self.server.base_url}/health", timeout=10).status_code, 200)
            lags.append(time.perf_counter() - t0)
            time.sleep(0.02)
        worker.join()
        self.assertEqual(done["reply"].usage.completion_tokens, MAX_NEW)
        self.assertGreater(len(lags), 3, f"the request took {done['s']:.2f} s")
        lags.sort()
        self.assertLess(lags[-1], min(MAX_HEALTH_S, done["s"] / 3), (done["s"], lags))  # every /health meanwhile


if __name__ == "__main__":
    unittest.main()
