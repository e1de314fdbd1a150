"""The encoder formulas (mem_plan/encoder_towers.py) against HF transformers' reference towers: parameter counts equal
the HF modules' on the published Qwen3-Omni and Qwen2.5-VL configs, and each formula peak bounds the live tensor
bytes the HF tower actually holds (counted op by op, LiveTensorPeak) from above, by at most 30%, with eager
attention (score matrices materialised: the CPU formula) and SDPA (fused: the GPU formula). Plus the real Omni
image term worked out by hand, tensor by tensor."""

import json
import os
import unittest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=25, suite="cpu")

import torch  # noqa: E402
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig  # noqa: E402
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel  # noqa: E402
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (  # noqa: E402
    Qwen3OmniMoeAudioEncoderConfig,
    Qwen3OmniMoeVisionEncoderConfig,
)
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (  # noqa: E402
    Qwen3OmniMoeAudioEncoder,
    Qwen3OmniMoeVisionEncoder,
    _get_feat_extract_output_lengths,
)

from sglang.srt.mem_plan.encoder_towers import VisionWork, omni_audio_tower, qwen_vision_tower  # noqa: E402
from sglang.test.live_tensor_peak import LiveTensorPeak  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
OMNI = json.load(open(os.path.join(FIXTURES, "qwen3-omni-30b-a3b-instruct", "config.json")))["thinker_config"]
QWEN25_VISION = json.load(open(os.path.join(FIXTURES, "qwen2.5-vl-7b-instruct", "config.json")))["vision_config"]
MAX_OVER = 1.30  # the formula may exceed the reference peak by this factor, never fall below it

SMALL_OMNI_VISION = dict(depth=2, hidden_size=128, intermediate_size=480, num_heads=4, out_hidden_size=96,
                         patch_size=16, deepstack_visual_indexes=[0, 1], num_position_embeddings=64)
SMALL_QWEN25_VISION = dict(depth=4, hidden_size=128, intermediate_size=344, num_heads=4, out_hidden_size=96,
                           patch_size=14, window_size=112, fullatt_block_indexes=[1, 3])
SMALL_OMNI_AUDIO = dict(d_model=128, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=512, output_dim=96,
                        downsample_hidden_size=32)


def hf_peak(module, *args) -> int:
    with torch.no_grad():
        meter = LiveTensorPeak()
        with meter:
            module(*args)
    return meter.peak_bytes


def _with_attention(config, impl):
    config._attn_implementation = impl
    return config


class TestParams(unittest.TestCase):
    def test_param_counts_equal_hf_modules(self):
        with torch.device("meta"):
            audio = Qwen3OmniMoeAudioEncoder(Qwen3OmniMoeAudioEncoderConfig(**OMNI["audio_config"]))
            vision = Qwen3OmniMoeVisionEncoder(Qwen3OmniMoeVisionEncoderConfig(**OMNI["vision_config"]))
            qwen25 = Qwen2_5_VisionTransformerPretrainedModel(Qwen2_5_VLVisionConfig(**QWEN25_VISION))
        count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
        self.assertEqual(omni_audio_tower(OMNI["audio_config"]).params(), count(audio))
        self.assertEqual(qwen_vision_tower(OMNI["vision_config"], "qwen3_omni_moe_vision").params(), count(vision))
        self.assertEqual(qwen_vision_tower(QWEN25_VISION, "qwen2_5_vl").params(), count(qwen25))

    def test_audio_tokens_equal_hf_lengths(self):
        tower = omni_audio_tower(OMNI["audio_config"])
        for frames in (1, 99, 100, 101, 800, 6400, 60_000, 60_037):
            self.assertEqual(tower.output_tokens(frames), int(_get_feat_extract_output_lengths(torch.tensor(frames))))
        self.assertEqual(tower.window_tokens, 104)  # n_window_infer 800 = 8 conv chunks of 13 tokens


