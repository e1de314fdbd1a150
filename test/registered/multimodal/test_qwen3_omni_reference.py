"""Our Qwen3-Omni Thinker vs HF transformers' Qwen3OmniMoeThinkerForConditionalGeneration (fp32) on the same
random-weight checkpoint (2-layer MoE of 8 experts, interleaved M-RoPE, a 3-block vision tower with deepstack after
blocks 0 and 1, a 2-layer audio tower with windows of two conv chunks), through sglang.Engine: greedy tokens equal
for text only, one image, a video (two planned encoder chunks), an audio, an image + an audio and an image + a video
in one request. HF's audio features come from its own WhisperFeatureExtractor (as Qwen3OmniMoeProcessor calls it),
ours from the server's log-mel. Also: chunks of 7 tokens cutting through every item (embedding cache and radix cache
off, so each chunk re-encodes and adds only its own rows and deepstack rows); a prefix-cache hit that starts the
extend inside an image; the full Qwen3-Omni checkpoint layout (thinker.* names, talker tensors skipped); the towers
equal HF's features (vision with deepstack, audio); chunked encoding equals whole encoding."""

import gc
import tempfile
import unittest

import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=100, suite="cpu")

from sglang.srt.entrypoints.engine import Engine  # noqa: E402
from sglang.test.mm_fixtures import data_url, make_image  # noqa: E402
from sglang.test.qwen3_omni_fixtures import (  # noqa: E402
    hf_omni_greedy,
    make_random_qwen3_omni_thinker,
    make_waveform,
    whisper_log_mel,
)
from sglang.test.qwen_vl_fixtures import make_video, video_data_url  # noqa: E402

MAX_NEW = 8
GREEDY = {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}
IMG = "<|vision_start|><|image_pad|><|vision_end|>"
VID = "<|vision_start|><|video_pad|><|vision_end|>"
AUD = "<|audio_start|><|audio_pad|><|audio_end|>"


def video(seed, frames=8):
    # 64x64 frames: 2x2 merge units; at 4 fps sampled at 2 fps -> frames / 2 frames, temporal patches 1 s apart
    return video_data_url(make_video(seed, num_frames=frames, width=64, height=64))


def audio(seed, seconds):
    return make_waveform(seed, seconds), 16000


class OmniReferenceBase:
    engine_kwargs = {}
    full_checkpoint = False

    @classmethod
    def setUpClass(cls):
        from transformers import Qwen3OmniMoeThinkerForConditionalGeneration

        cls.tmp = tempfile.TemporaryDirectory()
        ref_dir = make_random_qwen3_omni_thinker(cls.tmp.name + "/thinker", video_max_frames=32)
        cls.hf = Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained(ref_dir, dtype=torch.float32).eval()
        cls.model_dir = ref_dir
        if cls.full_checkpoint:  # the same weights (same seed) in the full Qwen3-Omni layout
            cls.model_dir = make_random_qwen3_omni_thinker(cls.tmp.name + "/full", full_checkpoint=True,
                                                           video_max_frames=32)
        cls.engine = Engine(model_path=cls.model_dir, dtype="float32", max_total_tokens=4096,
                            max_running_requests=8, random_seed=0, log_level="warning", **cls.engine_kwargs)
        cls.runner = cls.engine.scheduler.model_runner
        cls.proc = cls.runner.mm_processor
        cls.tok = cls.engine.tokenizer

    @classmethod
    def tearDownClass(cls):
        cls.engine.shutdown()
        del cls.hf
        gc.collect()
        cls.tmp.cleanup()

    def hf_greedy(self, ids, images=None, videos=None, audios=None):
        mm = self.proc.process(ids, images, videos, audios)
        hf_feats = [whisper_log_mel(w) for w, _ in audios] if audios else None
        return hf_omni_greedy(self.hf, mm, MAX_NEW, hf_feats)

    def check(self, text, images=None, videos=None, audios=None):
        ids = self.tok.encode(text)
        out = self.engine.generate(input_ids=ids, image_data=images, video_data=videos, audio_data=audios,
                                   sampling_params=GREEDY)
        self.assertEqual(out["output_ids"], self.hf_greedy(ids, images, videos, audios))
        return out

    def test_image_and_audio_in_one_request(self):
        self.check(f"Look {IMG} and listen {AUD} then answer.", [data_url(make_image(3, 96, 64))],
                   audios=[audio(2, 2.3)])


