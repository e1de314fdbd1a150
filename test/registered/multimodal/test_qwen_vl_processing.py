"""Qwen2.5-VL input processing without a model: our pixels and grids equal HF's Qwen2VL image processor (the PIL
one; the default needs torchvision); a video's patches follow the (t, h/2, w/2, 2, 2) x (C, T, p, p) layout built
here by explicit loops; M-RoPE positions equal HF's get_rope_index where the two rules agree, and after a long video
follow the original rule (continue after the largest position); frame sampling at fps within the frame limits;
corrupt videos, wrong media types and too many items are ValueErrors that say what is wrong."""

import tempfile
import unittest
from types import SimpleNamespace

import numpy as np
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="cpu")

from sglang.srt.multimodal.mm_inputs import MultimodalDataItem  # noqa: E402
from sglang.srt.multimodal.mrope_positions import mrope_positions  # noqa: E402
from sglang.srt.multimodal.qwen_vl_image import QwenVLPixelConfig, patchify, preprocess_frames  # noqa: E402
from sglang.srt.multimodal.video_loader import load_video, sample_indices  # noqa: E402
from sglang.test.mm_fixtures import data_url, make_image  # noqa: E402
from sglang.test.qwen_vl_fixtures import make_random_qwen2_5_vl, make_video, video_data_url  # noqa: E402


def server_args(**kw):
    base = dict(allowed_local_media_path=None, max_image_pixels=None, max_video_frames=64, limits={})
    base.update(kw)
    return SimpleNamespace(mm_item_limits=lambda: base["limits"], **{k: v for k, v in base.items() if k != "limits"})


def item(offset, grid, modality="image", second_per_grid_t=1.0):
    n = grid[0] * grid[1] * grid[2] // 4
    return MultimodalDataItem(torch.zeros(1), "h", offset, n, modality=modality,
                              metadata={"grid_thw": grid, "second_per_grid_t": second_per_grid_t})


class TestImagePixels(unittest.TestCase):
    def test_matches_hf_image_processor(self):
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        cfg = QwenVLPixelConfig(min_pixels=56 * 56, max_pixels=28 * 28 * 30)
        hf = Qwen2VLImageProcessorPil(min_pixels=cfg.min_pixels, max_pixels=cfg.max_pixels)
        # within the limits, over max_pixels, under min_pixels, a thin one, a non-multiple of 28
        for w, h in ((112, 84), (300, 200), (20, 30), (13, 900), (100, 77)):
            img = make_image(w + h, w, h)
            expect = hf(images=[img], return_tensors="pt")
            got, grid = preprocess_frames([img], cfg, repeat_to_temporal_patch=True)
            self.assertEqual(list(grid), expect["image_grid_thw"][0].tolist(), (w, h))
            self.assertLess((got - expect["pixel_values"]).abs().max().item(), 1e-5, (w, h))

    def test_max_image_pixels_caps_the_grid(self):
        cfg = QwenVLPixelConfig(min_pixels=56 * 56, max_pixels=28 * 28 * 30).capped(28 * 28 * 4)
        _, grid = preprocess_frames([make_image(0, 280, 280)], cfg, True)
        self.assertEqual(grid, (1, 4, 4))


