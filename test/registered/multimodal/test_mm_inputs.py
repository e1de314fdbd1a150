"""Multimodal inputs without a model: image loading errors, preprocessing limits, token expansion, the embedding
cache's byte budget, and encoder admission (how a prefill batch is cut to the reservation)."""

import base64
import os
import struct
import tempfile
import unittest
import zlib
from types import SimpleNamespace

import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="cpu")

from sglang.srt.mem_plan.encoder import EncoderBudget  # noqa: E402
from sglang.srt.multimodal.embedding_cache import MultiModalEmbeddingCache  # noqa: E402
from sglang.srt.multimodal.encoder_admission import EncoderAdmission  # noqa: E402
from sglang.srt.multimodal.image_loader import load_image  # noqa: E402
from sglang.srt.multimodal.image_processing import ImageProcessorConfig, preprocess_image  # noqa: E402
from sglang.srt.multimodal.mm_inputs import MultimodalDataItem, MultimodalInputs  # noqa: E402
from sglang.srt.multimodal.processors.llava import LlavaImageProcessor  # noqa: E402
from sglang.test.mm_fixtures import data_url, make_image, png_bytes  # noqa: E402

IMAGE_TOKEN = 99


def zero_size_png() -> bytes:
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", 0, 10, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def hf_config(tower="clip", image_size=32, patch=8, strategy="default"):
    vision = SimpleNamespace(model_type=f"{tower}_vision_model", image_size=image_size, patch_size=patch)
    return SimpleNamespace(image_token_index=IMAGE_TOKEN, vision_config=vision, vision_feature_select_strategy=strategy,
                           text_config=SimpleNamespace(vocab_size=1000, bos_token_id=1))


def processor(model_dir="/nonexistent", max_image_pixels=None, allowed=None, **kw):
    args = SimpleNamespace(allowed_local_media_path=allowed, max_image_pixels=max_image_pixels)
    return LlavaImageProcessor(hf_config(**kw), model_dir, args)


class TestImageErrors(unittest.TestCase):
    def assertRejects(self, item, fragment, **kw):
        with self.assertRaises(ValueError) as ctx:
            processor(**kw).process([1, IMAGE_TOKEN, 5], [item])
        self.assertIn(fragment, str(ctx.exception))

    def test_malformed_base64(self):
        self.assertRejects("data:image/png;base64,@@not*base64@@", "not valid base64")
        self.assertRejects("data:image/png;base64,", "empty")
        self.assertRejects("data:image/png,rawbytes", "data:image/png;base64,")

    def test_non_image_bytes(self):
        self.assertRejects(b"definitely not a picture", "could not be decoded as an image")
        self.assertRejects("data:image/png;base64," + base64.b64encode(b"plain text").decode(), "could not be decoded")
        self.assertRejects("data:text/plain;base64,aGVsbG8=", "image/* type is required")

    def test_zero_size(self):
        self.assertRejects(zero_size_png(), "zero size (0x10)")
        self.assertRejects(data_url_of(zero_size_png()), "zero size")

    def test_oversized_without_resize(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "preprocessor_config.json"), "w") as f:
                f.write('{"do_resize": false}')
            self.assertRejects(data_url(make_image(0, 64, 64)), "over this server's limit of 1,024 pixels",
                               model_dir=d, max_image_pixels=32 * 32)
            # within the limit and of the tower's size: accepted as is
            mm = processor(model_dir=d, max_image_pixels=32 * 32).process([IMAGE_TOKEN], [make_image(0, 32, 32)])
            self.assertEqual(tuple(mm.mm_items[0].pixel_values.shape), (3, 32, 32))

    def test_oversized_with_resize_is_downscaled(self):
        p = processor(max_image_pixels=48 * 48)
        mm = p.process([IMAGE_TOKEN], [make_image(0, 300, 200)])
        self.assertEqual(tuple(mm.mm_items[0].pixel_values.shape), (3, 32, 32))
        self.assertEqual(mm.mm_items[0].image_size, (300, 200))

    def test_local_paths(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "a.png")
            make_image(1).save(path)
            self.assertRejects(path, "not allowed")
            processor(allowed=d).process([IMAGE_TOKEN], ["file://" + path])
            with tempfile.TemporaryDirectory() as other:
                self.assertRejects(path, "outside the allowed media directory", allowed=other)

    def test_remote_urls_and_counts(self):
        self.assertRejects("https://example.com/cat.png", "not fetched")
        with self.assertRaises(ValueError) as ctx:
            processor().process([IMAGE_TOKEN, IMAGE_TOKEN], [make_image(0)])
        self.assertIn("2 image tokens but 1 images", str(ctx.exception))

    def test_pil_zero_size(self):
        from PIL import Image

        with self.assertRaises(ValueError):
            load_image(Image.new("RGB", (0, 0)))


