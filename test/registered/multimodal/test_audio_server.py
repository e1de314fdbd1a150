"""Qwen2-Audio end to end through the HTTP server with the real openai client: a chat with OpenAI's input_audio part
(a wav synthesised here) and one with SGLang's audio_url part give HF transformers' greedy tokens (fp32, HF's own
features); /generate takes audio_data; an over-long clip (naming --max-audio-seconds and the clip's duration),
corrupt audio, an unknown input_audio format and more audios than --limit-mm-data-per-request each get a 400, and
the server keeps serving."""

import os
import tempfile
import unittest

import openai
import requests
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=40, suite="cpu")

from sglang.srt.multimodal.audio_loader import load_audio  # noqa: E402
from sglang.srt.multimodal.processors.qwen2_audio import Qwen2AudioProcessor  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402
from sglang.test.audio_fixtures import (  # noqa: E402
    audio_data_url,
    audio_file,
    b64,
    hf_qwen2_audio_greedy,
    make_random_qwen2_audio,
    tone,
)
from sglang.test.test_utils import openai_client, popen_launch_server  # noqa: E402

MAX_NEW = 6
MAX_SECONDS = 5
PLACEHOLDER = "<|audio_bos|><|AUDIO|><|audio_eos|>"


def input_audio(data: bytes, fmt: str = "wav"):
    return {"type": "input_audio", "input_audio": {"data": b64(data), "format": fmt}}


def audio_url(url: str):
    return {"type": "audio_url", "audio_url": {"url": url}}


class TestAudioServer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from transformers import AutoConfig, AutoTokenizer, Qwen2AudioForConditionalGeneration

        cls.tmp = tempfile.TemporaryDirectory()
        cls.model_dir = os.path.join(cls.tmp.name, "model")
        make_random_qwen2_audio(cls.model_dir)
        cls.server = popen_launch_server(
            cls.model_dir,
            other_args=["--max-total-tokens", "4096", "--max-running-requests", "8", "--context-length", "1024",
                        "--max-audio-seconds", str(MAX_SECONDS), "--limit-mm-data-per-request", '{"audio": 2}',
                        "--random-seed", "0", "--dtype", "float32"])
        cls.client = openai_client(cls.server.base_url, timeout=60)
        cls.model = cls.client.models.list().data[0].id
        cls.hf = Qwen2AudioForConditionalGeneration.from_pretrained(cls.model_dir, dtype=torch.float32).eval()
        cls.tok = AutoTokenizer.from_pretrained(cls.model_dir)
        cls.proc = Qwen2AudioProcessor(AutoConfig.from_pretrained(cls.model_dir), cls.model_dir,
                                       ServerArgs(model_path=cls.model_dir))
        cls.wav = audio_file(tone(2.0, seed=3), subtype="PCM_16")

    @classmethod
    def tearDownClass(cls):
        cls.server.kill()
        cls.tmp.cleanup()

    def chat(self, parts, **kw):
        return self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": parts}], max_tokens=MAX_NEW, temperature=0,
            extra_body={"ignore_eos": True}, **kw)

    def reference(self, text_ids, audios):
        mm = self.proc.process(text_ids, audio_data=audios)
        samples = [load_audio(a, None, 16000, 30.0) for a in audios]
        return mm, hf_qwen2_audio_greedy(self.hf, mm, self.proc.audio_token_id, samples, MAX_NEW)

    def chat_reference(self, question, audios):
        text = self.tok.apply_chat_template([{"role": "user", "content": PLACEHOLDER + question}], tokenize=False,
                                            add_generation_prompt=True)
        return self.reference(self.tok.encode(text, add_special_tokens=False), audios)

    def test_input_audio_and_audio_url_equal_hf(self):
        mm, ref = self.chat_reference("What is this?", [audio_data_url(self.wav)])
        for part in (input_audio(self.wav), audio_url(audio_data_url(self.wav))):
            out = self.chat([part, {"type": "text", "text": "What is this?"}])
            self.assertEqual(out.usage.prompt_tokens, len(mm.input_ids))
            self.assertEqual(out.usage.completion_tokens, MAX_NEW)
            self.assertEqual(out.choices[0].message.content, self.tok.decode(ref))

    def test_generate_with_audio_data(self):
        url = audio_data_url(self.wav)
        _, ref = self.reference(self.tok.encode("Listen: <|AUDIO|> Now"), [url])
        r = requests.post(f"{self.server.base_url}/generate", timeout=60, json={
            "text": "Listen: <|AUDIO|> Now", "audio_data": url,
            "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}})
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(r.json()["output_ids"], ref)

    def assert_400(self, parts, *needles):
        with self.assertRaises(openai.BadRequestError) as ctx:
            self.chat(parts)
        self.assertEqual(ctx.exception.status_code, 400)
        for needle in needles:
            self.assertIn(needle, str(ctx.exception))

    def test_bad_audio_is_400_and_server_keeps_serving(self):
        self.assert_400([input_audio(audio_file(tone(6.5)))], "6.50 s", "--max-audio-seconds", f"{MAX_SECONDS} s")
        self.assert_400([input_audio(b"RIFF" + bytes(200))], "could not be decoded as audio")
        self.assert_400([input_audio(self.wav, fmt="midi")], "input_audio.format")
        self.assert_400([audio_url("https://example.com/a.wav")], "Remote audio URLs")
        self.assert_400([input_audio(self.wav)] * 3, "3 audio items", "--limit-mm-data-per-request")
        r = requests.post(f"{self.server.base_url}/generate", timeout=60, json={
            "text": "x", "audio_data": "data:audio/wav;base64,AAAA", "sampling_params": {"max_new_tokens": 1}})
        self.assertEqual(r.status_code, 400, r.text)
        self.assertEqual(requests.get(f"{self.server.base_url}/health", timeout=10).status_code, 200)
        self.assertEqual(self.chat([input_audio(self.wav)] * 2).usage.completion_tokens, MAX_NEW)


if __name__ == "__main__":
    unittest.main()