class TestVideoPatches(unittest.TestCase):
    def test_layout(self):
        cfg = QwenVLPixelConfig(min_pixels=1, max_pixels=10**6, patch_size=2, merge_size=2, temporal_patch_size=2)
        rng = np.random.default_rng(0)
        frames = rng.standard_normal((3, 3, 8, 4)).astype(np.float32)  # 3 frames -> the last one pads a pair
        patches, (gt, gh, gw) = patchify(frames, cfg)
        self.assertEqual((gt, gh, gw), (2, 4, 2))
        padded = np.concatenate([frames, frames[-1:]])
        rows = []
        for t in range(gt):
            for bh in range(gh // 2):
                for bw in range(gw // 2):
                    for mh in range(2):
                        for mw in range(2):
                            y, x = (bh * 2 + mh) * 2, (bw * 2 + mw) * 2
                            # one patch: channels, then its two frames, then 2x2 pixels
                            patch = padded[2 * t : 2 * t + 2, :, y : y + 2, x : x + 2]  # [T, C, 2, 2]
                            rows.append(patch.transpose(1, 0, 2, 3).ravel())
        np.testing.assert_array_equal(patches.numpy(), np.stack(rows))


class TestMropePositions(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from transformers import AutoConfig, Qwen2_5_VLModel

        cls.tmp = tempfile.TemporaryDirectory()
        make_random_qwen2_5_vl(cls.tmp.name)
        cls.config = AutoConfig.from_pretrained(cls.tmp.name)
        cls.hf = Qwen2_5_VLModel(cls.config)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def hf_positions(self, n, items):
        ids = torch.zeros(1, n, dtype=torch.long)
        types = torch.zeros(1, n, dtype=torch.int)
        for it in items:
            types[0, it.offset : it.end] = 1 if it.modality == "image" else 2
        grids = {m: [list(it.metadata["grid_thw"]) for it in items if it.modality == m] for m in ("image", "video")}
        secs = [it.metadata["second_per_grid_t"] for it in items if it.modality == "video"]
        as_tensor = lambda x: torch.tensor(x) if x else None  # noqa: E731
        pos, delta = self.hf.get_rope_index(ids, types, image_grid_thw=as_tensor(grids["image"]),
                                            video_grid_thw=as_tensor(grids["video"]), second_per_grid_ts=as_tensor(secs))
        return pos[:, 0], int(delta)

    def test_equal_to_hf_for_images_and_short_videos(self):
        # image 6x8 patches at 3, video (2 temporal patches 1 s apart, 3x2 units) at 20, image 4x14 at 35
        items = [item(3, (1, 6, 8)), item(20, (2, 4, 6), "video", 1.0), item(35, (1, 4, 14))]
        n = 35 + 14 + 5
        ours, delta = mrope_positions(n, items, 2, tokens_per_second=2)
        theirs, hf_delta = self.hf_positions(n, items)
        torch.testing.assert_close(ours, theirs)
        self.assertEqual(delta, hf_delta)

    def test_long_video_continues_after_its_largest_position(self):
        # 5 temporal patches 2 s apart at 2 tokens per second: t positions 0, 4, 8, 12, 16 past a 2x2-unit grid
        v = item(2, (5, 4, 4), "video", 2.0)
        ours, delta = mrope_positions(2 + 20 + 3, [v], 2, tokens_per_second=2)
        self.assertEqual(ours[:, 2:22].amax(dim=1).tolist(), [2 + 16, 2 + 1, 2 + 1])
        self.assertEqual(ours[:, 22].tolist(), [19, 19, 19])
        self.assertEqual(delta, 21 + 1 - 25)


class TestPositionsPastThePrompt(unittest.TestCase):
    def test_chunk_across_the_prompt_end(self):
        # a retracted request re-prefills its prompt and outputs: the table, then i + delta on all axes
        from sglang.srt.multimodal.mm_inputs import MultimodalInputs

        positions, delta = mrope_positions(10, [item(2, (1, 4, 4))], 2, 2.0)
        mm = MultimodalInputs(list(range(10)), [], positions, delta)
        got = mm.positions_3d(8, 13)
        self.assertTrue(torch.equal(got[:, :2], positions[:, 8:10]))
        self.assertEqual(got[:, 2:].tolist(), [[10 + delta, 11 + delta, 12 + delta]] * 3)
        self.assertEqual(int(positions.max()) + 1, 10 + delta)  # decode continues right after the prompt


class TestVideoLoading(unittest.TestCase):
    def test_sampling(self):
        self.assertEqual(len(sample_indices(300, 30.0, 2.0, 4, 768, 2)), 20)  # 10 s at 2 fps
        idx = sample_indices(300, 30.0, 2.0, 4, 8, 2)  # over --max-video-frames: 8, spread uniformly
        self.assertEqual(idx, [int(i * 300 / 8) for i in range(8)])
        self.assertEqual(len(sample_indices(10, 4.0, 2.0, 4, 768, 2)), 4)  # 2.5 s -> 5 -> min 4 frames, even
        self.assertEqual(len(sample_indices(7, 30.0, 2.0, 4, 768, 2)), 4)  # a short clip: min_frames
        self.assertEqual(len(sample_indices(1, 30.0, 2.0, 4, 768, 2)), 1)

    def test_load_and_errors(self):
        v = load_video(make_video(0, num_frames=8, fps=4), None, 2.0, 4, 64)
        self.assertEqual((len(v.frames), v.total_frames, v.source_fps, v.size), (4, 8, 4.0, (64, 48)))
        self.assertAlmostEqual(v.sampled_fps, 2.0)
        cases = {
            b"not a video at all" * 10: "could not be decoded",
            make_video(0)[:300]: "could not be decoded",
            data_url(make_image(0)): "video/* type is required",
            "data:video/mp4;base64,@@@": "not valid base64",
            "file:///etc/hostname": "not allowed",
        }
        for data, fragment in cases.items():
            with self.assertRaises(ValueError) as ctx:
                load_video(data, None, 2.0, 4, 64)
            self.assertIn(fragment, str(ctx.exception), str(data)[:40])


class TestProcessorLimits(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from transformers import AutoConfig

        cls.tmp = tempfile.TemporaryDirectory()
        make_random_qwen2_5_vl(cls.tmp.name)
        cls.config = AutoConfig.from_pretrained(cls.tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def proc(self, **kw):
        from sglang.srt.multimodal.processors.qwen2_5_vl import Qwen2_5_VLProcessor

        return Qwen2_5_VLProcessor(self.config, self.tmp.name, server_args(**kw))

    def test_item_limits_and_frame_cap(self):
        p = self.proc(limits={"video": 1, "image": 2}, max_video_frames=2)
        clip = video_data_url(make_video(0, num_frames=16, fps=4))
        with self.assertRaises(ValueError) as ctx:
            p.process([5], None, [clip, clip])
        self.assertIn("2 video items", str(ctx.exception))
        self.assertIn("--limit-mm-data-per-request", str(ctx.exception))
        mm = p.process([5], [data_url(make_image(0))], [clip])  # one video: sampled at 2 frames, not refused
        self.assertEqual(mm.mm_items[1].metadata["num_frames"], 2)
        self.assertEqual(mm.mm_items[1].metadata["grid_thw"][0], 1)
        # no pad tokens in the prompt: <|vision_start|><|pad|><|vision_end|> per item at the start
        self.assertEqual(mm.input_ids[0], p.vision_start_id)
        self.assertEqual(mm.mrope_positions.shape, (3, len(mm.input_ids)))

    def test_token_count_mismatch(self):
        p = self.proc()
        with self.assertRaises(ValueError) as ctx:
            p.process([p.image_token_id, 5, p.image_token_id], [data_url(make_image(0))])
        self.assertIn("2 image tokens but 1 images", str(ctx.exception))


if __name__ == "__main__":
    unittest.main()
