"""Our Qwen2.5-VL vs HF transformers' Qwen2_5_VLForConditionalGeneration (fp32) on the same random-weight
checkpoint, through sglang.Engine: greedy tokens equal for one image, two images of different sizes, a video, and
an image + a video in one request; with chunks of 7 tokens cutting through every item (embedding cache off, so
each chunk re-encodes and takes its own rows and M-RoPE positions); and with a prefix-cache hit that starts the
extend inside a video, whose embedding then comes from the cache. The tower alone equals HF's image / video
features (window attention over partial windows: 112x84 is 4x3 merge units, windows of 2x2)."""

import gc
import tempfile
import unittest

import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=50, suite="cpu")

from sglang.srt.entrypoints.engine import Engine  # noqa: E402
from sglang.test.mm_fixtures import data_url, make_image, png_bytes  # noqa: E402
from sglang.test.qwen_vl_fixtures import (  # noqa: E402
    hf_qwen_vl_greedy,
    make_random_qwen2_5_vl,
    make_video,
    video_data_url,
)

MAX_NEW = 8
GREEDY = {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}
IMG = "<|vision_start|><|image_pad|><|vision_end|>"
VID = "<|vision_start|><|video_pad|><|vision_end|>"


def video(seed, frames=8):
    # 84x56 frames: 3x2 merge units; 8 frames at 4 fps sampled at 2 fps -> 4 frames, 2 temporal patches 1 s apart
    return video_data_url(make_video(seed, num_frames=frames, width=84, height=56))


class QwenVLReferenceBase:
    engine_kwargs = {}

    @classmethod
    def setUpClass(cls):
        from transformers import Qwen2_5_VLForConditionalGeneration

        cls.tmp = tempfile.TemporaryDirectory()
        cls.model_dir = make_random_qwen2_5_vl(cls.tmp.name, video_max_frames=32)  # > the 16-frame video chunk
        cls.hf = Qwen2_5_VLForConditionalGeneration.from_pretrained(cls.model_dir, dtype=torch.float32).eval()
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

    def hf_greedy(self, ids, images=None, videos=None):
        mm = self.proc.process(ids, images, videos)
        return hf_qwen_vl_greedy(self.hf, mm, self.proc.image_token_id, self.proc.video_token_id, MAX_NEW)

    def check(self, text, images=None, videos=None):
        ids = self.tok.encode(text)
        out = self.engine.generate(input_ids=ids, image_data=images, video_data=videos, sampling_params=GREEDY)
        self.assertEqual(out["output_ids"], self.hf_greedy(ids, images, videos))
        return out

    def test_one_image(self):
        self.check(f"Describe {IMG} in detail.", [data_url(make_image(0, 112, 84))])

    def test_two_images_of_different_sizes(self):
        self.check(f"{IMG} versus {IMG}: which is brighter?",
                   [data_url(make_image(1, 112, 84)), data_url(make_image(2, 56, 140))])

    def test_video(self):
        self.check(f"Video: {VID} What happens?", videos=[video(0)])

    def test_image_and_video_in_one_request(self):
        self.check(f"Picture {IMG} then clip {VID} compare.", [png_bytes(make_image(3, 64, 64))], [video(1)])


