"""A burst of concurrent max-size requests of every modality on the Qwen3-Omni Thinker under a small encoder budget:
each request carries the largest image the processor accepts, a video of three encoder chunks (48 sampled frames,
16 per chunk) and an audio of two encoder chunks (64 s + 6 s of mel frames). Twice: with the measured per-modality
terms (two images / one video chunk / one audio chunk) and with one shared --encoder-mem-reserve of 1.5 of the
largest chunk. Every request completes, the KV pool is intact and idle afterwards (nothing borrowed: free + held +
cached == total), the burst was queued by the encoder budget, and -- counted at the encoder's own entry point, not
only by the admission's counters -- no forward encoded more chunks of a modality than its gate allows nor more
planned bytes than its reservation."""

import tempfile
import unittest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=35, suite="cpu")

from sglang.srt.entrypoints.engine import Engine  # noqa: E402
from sglang.test.engine_fixtures import assert_idle_and_intact, shutdown  # noqa: E402
from sglang.test.mm_fixtures import data_url, make_image  # noqa: E402
from sglang.test.qwen3_omni_fixtures import MAX_PIXELS, make_random_qwen3_omni_thinker, make_waveform  # noqa: E402
from sglang.test.qwen_vl_fixtures import make_video, video_data_url  # noqa: E402

NUM_REQS = 8
MAX_NEW = 3
MAX_VIDEO_FRAMES = 48  # sampled at 2 fps from 96 frames at 4 fps: 24 temporal slices, 3 chunks of 8
MAX_AUDIO_S = 70.0  # chunks of 64 s (6400 mel frames, whole windows) -> 2 chunks
IMAGE_SIDE = 128  # 128 x 128 = MAX_PIXELS: the largest image (16 tokens)
PROMPT = ("Request {i}: <|vision_start|><|image_pad|><|vision_end|> then <|vision_start|><|video_pad|><|vision_end|> "
          "and <|audio_start|><|audio_pad|><|audio_end|>.")


class EncoderProbe:
    """Wraps the model's encode_chunks (one call per forward, with every chunk that forward encodes): the most chunks
    of each modality and the most planned bytes per budget ever encoded in one forward, observed at the encoder
    rather than from the admission's own counters."""

    def __init__(self, model, admission):
        self.gates = admission.gates
        self.peak_units = {m: 0 for m in self.gates}
        self.peak_bytes = {}
        inner = model.encode_chunks

        def encode_chunks(chunks):
            units = {m: 0 for m in self.gates}
            for item, _, _ in chunks:
                units[item.modality] += 1
            spent = {}
            for m, n in units.items():
                self.peak_units[m] = max(self.peak_units[m], n)
                b = self.gates[m].budget
                spent[id(b)] = spent.get(id(b), 0) + n * self.gates[m].unit_bytes
            for k, v in spent.items():
                self.peak_bytes[k] = max(self.peak_bytes.get(k, 0), v)
            return inner(chunks)

        model.encode_chunks = encode_chunks


class TestOmniEncoderBurst(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        make_random_qwen3_omni_thinker(cls.tmp.name, video_max_frames=MAX_VIDEO_FRAMES)
        assert IMAGE_SIDE * IMAGE_SIDE == MAX_PIXELS
        # distinct items per request (no embedding-cache hits): the largest of each modality
        cls.images = [[data_url(make_image(200 + i, IMAGE_SIDE, IMAGE_SIDE))] for i in range(NUM_REQS)]
        cls.videos = [[video_data_url(make_video(300 + i, num_frames=2 * MAX_VIDEO_FRAMES, width=96, height=64))]
                      for i in range(NUM_REQS)]
        cls.audios = [[(make_waveform(i, MAX_AUDIO_S - 0.05), 16000)] for i in range(NUM_REQS)]

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def burst(self, **kw):
        engine = Engine(model_path=self.tmp.name, max_total_tokens=4096, max_running_requests=NUM_REQS,
                        context_length=2048, max_video_frames=MAX_VIDEO_FRAMES, max_audio_seconds=MAX_AUDIO_S,
                        mm_embedding_cache_mb=1, random_seed=0, log_level="warning", **kw)
        try:
            runner = engine.scheduler.model_runner
            adm = runner.encoder_admission
            proc = runner.mm_processor
            item = proc.process(engine.tokenizer.encode(PROMPT.format(i=0)), self.images[0], self.videos[0],
                                self.audios[0])
            chunks = {it.modality: len(it.encoder_chunks or [0]) for it in item.mm_items}
            self.assertEqual(chunks, {"image": 1, "video": 3, "audio": 2})
            probe = EncoderProbe(runner.model, adm)
            calls = runner.model.encoder_stats.num_calls
            outs = engine.generate([PROMPT.format(i=i) for i in range(NUM_REQS)],
                                   [{"max_new_tokens": MAX_NEW, "ignore_eos": True}] * NUM_REQS,
                                   image_data=self.images, video_data=self.videos, audio_data=self.audios)
            self.assertEqual([len(o["output_ids"]) for o in outs], [MAX_NEW] * NUM_REQS)
            self.assertTrue(all(o["meta_info"]["finish_reason"]["type"] == "length" for o in outs))
            self.assertEqual([o["meta_info"]["prompt_tokens"] for o in outs[:1]], [len(item.input_ids)])
            assert_idle_and_intact(engine)
            self.assertGreater(adm.num_deferred, 0, "the burst should have been queued by the encoder budget")
            # at least every chunk once (a chunk evicted from the 1 MiB embedding cache may be encoded again)
            self.assertGreaterEqual(runner.model.encoder_stats.num_calls - calls, NUM_REQS * 3)
            for modality, gate in adm.gates.items():
                self.assertGreater(probe.peak_units[modality], 0, modality)
                self.assertLessEqual(probe.peak_units[modality], gate.max_units, modality)
                self.assertLessEqual(adm.max_units_per_batch[modality], gate.max_units, modality)
                self.assertEqual(gate.budget.in_use_bytes, 0)
                self.assertLessEqual(probe.peak_bytes[id(gate.budget)], gate.budget.capacity_bytes)
            print(f"\n{adm.describe()}; most chunks per forward {probe.peak_units}; deferrals {adm.num_deferred}")
            return adm
        finally:
            shutdown(engine)

    def test_burst_under_measured_terms(self):
        adm = self.burst(encoder_batch_size=2)
        self.assertEqual({m: g.max_units for m, g in adm.gates.items()}, {"image": 2, "video": 1, "audio": 1})
        self.assertEqual(len({id(g.budget) for g in adm.gates.values()}), 3)  # one reservation per modality

    def test_burst_under_one_shared_reserve_of_one_and_a_half_chunks(self):
        probe = Engine(model_path=self.tmp.name, max_total_tokens=1024, max_video_frames=MAX_VIDEO_FRAMES,
                       max_audio_seconds=MAX_AUDIO_S, log_level="warning")
        largest = max(g.unit_bytes for g in probe.scheduler.model_runner.encoder_admission.gates.values())
        shutdown(probe)
        adm = self.burst(encoder_mem_reserve=1.5 * largest / 2**30)
        self.assertEqual(len({id(g.budget) for g in adm.gates.values()}), 1)


if __name__ == "__main__":
    unittest.main()
