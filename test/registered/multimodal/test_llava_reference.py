"""Our LLaVA vs HF transformers' LlavaForConditionalGeneration (fp32) on the same random-weight checkpoint:
greedy tokens equal for 1 and 2 images (CLIP tower, and a SigLIP tower with the "full" strategy), with chunked
prefill cutting through images, and with a cached prefix covering part of an image. Also: our preprocessing equals
HF's image processor of the tower (CLIP: resize + center crop; SigLIP: resize to the square), and an
embedding-cache hit skips the encoder."""

import gc
import tempfile
import unittest

import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=45, suite="cpu")

from sglang.srt.entrypoints.engine import Engine  # noqa: E402
from sglang.test.mm_fixtures import data_url, make_image, make_random_llava, png_bytes  # noqa: E402

MAX_NEW = 8
GREEDY = {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}


def hf_inputs(mm, image_token_id):
    """Our processor's output -> HF's input_ids (image token repeated per embedding row) and pixel_values."""
    ids = list(mm.input_ids)
    for it in mm.mm_items:
        ids[it.offset : it.end] = [image_token_id] * it.num_tokens
    return ids, torch.stack([it.pixel_values for it in mm.mm_items])


class LlavaReferenceBase:
    tower = "clip"
    hf_image_processor = "CLIPImageProcessor"  # the tower's processor in transformers: the independent reference
    engine_kwargs = {}

    @classmethod
    def setUpClass(cls):
        from transformers import LlavaForConditionalGeneration

        cls.tmp = tempfile.TemporaryDirectory()
        cls.model_dir = make_random_llava(cls.tmp.name, tower=cls.tower)
        cls.hf = LlavaForConditionalGeneration.from_pretrained(cls.model_dir, dtype=torch.float32).eval()
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

    def hf_greedy(self, ids, images):
        mm = self.proc.process(ids, [data_url(im) for im in images])
        hf_ids, pv = hf_inputs(mm, self.proc.image_token_id)
        x = torch.tensor([hf_ids])
        with torch.no_grad():
            y = self.hf.generate(x, pixel_values=pv, attention_mask=torch.ones_like(x), do_sample=False,
                                 max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW, pad_token_id=0)
        return y[0, len(hf_ids):].tolist()

    def check(self, text, images):
        ids = self.tok.encode(text)
        ours = self.engine.generate(input_ids=ids, image_data=[data_url(im) for im in images],
                                    sampling_params=GREEDY)["output_ids"]
        self.assertEqual(ours, self.hf_greedy(ids, images))
        return ours

    def test_one_image(self):
        self.check("Describe this picture: <image> in detail.", [make_image(0)])

    def test_two_images(self):
        self.check("<image> and <image>: which one is brighter?", [make_image(1), make_image(2)])

    def test_image_features_match_hf(self):
        """The tower + projector alone against HF's get_image_features on the same pixels: tighter than greedy
        tokens, which an error in the image rows (e.g. misplaced position embeddings) can leave unchanged."""
        pv = self.proc.preprocess(make_image(6))
        with torch.no_grad():
            ours = self.runner.model.encode_images([pv])[0]
            out = self.hf.get_image_features(pixel_values=pv[None])
        theirs = out.pooler_output[0] if hasattr(out, "pooler_output") else out[0]  # transformers 5 / 4
        torch.testing.assert_close(ours, theirs.reshape(ours.shape), rtol=1e-4, atol=1e-5)

    def test_preprocessing_matches_hf_processor(self):
        import transformers

        hf_proc = getattr(transformers, self.hf_image_processor).from_pretrained(self.model_dir)
        for w, h in ((100, 80), (37, 120), (64, 64)):
            img = make_image(w * h, w, h)
            expect = hf_proc(images=[img], return_tensors="pt")["pixel_values"][0]
            got = self.proc.preprocess(img)
            self.assertEqual(got.shape, expect.shape, (w, h))
            self.assertLess((got - expect).abs().max().item(), 1e-5, (w, h))


class TestLlavaClip(LlavaReferenceBase, unittest.TestCase):
    tower = "clip"

    def test_images_without_tokens_go_first(self):
        # no image token in the prompt: the image is placed at the start, as HF sees it with the token there
        ids = self.tok.encode("What is shown?")
        ours = self.engine.generate(input_ids=ids, image_data=png_bytes(make_image(3)), sampling_params=GREEDY)
        expect = self.hf_greedy([self.proc.image_token_id] + ids, [make_image(3)])
        self.assertEqual(ours["output_ids"], expect)

    def test_cached_prefix_covers_part_of_image_and_cache_hit_skips_encoder(self):
        # The prompt ends with the image: the second time, the radix cache covers all but its last token, so the
        # extend starts inside the image (row 15 of 16); the embedding comes from the cache, not the encoder.
        ids = self.tok.encode("Look: <image>")
        img = make_image(4)
        first = self.engine.generate(input_ids=ids, image_data=data_url(img), sampling_params=GREEDY)
        stats = self.runner.model.encoder_stats
        encoded = stats.num_images
        second = self.engine.generate(input_ids=ids, image_data=png_bytes(img), sampling_params=GREEDY)
        self.assertEqual(stats.num_images, encoded, "the cached embedding must skip the encoder")
        self.assertEqual(second["meta_info"]["cached_tokens"], len(ids) - 1 + 16 - 1)
        self.assertEqual(first["output_ids"], second["output_ids"])
        self.assertEqual(first["output_ids"], self.hf_greedy(ids, [img]))
        # a different image at the same place shares only the text prefix
        third = self.engine.generate(input_ids=ids, image_data=data_url(make_image(5)), sampling_params=GREEDY)
        self.assertEqual(third["meta_info"]["cached_tokens"], len(ids) - 1)
        self.assertEqual(stats.num_images, encoded + 1)
        self.runner.multimodal.mm_embedding_cache.check_integrity()


class TestLlavaChunkedPrefill(LlavaReferenceBase, unittest.TestCase):
    """Chunks of 7 tokens: every 16-token image is split across 3-4 chunks at different phases; the embedding
    cache is disabled, so each chunk re-encodes its images and takes only its own rows."""

    engine_kwargs = {"chunked_prefill_size": 7, "mm_embedding_cache_mb": 0, "disable_radix_cache": True}

    def test_two_images(self):
        super().test_two_images()
        self.assertGreater(self.runner.model.encoder_stats.num_images, 2)


class TestLlavaSiglip(LlavaReferenceBase, unittest.TestCase):
    tower = "siglip"
    hf_image_processor = "SiglipImageProcessor"


if __name__ == "__main__":
    unittest.main()