class TestQwen2_5_VL(QwenVLReferenceBase, unittest.TestCase):
    def test_tower_matches_hf_features(self):
        for item in (self.proc._image_item(make_image(5, 112, 84)), self.proc._video_item(video(2))):
            grid = torch.tensor([item.metadata["grid_thw"]])
            with torch.no_grad():
                ours = self.runner.model.encode_items([item])[0]
                if item.modality == "image":
                    ref = self.hf.get_image_features(pixel_values=item.feature, image_grid_thw=grid)
                else:
                    ref = self.hf.get_video_features(pixel_values_videos=item.feature, video_grid_thw=grid)
            torch.testing.assert_close(ours, ref.pooler_output[0], rtol=1e-4, atol=1e-5)

    def test_prefix_cache_inside_a_video_and_embedding_cache_hit(self):
        # The prompt ends with the video's pad tokens and <|vision_end|>: the second time the radix cache covers
        # all but the last token, so the extend is one token whose M-RoPE position comes from the prompt's table.
        ids = self.tok.encode(f"Watch {VID}")
        v = video(3)
        first = self.engine.generate(input_ids=ids, video_data=v, sampling_params=GREEDY)
        stats = self.runner.model.encoder_stats
        encoded = stats.num_images
        second = self.engine.generate(input_ids=ids, video_data=v, sampling_params=GREEDY)
        n_video = self.proc.process(ids, None, [v]).mm_items[0].num_tokens
        self.assertEqual(second["meta_info"]["cached_tokens"], len(ids) - 1 + n_video - 1)
        self.assertEqual(stats.num_images, encoded, "a cached prefix covering the video must not re-encode it")
        self.assertEqual(first["output_ids"], second["output_ids"])
        self.assertEqual(second["output_ids"], self.hf_greedy(ids, None, [v]))
        # the same prompt with an image first: nothing is shared after the text, the video embedding is cached
        ids2 = self.tok.encode(f"{IMG} Watch {VID} now")
        self.check(f"{IMG} Watch {VID} now", [data_url(make_image(6, 56, 56))], [v])
        self.assertGreater(len(ids2), len(ids))
        self.assertEqual(stats.num_images, encoded + 1, "only the new image is encoded; the video hits the cache")

    def test_long_video_is_encoded_in_planned_chunks(self):
        # 40 frames at 4 fps sampled at 2 fps -> 20 frames = 10 temporal slices; the planned chunk is 16 frames
        # (mem_plan.encoder_inputs.VIDEO_CHUNK_FRAMES) = 8 slices -> chunks of 8 and 2 slices, each one tower call
        # of its own and one unit of the video gate. The chunks' embeddings are HF's for the whole video. (Tokens
        # are not compared here: past a video whose time span exceeds its spatial span, transformers 5's position
        # rule differs from Qwen2.5-VL's original one, which this runtime follows -- test_qwen_vl_processing.py.)
        v = video(7, frames=40)
        ids = self.tok.encode(f"Long clip {VID} summary.")
        item = self.proc.process(ids, None, [v]).mm_items[0]
        self.assertEqual(item.metadata["grid_thw"][0], 10)
        self.assertEqual(item.chunk_rows(), [(0, 48), (48, 60)])
        self.assertEqual(self.runner.model.encoder_workloads["video"].chunk_frames, 16)
        with torch.no_grad():
            ours = torch.cat(self.runner.model.encode_items([item.chunk(0), item.chunk(1)]))
            ref = self.hf.get_video_features(pixel_values_videos=item.feature,
                                             video_grid_thw=torch.tensor([item.metadata["grid_thw"]]))
        torch.testing.assert_close(ours, ref.pooler_output[0], rtol=1e-4, atol=1e-5)
        stats = self.runner.model.encoder_stats
        before = stats.num_images
        out = self.engine.generate(input_ids=ids, video_data=v, sampling_params=GREEDY)
        self.assertEqual(len(out["output_ids"]), MAX_NEW)
        self.assertEqual(stats.num_images - before, 2, "one tower call per planned chunk")
        self.assertGreaterEqual(self.runner.encoder_admission.max_units_per_batch["video"], 1)

    def test_text_only_request(self):
        ids = self.tok.encode("Plain text, no pictures.")
        out = self.engine.generate(input_ids=ids, sampling_params=GREEDY)
        x = torch.tensor([ids])
        with torch.no_grad():
            y = self.hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=MAX_NEW,
                                 min_new_tokens=MAX_NEW, pad_token_id=0)
        self.assertEqual(out["output_ids"], y[0, len(ids):].tolist())


class TestQwen2_5_VLChunkedPrefill(QwenVLReferenceBase, unittest.TestCase):
    """Chunks of 7 tokens split every item (12-, 14- and 12-token items) at different phases."""

    engine_kwargs = {"chunked_prefill_size": 7, "mm_embedding_cache_mb": 0, "disable_radix_cache": True}

    def test_image_and_video_in_one_request(self):
        super().test_image_and_video_in_one_request()
        self.assertGreater(self.runner.model.encoder_stats.num_images, 2)


if __name__ == "__main__":
    unittest.main()
