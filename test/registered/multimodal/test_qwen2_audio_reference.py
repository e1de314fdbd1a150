"""Our Qwen2-Audio vs HF transformers' Qwen2AudioForConditionalGeneration (fp32) on the same random-weight checkpoint,
through sglang.Engine. HF runs on its own features (WhisperFeatureExtractor of the same decoded samples) and its own
<|AUDIO|> token counts. Greedy tokens equal for one audio (wav), two audios (a wav + a 44.1 kHz stereo flac, mixed
down and resampled to 16 kHz), with chunks of 16 tokens cutting through both audios (embedding cache off, so each
chunk re-encodes and takes its own rows), and for a second request whose cached prefix covers the audio. Two
different clips give different tokens (the audio reaches the LM). The measured encoder_audio term is <= its formula,
and the plan's weights equal the model's parameter bytes."""

import gc
import tempfile
import unittest

import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=70, suite="cpu")

from sglang.srt.entrypoints.engine import Engine  # noqa: E402
from sglang.srt.multimodal.audio_loader import load_audio  # noqa: E402
from sglang.test.audio_fixtures import (  # noqa: E402
    audio_data_url,
    audio_file,
    hf_qwen2_audio_greedy,
    make_random_qwen2_audio,
    tone,
)

MAX_NEW = 8
GREEDY = {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}
AUD = "<|audio_bos|><|AUDIO|><|audio_eos|>"


def prompt(n_audio: int, question: str = "What do you hear?") -> str:
    head = "".join(f"Audio {i + 1}: {AUD}\n" for i in range(n_audio))
    return f"<|im_start|>user\n{head}{question}<|im_end|>\n<|im_start|>assistant\n"


class Qwen2AudioReferenceBase:
    engine_kwargs = {}

    @classmethod
    def setUpClass(cls):
        from transformers import Qwen2AudioForConditionalGeneration

        cls.tmp = tempfile.TemporaryDirectory()
        cls.model_dir = make_random_qwen2_audio(cls.tmp.name)
        cls.hf = Qwen2AudioForConditionalGeneration.from_pretrained(cls.model_dir, dtype=torch.float32).eval()
        cls.engine = Engine(model_path=cls.model_dir, dtype="float32", max_total_tokens=4096,
                            max_running_requests=8, random_seed=0, log_level="warning", **cls.engine_kwargs)
        cls.runner = cls.engine.scheduler.model_runner
        cls.proc = cls.runner.mm_processor
        cls.wav = audio_file(tone(2.5, seed=1))
        cls.flac = audio_file(tone(4.013, rate=44100, channels=2, seed=2), rate=44100, fmt="FLAC", subtype="PCM_16")

    @classmethod
    def tearDownClass(cls):
        cls.engine.shutdown()
        del cls.hf
        gc.collect()
        cls.tmp.cleanup()

    def check(self, text: str, files: list):
        urls = [audio_data_url(f) for f in files]
        out = self.engine.generate(text, GREEDY, audio_data=urls)
        mm = self.proc.process(self.engine.tokenizer.encode(text), audio_data=urls)
        samples = [load_audio(u, None, 16000, 30.0) for u in urls]
        ref = hf_qwen2_audio_greedy(self.hf, mm, self.proc.audio_token_id, samples, MAX_NEW)
        self.assertEqual(out["output_ids"], ref)
        return out


class TestQwen2AudioEngine(Qwen2AudioReferenceBase, unittest.TestCase):
    def test_one_audio(self):
        out = self.check(prompt(1), [self.wav])
        self.assertGreater(out["meta_info"]["prompt_tokens"], 62)  # 2.5 s -> 250 mel frames -> 62 audio tokens

    def test_two_audios_resampled_stereo(self):
        self.check(prompt(2), [self.wav, self.flac])

    def test_audio_changes_the_output(self):
        other = audio_file(tone(2.5, seed=5))
        a = self.engine.generate(prompt(1), GREEDY, audio_data=audio_data_url(self.wav))["output_ids"]
        b = self.engine.generate(prompt(1), GREEDY, audio_data=audio_data_url(other))["output_ids"]
        self.assertNotEqual(a, b)

    def test_cached_prefix_covers_the_audio(self):
        self.check(prompt(1, "Describe it."), [self.flac])
        out = self.check(prompt(1, "Describe it again."), [self.flac])
        self.assertGreater(out["meta_info"]["cached_tokens"], 100)  # 4 s: 100 audio tokens, served from the cache

    def test_encoder_term_and_weights(self):
        from sglang.srt.mem_plan.dtypes import dtype_bytes

        (term,) = self.runner.multimodal.encoder_terms
        work = self.runner.multimodal.encoder_workloads["audio"]
        self.assertEqual((term.modality, term.source, work.mel_frames), ("audio", "measured", 3000))
        formula = work.peak_bytes(dtype_bytes("float32"), fused_attention=False)
        self.assertLessEqual(term.num_bytes, formula)
        self.assertGreater(term.num_bytes, 0)
        shape = self.runner.model_config.shape
        params = sum(p.numel() * p.element_size() for p in self.runner.model.parameters())
        self.assertEqual(shape.weight_bytes(dtype="float32") - shape.rope_cache_bytes(4), params)


class TestQwen2AudioChunked(Qwen2AudioReferenceBase, unittest.TestCase):
    engine_kwargs = {"chunked_prefill_size": 16, "mm_embedding_cache_mb": 0}

    def test_chunks_cut_through_two_audios(self):
        self.check(prompt(2), [self.wav, self.flac])
        self.assertGreater(self.runner.model.encoder_stats.num_calls, 2)


if __name__ == "__main__":
    unittest.main()
