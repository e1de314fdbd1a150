"""The Qwen3-Omni Thinker end to end through the HTTP server with the real openai client: one chat mixing an
image_url, an input_audio (a wav made here) and a video_url answers HF transformers' greedy tokens (fp32, HF's own
Whisper features for the audio) for the same templated prompt, as logprobs' tokens and as a stream. Each
per-modality limit is a 400 naming it -- more items than --limit-mm-data-per-request for each modality, an audio
over --max-audio-seconds, corrupt audio, corrupt video -- and the server keeps serving. Media input errors (issue 45
item 6): decode errors in words (no Python object reprs), an ftp:// image names the scheme, placeholder tokens
without their items are a 400 naming the prompt field, /generate's images without placeholders are placed at the
prompt's start (the same tokens as placeholders written there), and input_audio.format must match the data."""

import os
import tempfile
import unittest

import openai
import requests
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="cpu")

from sglang.srt.multimodal.audio_loader import load_audio  # noqa: E402
from sglang.srt.multimodal.processors.qwen3_omni import Qwen3OmniThinkerProcessor  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402
from sglang.test.audio_fixtures import audio_data_url, audio_file, b64  # noqa: E402
from sglang.test.mm_fixtures import data_url, make_image  # noqa: E402
from sglang.test.qwen3_omni_fixtures import (  # noqa: E402
    hf_omni_greedy,
    make_random_qwen3_omni_thinker,
    make_waveform,
    whisper_log_mel,
)
from sglang.test.qwen_vl_fixtures import make_video, video_data_url  # noqa: E402
from sglang.test.test_utils import openai_client, popen_launch_server  # noqa: E402

MAX_NEW = 6
MAX_AUDIO_S = 4
IMG = "<|vision_start|><|image_pad|><|vision_end|>"
VID = "<|vision_start|><|video_pad|><|vision_end|>"
AUD = "<|audio_start|><|audio_pad|><|audio_end|>"


def image_part(url):
    return {"type": "image_url", "image_url": {"url": url}}


def video_part(url):
    return {"type": "video_url", "video_url": {"url": url}}


def audio_part(wav: bytes, fmt="wav"):
    return {"type": "input_audio", "input_audio": {"data": b64(wav), "format": fmt}}


def text_part(text):
    return {"type": "text", "text": text}