class TestQwen3OmniThinker(OmniReferenceBase, unittest.TestCase):
    def test_text_only(self):
        ids = self.tok.encode("Plain text, no media at all.")
        out = self.engine.generate(input_ids=ids, sampling_params=GREEDY)
        x = torch.tensor([ids])
        with torch.no_grad():
            y = self.hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=MAX_NEW,
                                 min_new_tokens=MAX_NEW, pad_token_id=0)
        self.assertEqual(out["output_ids"], y[0, len(ids):].tolist())

    def test_one_image(self):
        self.check(f"Describe {IMG} in detail.", [data_url(make_image(0, 128, 96))])

    def test_video_in_two_encoder_chunks(self):
        v = video(0, frames=40)  # 20 sampled frames -> 10 temporal slices; chunks of 16 frames: 8 + 2 slices
        item = self.proc.process(self.tok.encode(VID), None, [v]).mm_items[0]
        self.assertEqual(item.metadata["grid_thw"], (10, 4, 4))
        self.assertEqual(item.encoder_chunks, [(0, 32), (32, 40)])
        before = self.runner.model.encoder_stats.num_calls
        self.check(f"Video: {VID} What happens?", videos=[v])
        self.assertEqual(self.runner.model.encoder_stats.num_calls - before, 2, "one tower call per chunk")

    def test_audio(self):
        self.check(f"Listen {AUD} and transcribe.", audios=[audio(0, 1.7)])

    def test_image_and_video_in_one_request(self):
        self.check(f"Picture {IMG} then clip {VID} compare.", [data_url(make_image(4, 64, 64))], [video(1)])

    def test_towers_match_hf_features(self):
        model = self.runner.model
        img = self.proc._image_item(make_image(5, 128, 96))
        grid = torch.tensor([img.metadata["grid_thw"]])
        wave = make_waveform(3, 3.1)
        feats = whisper_log_mel(wave)
        with torch.no_grad():
            ours = model.encode_chunks([(img, 0, 1)])[0]
            ref = self.hf.model.get_image_features(pixel_values=img.feature, image_grid_thw=grid)
            h = self.hf.config.text_config.hidden_size
            torch.testing.assert_close(ours[:, :h], ref.pooler_output[0], rtol=1e-4, atol=1e-5)
            for i, d in enumerate(ref.deepstack_features):
                torch.testing.assert_close(ours[:, h * (i + 1):h * (i + 2)], d[0], rtol=1e-4, atol=1e-5)
            aud = self.proc._audio_item((wave, 16000))
            ours_a = model.encode_chunks([(aud, 0, 1)])[0]
            ref_a = self.hf.model.get_audio_features(feats[None], torch.ones(1, feats.shape[1], dtype=torch.long))
            torch.testing.assert_close(ours_a, ref_a.last_hidden_state, rtol=1e-4, atol=1e-4)

    def test_chunked_encoding_equals_whole(self):
        model = self.runner.model
        v = self.proc._video_item(video(2, frames=40))
        a = self.proc._audio_item(audio(4, 5.3))  # 530 mel frames; chunks of 200 (whole windows): 26 + 26 + 17 tokens
        a.metadata["chunk_mel_frames"] = 200
        a.encoder_chunks = [(0, 26), (26, 52), (52, a.num_tokens)]
        with torch.no_grad():
            for item in (v, a):
                n = len(item.encoder_chunks)
                parts = torch.cat(model.encode_chunks([(item, i, n) for i in range(n)]))
                whole = model.encode_chunks([(item, 0, 1)])[0]
                self.assertEqual(parts.shape, whole.shape)
                torch.testing.assert_close(parts, whole, rtol=1e-5, atol=1e-6)

    def test_prefix_cache_inside_an_image(self):
        # The prompt ends with the image's pad tokens and <|vision_end|>: the second time the radix cache covers
        # all but the last token, so the extend is one token with no item rows (no encoder, no deepstack rows)
        ids = self.tok.encode(f"See {IMG}")
        img = [data_url(make_image(7, 96, 96))]
        first = self.engine.generate(input_ids=ids, image_data=img, sampling_params=GREEDY)
        encoded = self.runner.model.encoder_stats.num_images
        second = self.engine.generate(input_ids=ids, image_data=img, sampling_params=GREEDY)
        n_img = self.proc.process(ids, img).mm_items[0].num_tokens
        self.assertEqual(second["meta_info"]["cached_tokens"], len(ids) - 1 + n_img - 1)
        self.assertEqual(self.runner.model.encoder_stats.num_images, encoded)
        self.assertEqual(first["output_ids"], second["output_ids"])
        self.assertEqual(second["output_ids"], self.hf_greedy(ids, img))


class TestQwen3OmniThinkerChunkedPrefill(OmniReferenceBase, unittest.TestCase):
    """Chunks of 7 tokens split the image (6 tokens), the audio (30) and the video's chunks at different phases."""

    engine_kwargs = {"chunked_prefill_size": 7, "mm_embedding_cache_mb": 0, "disable_radix_cache": True}

    def test_image_audio_video_in_one_request(self):
        self.check(f"A {IMG} b {AUD} c {VID} d", [data_url(make_image(8, 96, 64))], [video(3, frames=40)],
                   [audio(5, 2.3)])
        self.assertGreater(self.runner.model.encoder_stats.num_calls, 4)


class TestQwen3OmniFullCheckpoint(OmniReferenceBase, unittest.TestCase):
    """The full Qwen3OmniMoeForConditionalGeneration layout: thinker.* tensors, talker / code2wav skipped."""

    full_checkpoint = True


if __name__ == "__main__":
    unittest.main()
