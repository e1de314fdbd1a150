"""A burst of concurrent requests with large images under a small absolute memory cap: every request completes,
the encoder never encodes more images at once than its measured reservation covers (counted), the burst queues
instead of failing, and the process's peak memory stays within the plan's budget."""

import gc
import tempfile
import unittest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=40, suite="cpu")

from sglang.srt.entrypoints.engine import Engine  # noqa: E402
from sglang.srt.mem_plan.measure import cpu_current_rss_bytes, cpu_peak_rss_bytes, reset_cpu_peak_rss  # noqa: E402
from sglang.test.mm_fixtures import data_url, make_image, make_random_llava  # noqa: E402

CAP_GIB = 0.75
NUM_REQS = 16
IMAGES_PER_REQ = 2
ENCODER_BATCH = 2
IMAGE_SIZE = 128  # tower input; requests send 640x480 images, resized and cropped to this


class TestEncoderBudgetBurst(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        make_random_llava(cls.tmp.name, image_size=IMAGE_SIZE, vision_layers=4, vision_hidden=128)
        # the largest inputs the server accepts: distinct 640x480 images (no cache hits), preprocessed up front
        cls.images = [[data_url(make_image(100 + 2 * i + j, 640, 480)) for j in range(IMAGES_PER_REQ)]
                      for i in range(NUM_REQS)]

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_burst_queues_within_reservation_and_plan(self):
        gc.collect()
        baseline = cpu_current_rss_bytes()
        reset_cpu_peak_rss()
        engine = Engine(model_path=self.tmp.name, max_total_memory_gb=CAP_GIB, encoder_batch_size=ENCODER_BATCH,
                        mm_embedding_cache_mb=1, max_running_requests=32, context_length=1024,
                        random_seed=0, log_level="warning")
        try:
            runner = engine.scheduler.model_runner
            plan = runner.memory_plan
            adm = runner.encoder_admission
            self.assertEqual(plan.budget_bytes, int(CAP_GIB * 2**30))
            self.assertEqual(plan.bytes_of("encoder_image"), runner.multimodal.encoder_reserve_bytes)
            self.assertGreater(runner.multimodal.encoder_reserve_bytes, 0)
            self.assertEqual(plan.term("encoder_image").source, "measured")
            self.assertEqual([t.name for t in plan.terms if t.name.startswith("encoder")], ["encoder_image"])
            self.assertEqual(adm.max_images, ENCODER_BATCH)

            prompts = [f"Request {i}: compare <image> with <image>." for i in range(NUM_REQS)]
            outs = engine.generate(prompts, [{"max_new_tokens": 4, "ignore_eos": True}] * NUM_REQS,
                                   image_data=self.images)
            peak = cpu_peak_rss_bytes() - baseline

            self.assertEqual([len(o["output_ids"]) for o in outs], [4] * NUM_REQS)
            self.assertTrue(all(o["meta_info"]["finish_reason"]["type"] == "length" for o in outs))
            stats = runner.model.encoder_stats
            self.assertEqual(stats.num_images, NUM_REQS * IMAGES_PER_REQ)  # each image encoded exactly once
            self.assertLessEqual(stats.max_images_per_call, ENCODER_BATCH)
            self.assertLessEqual(adm.max_images_per_batch, ENCODER_BATCH)
            self.assertGreater(adm.num_deferred, 0, "the burst should have been queued by the encoder budget")
            self.assertEqual(adm.budget.in_use_bytes, 0)
            engine.scheduler.check_integrity()
            print(f"\nencoder reservation {runner.multimodal.encoder_reserve_bytes / 2**20:.1f} MiB (measured, "
                  f"{ENCODER_BATCH} images of {runner.mm_processor.max_tokens_per_image} tokens); "
                  f"peak RSS increase {peak / 2**20:.1f} MiB vs plan budget {plan.budget_bytes / 2**20:.1f} MiB "
                  f"(terms {plan.total_bytes / 2**20:.1f} MiB); {stats.num_calls} encoder calls, "
                  f"{adm.num_deferred} deferrals")
            self.assertLessEqual(peak, plan.budget_bytes)
        finally:
            engine.shutdown()

    def test_explicit_reservation_smaller_than_one_image_fails_at_startup(self):
        with self.assertRaises(ValueError) as ctx:
            Engine(model_path=self.tmp.name, encoder_mem_reserve=1e-6, max_total_tokens=2048, log_level="warning")
        self.assertIn("--encoder-mem-reserve", str(ctx.exception))


if __name__ == "__main__":
    unittest.main()
