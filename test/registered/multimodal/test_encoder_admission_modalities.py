"""EncoderAdmission per modality: each modality's encoder chunks are admitted against that modality's own reservation
(an image does not wait for a video's budget), a long item is encoded chunk by chunk across batches (the prefill is
cut page-aligned before the first chunk that does not fit), cached chunks cost nothing, everything is released after
the batch, and with --encoder-mem-reserve one shared budget gates every modality."""

import unittest
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=1, suite="cpu")

from sglang.srt.mem_plan.encoder import EncoderBudget  # noqa: E402
from sglang.srt.multimodal.encoder_admission import EncoderAdmission, ModalityGate, unit_key  # noqa: E402


@dataclass
class Item:
    modality: str
    hash: str
    offset: int
    num_tokens: int
    encoder_chunks: Optional[List[Tuple[int, int]]] = None

    @property
    def end(self):
        return self.offset + self.num_tokens


@dataclass
class Inputs:
    mm_items: list = field(default_factory=list)

    def items_in_range(self, start, end):
        for item in self.mm_items:
            lo, hi = max(item.offset, start), min(item.end, end)
            if lo < hi:
                yield item, lo - item.offset, hi - item.offset


def gates(image_units=1, video_units=1, audio_units=1):
    return {"image": ModalityGate(EncoderBudget(100 * image_units), 100),
            "video": ModalityGate(EncoderBudget(300 * video_units), 300),
            "audio": ModalityGate(EncoderBudget(50 * audio_units), 50)}


class TestModalityAdmission(unittest.TestCase):
    def test_each_modality_has_its_own_budget(self):
        adm = EncoderAdmission(gates())
        mm = Inputs([Item("video", "v", 10, 40, [(0, 20), (20, 40)]), Item("image", "i", 60, 10),
                     Item("audio", "a", 80, 10)])
        # one video chunk fits the video budget; the second waits -- the prefill stops at its first row
        self.assertEqual(adm.admit(mm, 0, 100), 30)
        self.assertEqual(adm.gates["video"].budget.in_use_bytes, 300)
        self.assertEqual(adm.gates["image"].budget.in_use_bytes, 0)
        adm.end_batch()
        self.assertEqual(adm.gates["video"].budget.in_use_bytes, 0)
        # the next batch starts at the second chunk: it, the image and the audio each fit their own budget
        self.assertEqual(adm.admit(mm, 30, 70), 70)
        self.assertEqual([adm.gates[m].budget.in_use_bytes for m in ("image", "video", "audio")], [100, 300, 50])
        adm.end_batch()
        self.assertEqual(adm.max_units_per_batch, {"image": 1, "video": 1, "audio": 1})
        self.assertEqual(adm.num_deferred, 1)

    def test_cut_is_page_aligned_and_a_full_budget_waits(self):
        adm = EncoderAdmission(gates(image_units=1))
        mm = Inputs([Item("image", "i1", 5, 10), Item("image", "i2", 21, 10)])
        self.assertEqual(adm.admit(mm, 0, 40, page_size=8), 16)  # i2 starts at 21: cut to the page at 16
        other = Inputs([Item("image", "i3", 0, 10)])
        self.assertEqual(adm.admit(other, 0, 10), 0)  # the image budget is full: this request waits
        self.assertEqual(adm.admit(other, 0, 10, must_progress=True), 1)  # ... unless the batch would be empty
        adm.end_batch()

    def test_cached_chunks_and_duplicates_cost_nothing(self):
        cache = {unit_key("v", 0, 2)}
        adm = EncoderAdmission(gates(), embedding_cache=cache)
        mm = Inputs([Item("video", "v", 0, 40, [(0, 20), (20, 40)])])
        self.assertEqual(adm.admit(mm, 0, 40), 40)  # chunk 0 cached, chunk 1 fits
        same = Inputs([Item("video", "v", 0, 40, [(0, 20), (20, 40)])])
        self.assertEqual(adm.admit(same, 0, 40), 40)  # the same chunk in another request of the batch: counted once
        self.assertEqual(adm.gates["video"].budget.in_use_bytes, 300)
        adm.end_batch()
        self.assertEqual(unit_key("img", 0, 1), "img")  # one-chunk items keep the item hash (LLaVA's cache keys)

    def test_shared_reservation(self):
        shared = EncoderBudget(350)
        adm = EncoderAdmission({"image": ModalityGate(shared, 100), "video": ModalityGate(shared, 300)})
        mm = Inputs([Item("image", "i", 0, 10), Item("video", "v", 10, 20)])
        self.assertEqual(adm.admit(mm, 0, 30), 10)  # 100 + 300 > 350: the video chunk waits
        adm.end_batch()
        self.assertEqual(shared.in_use_bytes, 0)

    def test_a_reservation_below_one_chunk_is_refused(self):
        with self.assertRaises(ValueError) as ctx:
            EncoderAdmission({"video": ModalityGate(EncoderBudget(100), 300)})
        self.assertIn("video", str(ctx.exception))
        self.assertIn("--encoder-mem-reserve", str(ctx.exception))


if __name__ == "__main__":
    unittest.main()


class TestProbeInterface(unittest.TestCase):
    """The measurement hook a model implements (runner_setup.py): mm_encoder_probes() -> {modality: probe}, each run
    on that modality's planned workload; the measured peak per unit becomes the modality's term."""

    def test_probes_run_on_the_planned_workloads(self):
        import os

        import torch

        from sglang.srt.mem_plan.encoder_plan import encoder_workloads, measured_encoder_term
        from sglang.srt.mem_plan.model_shapes import model_shape_from_path
        from sglang.srt.multimodal.runner_setup import _unit_costs
        from sglang.srt.server_args import ServerArgs

        fixture = os.path.join(os.path.dirname(__file__), "..", "mem_plan", "fixtures", "qwen3-omni-30b-a3b-instruct")
        sa = ServerArgs(model_path=fixture, device="cpu", grammar_backend="none", max_audio_seconds=30)
        work = encoder_workloads(model_shape_from_path(fixture), sa)
        seen = {}

        def probe(w, device):  # holds 1 KiB per patch / mel frame, like an encoder whose peak scales with its input
            n = w.vision.patches if w.vision is not None else w.mel_frames
            seen[w.modality] = n
            x = torch.ones(n * 256, dtype=torch.float32, device=device)
            x.add_(1)

        class Model:
            def mm_encoder_probes(self):
                return {"image": probe, "video": probe, "audio": probe}

        costs = _unit_costs(Model(), None, work, sa, "cpu")
        self.assertEqual(seen, {"image": 224 * 224, "video": 8 * 48 * 64, "audio": 3000})  # 30 s < the 64 s chunk
        self.assertEqual(work["audio"].chunk_frames, 3000)
        self.assertEqual(work["video"].chunk_frames, 16)
        self.assertGreater(costs["image"], 40 * 2**20)  # 51 MB held by the image probe
        self.assertGreater(costs["image"], costs["video"])
        term = measured_encoder_term(work["video"], costs["video"], 1)
        self.assertEqual((term.name, term.source, term.num_bytes), ("encoder_video", "measured", costs["video"]))