def data_url_of(raw: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(raw).decode()


class TestExpansion(unittest.TestCase):
    def test_expand_and_pad_ids(self):
        p = processor()  # 32 / 8 -> 16 patches, CLS dropped
        a, b = make_image(0), make_image(1)
        mm = p.process([1, 7, IMAGE_TOKEN, 8, IMAGE_TOKEN], [data_url(a), png_bytes(b)])
        self.assertEqual(len(mm.input_ids), 3 + 2 * 16)
        self.assertEqual([(it.offset, it.num_tokens) for it in mm.mm_items], [(2, 16), (19, 16)])
        self.assertNotIn(IMAGE_TOKEN, mm.input_ids)
        self.assertEqual(mm.input_ids[:2] + mm.input_ids[18:19], [1, 7, 8])
        # pad ids follow the content: different images differ, the same image (another encoding) repeats
        self.assertNotEqual(mm.input_ids[2:18], mm.input_ids[19:35])
        again = p.process([1, 7, IMAGE_TOKEN], [png_bytes(a)])
        self.assertEqual(again.input_ids[2:18], mm.input_ids[2:18])
        # no image token: images go right after BOS
        first = p.process([1, 7, 8], [a])
        self.assertEqual(first.mm_items[0].offset, 1)
        self.assertEqual(list(first.items_in_range(10, 20))[0][1:], (9, 16))

    def test_full_strategy_keeps_cls(self):
        self.assertEqual(processor(strategy="full").tokens_per_image, 17)
        self.assertEqual(processor(tower="siglip", strategy="full").tokens_per_image, 16)

    def test_pickles(self):
        import pickle

        mm = processor().process([IMAGE_TOKEN], [make_image(0)])
        back = pickle.loads(pickle.dumps(mm))
        self.assertEqual(back.input_ids, mm.input_ids)
        self.assertTrue(torch.equal(back.mm_items[0].pixel_values, mm.mm_items[0].pixel_values))

    def test_siglip_resize_normalise(self):
        cfg = ImageProcessorConfig(image_size=4, size=("height", 4, "width", 4), image_mean=(0.5,) * 3,
                                   image_std=(0.5,) * 3)
        from PIL import Image

        x = preprocess_image(Image.new("RGB", (9, 5), (255, 0, 128)), cfg)
        self.assertEqual(tuple(x.shape), (3, 4, 4))
        self.assertAlmostEqual(x[0].mean().item(), 1.0, places=5)
        self.assertAlmostEqual(x[1].mean().item(), -1.0, places=5)


class TestEmbeddingCache(unittest.TestCase):
    def test_lru_within_budget(self):
        c = MultiModalEmbeddingCache(3 * 64)  # three [4, 4] float32 entries
        for k in "abc":
            self.assertTrue(c.put(k, torch.zeros(4, 4)))
        self.assertIsNotNone(c.get("a"))  # a is now the most recent
        c.put("d", torch.zeros(4, 4))
        self.assertNotIn("b", c)
        self.assertIn("a", c)
        self.assertFalse(c.put("big", torch.zeros(8, 8)))  # larger than the budget: not cached
        c.check_integrity()
        self.assertEqual(c.used_bytes, 3 * 64)
        self.assertFalse(MultiModalEmbeddingCache(0).put("x", torch.zeros(1)))


def mm_with_images(offsets, n=4, hashes=None):
    items = [MultimodalDataItem(torch.zeros(1), (hashes or [f"h{i}" for i in range(len(offsets))])[i], o, n)
             for i, o in enumerate(offsets)]
    return MultimodalInputs(list(range(100)), items)


class TestEncoderAdmission(unittest.TestCase):
    def test_cut_before_first_image_that_does_not_fit(self):
        adm = EncoderAdmission(EncoderBudget(2 * 10), 10)
        mm = mm_with_images([2, 10, 20])
        self.assertEqual(adm.admit(mm, 0, 30), 20)  # images at 2 and 10 fit, the one at 20 waits
        self.assertEqual(adm.admit(mm_with_images([0], hashes=["other"]), 0, 8), 0)  # budget exhausted: the next request waits
        adm.end_batch()
        self.assertEqual(adm.max_images_per_batch, 2)
        self.assertEqual(adm.budget.in_use_bytes, 0)
        self.assertEqual(adm.admit(mm, 20, 10), 10)  # next batch: the rest

    def test_page_alignment_and_progress(self):
        adm = EncoderAdmission(EncoderBudget(10), 10)
        mm = mm_with_images([0, 5])
        self.assertEqual(adm.admit(mm, 0, 16, page_size=4), 4)  # cut at 5, aligned down to 4
        adm.end_batch()
        adm = EncoderAdmission(EncoderBudget(10), 10)
        mm = mm_with_images([0, 2])
        self.assertEqual(adm.admit(mm, 0, 16, page_size=4), 0)
        adm.end_batch()
        self.assertEqual(adm.admit(mm, 0, 16, page_size=4, must_progress=True), 4)

    def test_cached_and_duplicate_images_are_free(self):
        cache = MultiModalEmbeddingCache(1 << 20)
        cache.put("h0", torch.zeros(4, 4))
        adm = EncoderAdmission(EncoderBudget(10), 10, cache)
        self.assertEqual(adm.admit(mm_with_images([0, 10, 20], hashes=["h0", "x", "x"]), 0, 30), 30)
        adm.end_batch()
        self.assertEqual(adm.max_images_per_batch, 1)

    def test_reservation_smaller_than_one_image(self):
        with self.assertRaises(ValueError) as ctx:
            EncoderAdmission(EncoderBudget(5), 10)
        self.assertIn("--encoder-mem-reserve", str(ctx.exception))


if __name__ == "__main__":
    unittest.main()
