"""`sglang plan` for the blog's model and cards: Qwen3-Omni-30B-A3B's Thinker (published config) on H100-80GB, H200
and H20-96GB with default limits fits, with one positive formula term per modality sized at the planned largest unit
(an image at the processor's max_pixels, a 16-frame video chunk, a 64 s audio chunk); --mem-fraction-static 0.7 on the
H100 is refused naming a value that works (and it does); --json carries the terms. Qwen2.5-VL-7B on an H100 plans
image and video terms and no audio."""

import json
import os
import subprocess
import sys
import unittest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=8, suite="cpu")

from sglang.cli.plan import run  # noqa: E402
from sglang.srt.mem_plan.units import GiB  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "mem_plan", "fixtures")
OMNI = os.path.join(FIXTURES, "qwen3-omni-30b-a3b-instruct")
QWEN25_VL = os.path.join(FIXTURES, "qwen2.5-vl-7b-instruct")
CARDS = ("h100-80gb", "h200", "h20-96gb")
MODALITIES = ("encoder_image", "encoder_video", "encoder_audio")


def terms(result):
    return {t["name"]: t for t in result["plan"]["terms"]}


class TestPlanOmniThinker(unittest.TestCase):
    def test_fits_on_the_blogs_three_cards(self):
        tokens = {}
        for card in CARDS:
            status, result, text = run(["--model-path", OMNI, "--gpu", card])
            self.assertEqual(status, 0, text)
            t = terms(result)
            self.assertNotIn("encoder", t)
            self.assertEqual([n for n in t if n.startswith("encoder")], list(MODALITIES))
            for name in MODALITIES:
                self.assertGreater(t[name]["num_bytes"], 0)
                self.assertEqual(t[name]["source"], "formula")
            # about 60 GB of Thinker weights (31.7B params in bf16), the same on every card
            self.assertAlmostEqual(t["weights"]["num_bytes"] / 1e9, 63.44, delta=0.05)
            self.assertGreater(result["plan"]["max_total_num_tokens"], 8192)
            self.assertGreater(t["moe_workspace"]["num_bytes"], 0)
            self.assertEqual(result["plan"]["mem_fraction_static_source"], "auto")
            tokens[card] = result["plan"]["max_total_num_tokens"]
            print(f"\n{card}: KV {tokens[card]:,} tokens, y {result['plan']['mem_fraction_static']:.4f}, "
                  + ", ".join(f"{n} {t[n]['num_bytes'] / GiB:.3f} GiB" for n in MODALITIES))
        self.assertLess(tokens["h100-80gb"], tokens["h20-96gb"])
        self.assertLess(tokens["h20-96gb"], tokens["h200"])

    def test_terms_are_sized_at_the_planned_units(self):
        _, result, _ = run(["--model-path", OMNI, "--gpu", "h100-80gb"])
        t = terms(result)
        self.assertIn("1 image(s) of 224x224 patches -> 12,544 tokens (12,845,056 pixels)",
                      t["encoder_image"]["detail"])
        self.assertIn("chunk of 16 frames = 8x48x64 patches -> 6,144 tokens", t["encoder_video"]["detail"])
        self.assertIn("chunk of 6,400 mel frames (64 s) -> 832 tokens, windows of 104", t["encoder_audio"]["detail"])
        # limits move the terms: a smaller image cap shrinks the image term, a short max audio the audio term
        _, small, _ = run(["--model-path", OMNI, "--gpu", "h100-80gb", "--max-image-pixels", "1003520",
                           "--max-audio-seconds", "10", "--max-video-frames", "4"])
        s = terms(small)
        for name in MODALITIES:
            self.assertLess(s[name]["num_bytes"], t[name]["num_bytes"], name)
        self.assertIn("1,000 mel frames", s["encoder_audio"]["detail"])
        self.assertIn("chunk of 4 frames", s["encoder_video"]["detail"])
        self.assertGreater(small["plan"]["max_total_num_tokens"], result["plan"]["max_total_num_tokens"])

    def test_pinned_0_7_on_h100_is_refused_with_a_working_value(self):
        status, result, text = run(["--model-path", OMNI, "--gpu", "h100-80gb", "--mem-fraction-static", "0.7"])
        self.assertEqual(status, 1)
        err = result["error"]
        self.assertEqual(err["direction"], "raise")
        value = err["suggested_value"]
        self.assertIn(f"Raise --mem-fraction-static to {value:.3f}", text)
        status, ok, _ = run(["--model-path", OMNI, "--gpu", "h100-80gb", "--mem-fraction-static", f"{value:.3f}"])
        self.assertEqual(status, 0)
        self.assertEqual([n for n in terms(ok) if n.startswith("encoder")], list(MODALITIES))
        status, _, _ = run(["--model-path", OMNI, "--gpu", "h100-80gb", "--mem-fraction-static",
                            f"{value - 0.001:.3f}"])
        self.assertEqual(status, 1)
        for card in ("h200", "h20-96gb"):  # where the blog's 0.7 ran
            self.assertEqual(run(["--model-path", OMNI, "--gpu", card, "--mem-fraction-static", "0.7"])[0], 0)

    def test_json_has_the_per_modality_terms(self):
        out = subprocess.run([sys.executable, "-m", "sglang.cli.plan", "--model-path", OMNI, "--gpu", "h200", "--json"],
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        d = json.loads(out.stdout)
        t = terms(d)
        for name in MODALITIES:
            self.assertGreater(t[name]["num_bytes"], 0)
            self.assertEqual(t[name]["source"], "formula")
        reserved = sum(t[n]["num_bytes"] for n in MODALITIES) + t["mm_embedding_cache"]["num_bytes"]
        self.assertEqual(d["encoder_effect"]["reserved_bytes"], reserved)

    def test_measured_encoder_term_override(self):
        _, result, _ = run(["--model-path", OMNI, "--gpu", "h100-80gb", "--measured", "encoder_video=123456789"])
        self.assertEqual(terms(result)["encoder_video"]["num_bytes"], 123456789)
        self.assertEqual(terms(result)["encoder_video"]["source"], "measured")

    def test_shared_reservation_replaces_the_modality_terms(self):
        _, result, _ = run(["--model-path", OMNI, "--gpu", "h100-80gb", "--encoder-mem-reserve", "2"])
        t = terms(result)
        self.assertEqual(t["encoder"]["num_bytes"], 2 * GiB)
        self.assertFalse(any(n in t for n in MODALITIES))


class TestPlanQwen25VL(unittest.TestCase):
    def test_image_and_video_terms_on_h100(self):
        status, result, text = run(["--model-path", QWEN25_VL, "--gpu", "h100-80gb"])
        self.assertEqual(status, 0, text)
        t = terms(result)
        self.assertEqual([n for n in t if n.startswith("encoder")], ["encoder_image", "encoder_video"])
        self.assertIn("256x256 patches -> 16,384 tokens", t["encoder_image"]["detail"])  # 12,845,056 px / 28^2
        self.assertIn("chunk of 16 frames = 8x48x64 patches -> 6,144 tokens", t["encoder_video"]["detail"])
        self.assertAlmostEqual(result["num_params"] / 1e9, 8.29, delta=0.01)  # Qwen2.5-VL-7B's published 8.29B
        print("\n" + "\n".join(line for line in text.splitlines() if line.startswith(("encoder", "FITS", "mem_"))))


if __name__ == "__main__":
    unittest.main()