class TestQwen3OmniServer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from transformers import AutoTokenizer, Qwen3OmniMoeThinkerForConditionalGeneration

        cls.tmp = tempfile.TemporaryDirectory()
        cls.model_dir = make_random_qwen3_omni_thinker(os.path.join(cls.tmp.name, "model"))
        limits = '{"image": 1, "video": 1, "audio": 1}'
        cls.server = popen_launch_server(
            cls.model_dir,
            other_args=["--max-total-tokens", "4096", "--max-running-requests", "8", "--context-length", "1024",
                        "--max-audio-seconds", str(MAX_AUDIO_S), "--limit-mm-data-per-request", limits,
                        "--random-seed", "0", "--dtype", "float32"])
        cls.client = openai_client(cls.server.base_url, timeout=60)
        cls.model = cls.client.models.list().data[0].id
        cls.tok = AutoTokenizer.from_pretrained(cls.model_dir)
        cls.hf = Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained(cls.model_dir,
                                                                             dtype=torch.float32).eval()
        from transformers import AutoConfig

        cls.proc = Qwen3OmniThinkerProcessor(AutoConfig.from_pretrained(cls.model_dir), cls.model_dir,
                                             ServerArgs(model_path=cls.model_dir, max_audio_seconds=MAX_AUDIO_S))
        cls.wav = audio_file(make_waveform(1, 2.3), subtype="PCM_16")

    @classmethod
    def tearDownClass(cls):
        cls.server.kill()
        cls.tmp.cleanup()

    def chat(self, parts, **kw):
        return self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": parts}], max_tokens=MAX_NEW, temperature=0,
            extra_body={"ignore_eos": True}, **kw)

    def assert_400(self, parts, *needles):
        with self.assertRaises(openai.BadRequestError) as ctx:
            self.chat(parts)
        self.assertEqual(ctx.exception.status_code, 400)
        for needle in needles:
            self.assertIn(needle, str(ctx.exception))

    def test_image_audio_video_chat_equals_hf(self):
        img = data_url(make_image(0, 96, 64))
        vid = video_data_url(make_video(2, num_frames=8, width=64, height=64))
        aud = audio_data_url(self.wav)
        parts = [text_part("Look "), image_part(img), text_part(" listen "), audio_part(self.wav),
                 text_part(" watch "), video_part(vid), text_part(" answer.")]
        out = self.chat(parts, logprobs=True)
        text = f"Look {IMG} listen {AUD} watch {VID} answer."
        prompt = self.tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                              add_generation_prompt=True)
        mm = self.proc.process(self.tok.encode(prompt, add_special_tokens=False), [img], [vid], [aud])
        samples = load_audio(aud, None, 16000, MAX_AUDIO_S)
        ref = hf_omni_greedy(self.hf, mm, MAX_NEW, [whisper_log_mel(samples)])
        self.assertEqual(sorted(it.modality for it in mm.mm_items), ["audio", "image", "video"])
        self.assertEqual(out.usage.prompt_tokens, len(mm.input_ids))
        self.assertEqual(out.usage.completion_tokens, MAX_NEW)
        self.assertEqual([c.token for c in out.choices[0].logprobs.content], [self.tok.decode([t]) for t in ref])
        streamed = "".join(c.choices[0].delta.content or "" for c in self.chat(parts, stream=True) if c.choices)
        self.assertEqual(streamed, out.choices[0].message.content)

    def test_each_limit_is_400_and_server_keeps_serving(self):
        img = image_part(data_url(make_image(1, 64, 64)))
        vid = video_part(video_data_url(make_video(3, num_frames=8, width=64, height=64)))
        aud = audio_part(self.wav)
        for part, name in ((img, "image"), (vid, "video"), (aud, "audio")):
            self.assert_400([part, part, text_part("two")], f"2 {name} items", "--limit-mm-data-per-request")
        self.assert_400([audio_part(audio_file(make_waveform(2, MAX_AUDIO_S + 1.5)))], "--max-audio-seconds",
                        f"{MAX_AUDIO_S + 1.5:.2f} s")
        self.assert_400([audio_part(b"RIFF" + bytes(200))], "could not be decoded as audio")
        self.assert_400([video_part("data:video/mp4;base64," + "QUJD" * 200)], "could not be decoded")
        r = requests.post(f"{self.server.base_url}/generate", timeout=60, json={
            "text": f"x {AUD}", "audio_data": "data:audio/wav;base64,AAAA", "sampling_params": {"max_new_tokens": 1}})
        self.assertEqual(r.status_code, 400, r.text)
        self.assertEqual(requests.get(f"{self.server.base_url}/health", timeout=10).status_code, 200)
        ok = self.chat([img, aud, vid, text_part("all three")])
        self.assertEqual(ok.usage.completion_tokens, MAX_NEW)


    def generate(self, body: dict) -> requests.Response:
        return requests.post(f"{self.server.base_url}/generate", timeout=60,
                             json={**body, "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0,
                                                               "ignore_eos": True}})

    def test_media_errors_say_what_is_wrong(self):
        not_media = b64(b"plain text, not a picture or a sound" * 4)
        self.assert_400([image_part("data:image/png;base64," + not_media)], "could not be decoded as an image",
                        "PNG, JPEG")
        self.assert_400([audio_part(b"plain text, not a picture or a sound" * 4)], "could not be decoded as audio")
        for part in (image_part("data:image/png;base64," + not_media), audio_part(b"RIFF" + bytes(200))):
            with self.assertRaises(openai.BadRequestError) as ctx:
                self.chat([part])
            self.assertNotRegex(str(ctx.exception), r"object at 0x|<_io\.")
        self.assert_400([image_part("ftp://example.com/a.png")], "scheme 'ftp' is not supported", "data URL",
                        "file://")
        flac = audio_file(make_waveform(3, 1.0), fmt="FLAC", subtype="PCM_16")
        self.assert_400([audio_part(self.wav, "mp3")], "input_audio.format is 'mp3'", "a wav file",
                        "set input_audio.format to 'wav'")
        self.assert_400([audio_part(flac, "wav")], "input_audio.format is 'wav'", "a flac file")
        self.assertEqual(self.chat([audio_part(flac, "flac")]).usage.completion_tokens, MAX_NEW)

    def test_placeholders_and_items_must_agree(self):
        img = data_url(make_image(4, 64, 64))
        for text, field in ((f"x {IMG}", "text"), (f"x {AUD} y", "text")):
            r = self.generate({"text": text})
            self.assertEqual(r.status_code, 400, r.text)
            err = r.json()["error"]
            self.assertEqual(err["param"], field)
            self.assertIn("placeholder", err["message"])
            self.assertIn("<|image_pad|>" if "image" in text else "<|audio_pad|>", err["message"])
        r = self.generate({"text": f"x {IMG} {IMG}", "image_data": [img]})  # two placeholders, one image: as before
        self.assertEqual(r.status_code, 400, r.text)
        self.assert_400([text_part(f"describe {IMG}")], "placeholder")  # the same in a chat message
        # images without placeholders: placed at the start, exactly as placeholders written there
        implicit, explicit = self.generate({"text": "Describe.", "image_data": [img]}), \
            self.generate({"text": f"{IMG}Describe.", "image_data": [img]})
        self.assertEqual(implicit.status_code, 200, implicit.text)
        plain = self.generate({"text": "Describe."}).json()["meta_info"]["prompt_tokens"]
        self.assertEqual(implicit.json()["meta_info"]["prompt_tokens"], explicit.json()["meta_info"]["prompt_tokens"])
        self.assertGreater(implicit.json()["meta_info"]["prompt_tokens"], plain + 2)  # the image's tokens are there
        self.assertEqual(implicit.json()["output_ids"], explicit.json()["output_ids"])


if __name__ == "__main__":
    unittest.main()