class TestPeaksBoundReference(unittest.TestCase):
    def check(self, formula_cpu, formula_gpu, module_of, args, input_bytes, label):
        for impl, formula in (("eager", formula_cpu), ("sdpa", formula_gpu)):
            reference = hf_peak(module_of(impl), *args)
            ours = formula - input_bytes  # the reference's inputs were made before counting started
            print(f"{label} {impl}: HF {reference:,} B, formula {ours:,} B ({ours / reference:.3f}x)")
            self.assertGreaterEqual(ours, reference, f"{label} {impl}: the formula is below the reference peak")
            self.assertLessEqual(ours, MAX_OVER * reference, f"{label} {impl}: the formula overestimates")

    def test_omni_vision(self):
        tower = qwen_vision_tower(SMALL_OMNI_VISION, "qwen3_omni_moe_vision")
        for grid in ((16, 8, 8), (1, 32, 32)):  # many short frames (linear terms), one large image (scores)
            n = grid[0] * grid[1] * grid[2]
            pixels = torch.zeros(n, 3 * 2 * 16 * 16)
            self.check(tower.peak_bytes(VisionWork(grid), 4, False), tower.peak_bytes(VisionWork(grid), 4, True),
                       lambda impl: Qwen3OmniMoeVisionEncoder(_with_attention(
                           Qwen3OmniMoeVisionEncoderConfig(**SMALL_OMNI_VISION), impl)).eval(),
                       (pixels, torch.tensor([grid])), pixels.numel() * 4, f"omni vision {grid}")

    def test_qwen25_vision(self):
        tower = qwen_vision_tower(SMALL_QWEN25_VISION, "qwen2_5_vl")
        for grid in ((8, 8, 16), (1, 32, 32)):
            n = grid[0] * grid[1] * grid[2]
            pixels = torch.zeros(n, 3 * 2 * 14 * 14)
            self.check(tower.peak_bytes(VisionWork(grid), 4, False), tower.peak_bytes(VisionWork(grid), 4, True),
                       lambda impl: Qwen2_5_VisionTransformerPretrainedModel(_with_attention(
                           Qwen2_5_VLVisionConfig(**SMALL_QWEN25_VISION), impl)).eval(),
                       (pixels, torch.tensor([grid])), pixels.numel() * 4, f"qwen2.5 vision {grid}")

    def test_omni_audio(self):
        tower = omni_audio_tower(SMALL_OMNI_AUDIO)
        for frames in (800, 6400):  # one attention window; eight (64 s, the planned chunk)
            feats = torch.zeros(128, frames)
            self.check(tower.peak_bytes(frames, 4, False), tower.peak_bytes(frames, 4, True),
                       lambda impl: Qwen3OmniMoeAudioEncoder(_with_attention(
                           Qwen3OmniMoeAudioEncoderConfig(**SMALL_OMNI_AUDIO), impl)).eval(),
                       (feats, torch.tensor([frames])), feats.numel() * 4, f"omni audio {frames}")


class TestHandComputed(unittest.TestCase):
    def test_omni_image_term_on_gpu(self):
        """The largest Omni image (12,845,056 px -> 12,544 tokens -> 224 x 224 patches of 16 px), bf16, fused."""
        n, h = 224 * 224, 1152
        inventory = [
            ("pixel values, fp32 [N, 3*2*16*16]", n * 1536 * 4),
            ("rotary cos + sin, fp32 [N, 72] x 2", n * 72 * 2 * 4),
            ("residual stream [N, 1152]", n * h * 2),
            ("3 deepstack outputs [N/4, 2048]", 3 * (n // 4) * 2048 * 2),
            # the attention phase outweighs the MLP ([N, 1152 + 2 x 4304] x 2 B) and the final merger
            ("normed x, qkv, rotated q and k, attention output + its copy [N, 8 x 1152]", n * 8 * h * 2),
            ("rotary fp32 copies and temporaries [N, 4 x 1152]", n * 4 * h * 4),
        ]
        total = sum(b for _, b in inventory)
        self.assertEqual(total, 2_456_616_960)
        tower = qwen_vision_tower(OMNI["vision_config"], "qwen3_omni_moe_vision")
        self.assertEqual(tower.peak_bytes(VisionWork((1, 224, 224)), 2, fused_attention=True), total)


if __name__ == "__main__":
    unittest.main()
