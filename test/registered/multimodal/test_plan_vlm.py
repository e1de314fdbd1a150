"""`sglang plan` for a vision-language config (LLaVA with a SigLIP-so400m tower, Qwen2-7B LM): the encoder term and
the embedding cache appear in the plan, and the report shows what the reservation costs the KV pool."""

import os
import unittest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=3, suite="cpu")

from sglang.cli.plan import run  # noqa: E402
from sglang.srt.mem_plan.units import GiB, MiB  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "mem_plan", "fixtures")
LLAVA = os.path.join(FIXTURES, "llava-siglip-qwen2-7b")
LLAMA = os.path.join(FIXTURES, "llama-3.1-8b")


def terms(result):
    return {t["name"]: t for t in result["plan"]["terms"]}


class TestPlanVlm(unittest.TestCase):
    def test_encoder_term_and_its_cost_to_the_kv_pool(self):
        status, result, text = run(["--model-path", LLAVA, "--gpu", "h100-80gb"])
        self.assertEqual(status, 0)
        t = terms(result)
        self.assertNotIn("encoder", t)  # one term per modality: LLaVA encodes images
        self.assertGreater(t["encoder_image"]["num_bytes"], 0)
        self.assertIn("vision: 729 tokens x batch 1", t["encoder_image"]["detail"])  # (384 / 14)^2 SigLIP patches
        self.assertEqual(t["mm_embedding_cache"]["num_bytes"], 100 * MiB)
        effect = result["encoder_effect"]
        cell = result["kv_cell_bytes"]
        reserved = t["encoder_image"]["num_bytes"] + t["mm_embedding_cache"]["num_bytes"]
        self.assertEqual(effect["reserved_bytes"], reserved)
        # the KV pool gives up what the encoder takes (to within a token), and no more
        self.assertLessEqual(abs(effect["kv_tokens_lost"] - reserved / cell), 1)
        self.assertIn("Encoder reservation + embedding cache", text)
        self.assertIn("encoder_image ", text)

    def test_explicit_reservation_and_batch_size(self):
        _, auto, _ = run(["--model-path", LLAVA, "--gpu", "h100-80gb", "--encoder-batch-size", "4"])
        _, one, _ = run(["--model-path", LLAVA, "--gpu", "h100-80gb"])
        self.assertEqual(terms(auto)["encoder_image"]["num_bytes"], 4 * terms(one)["encoder_image"]["num_bytes"])
        _, fixed, text = run(["--model-path", LLAVA, "--gpu", "h100-80gb", "--encoder-mem-reserve", "4",
                              "--mm-embedding-cache-mb", "0"])
        self.assertEqual(terms(fixed)["encoder"]["num_bytes"], 4 * GiB)  # the one shared reservation
        self.assertNotIn("encoder_image", terms(fixed))
        self.assertEqual(terms(fixed)["mm_embedding_cache"]["num_bytes"], 0)
        lost = fixed["encoder_effect"]["kv_tokens_lost"]
        self.assertLessEqual(abs(lost - 4 * GiB / fixed["kv_cell_bytes"]), 1)
        self.assertLess(fixed["plan"]["max_total_num_tokens"], one["plan"]["max_total_num_tokens"])
        print("\n" + "\n".join(line for line in text.splitlines() if "encoder" in line.lower()))

    def test_text_model_has_no_encoder_terms(self):
        _, result, text = run(["--model-path", LLAMA, "--gpu", "h100-80gb"])
        self.assertEqual(terms(result)["encoder"]["num_bytes"], 0)
        self.assertEqual(terms(result)["mm_embedding_cache"]["num_bytes"], 0)
        self.assertNotIn("encoder_effect", result)


if __name__ == "__main__":
    unittest.main()
