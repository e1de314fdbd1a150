"""The encoder formulas (mem_plan/encoder_towers.py) against HF transformers' reference towers: parameter counts equal
the HF modules' on the published Qwen3-Omni and Qwen2.5-VL configs, and Llama 4's vision tower and projector equal
those of HF's Llama4ForConditionalGeneration on the meta device (Scout, Maverick); each formula peak bounds the live
tensor bytes the HF tower actually holds (counted op by op, LiveTensorPeak) from above, by at most 30%, with eager
attention (score matrices materialised: the CPU formula) and SDPA (fused: the GPU formula). Plus the real Omni and
Llama-4-Scout image terms worked out by hand, tensor by tensor, and `sglang plan` of the Llama 4 composites."""

import json
import math
import os
import types
import unittest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=40, suite="cpu")

import torch  # noqa: E402
from meta_model import FIXTURES, fixture_config, hf_tensors  # noqa: E402
from transformers.models.llama4.configuration_llama4 import Llama4VisionConfig  # noqa: E402
from transformers.models.llama4.modeling_llama4 import Llama4MultiModalProjector, Llama4VisionModel  # noqa: E402
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

from sglang.cli.plan import run  # noqa: E402
from sglang.srt.mem_plan.encoder_llama4 import llama4_vision_tower  # noqa: E402
from sglang.srt.mem_plan.encoder_plan import encoder_workloads  # noqa: E402
from sglang.srt.mem_plan.encoder_towers import VisionWork, omni_audio_tower, qwen_vision_tower  # noqa: E402
from sglang.srt.mem_plan.model_shapes import model_shape_from_config, model_shape_from_path  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402
from sglang.test.live_tensor_peak import LiveTensorPeak  # noqa: E402

OMNI = json.load(open(os.path.join(FIXTURES, "qwen3-omni-30b-a3b-instruct", "config.json")))["thinker_config"]
QWEN25_VISION = json.load(open(os.path.join(FIXTURES, "qwen2.5-vl-7b-instruct", "config.json")))["vision_config"]
MAX_OVER = 1.30  # the formula may exceed the reference peak by this factor, never fall below it

SMALL_OMNI_VISION = dict(depth=2, hidden_size=128, intermediate_size=480, num_heads=4, out_hidden_size=96,
                         patch_size=16, deepstack_visual_indexes=[0, 1], num_position_embeddings=64)
SMALL_QWEN25_VISION = dict(depth=4, hidden_size=128, intermediate_size=344, num_heads=4, out_hidden_size=96,
                           patch_size=14, window_size=112, fullatt_block_indexes=[1, 3])
SMALL_LLAMA4_VISION = dict(model_type="llama4_vision_model", hidden_size=128, intermediate_size=512,
                           num_hidden_layers=2, num_attention_heads=4, image_size=112, patch_size=14,
                           pixel_shuffle_ratio=0.5, projector_input_dim=256, projector_output_dim=256,
                           vision_output_dim=256, num_channels=3)
LLAMA4 = ("llama-4-scout-17b-16e", "llama-4-maverick-17b-128e-instruct")
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


def hf_llama4_part(name: str, prefix: str) -> int:
    """Parameters of one part of HF's Llama4ForConditionalGeneration (meta device), by its module name."""
    return sum(math.prod(shape) for n, shape in hf_tensors(name).items() if n.startswith(prefix))


class TestLlama4Params(unittest.TestCase):
    def test_tower_and_projector_equal_hf_meta_model(self):
        for name in LLAMA4:
            with self.subTest(name):
                cfg = fixture_config(name)
                tower = llama4_vision_tower(cfg["vision_config"], cfg["text_config"]["hidden_size"])
                self.assertEqual(tower.params(), hf_llama4_part(name, "vision_model."))
                self.assertEqual(tower.projector_params(), hf_llama4_part(name, "multi_modal_projector."))
        self.assertEqual(hf_llama4_part(LLAMA4[0], "vision_model."), 850_960_896)
        self.assertEqual(hf_llama4_part(LLAMA4[0], "multi_modal_projector."), 20_971_520)

    def test_composite_counts_text_tower_and_projector_on_every_rank(self):
        for name in LLAMA4:
            with self.subTest(name):
                cfg = fixture_config(name)
                whole = model_shape_from_config(cfg)
                text = model_shape_from_config(dict(cfg["text_config"], torch_dtype=cfg["torch_dtype"]))
                self.assertEqual(whole.text.model_type, "llama4_text")
                self.assertEqual(whole.text.dtype, text.text.dtype)
                for tp in (1, 4, 8):  # the towers are replicated: each rank holds them whole
                    p = whole.params(tp)
                    self.assertEqual(p.pop("vision_tower"), hf_llama4_part(name, "vision_model."))
                    self.assertEqual(p.pop("projector"), hf_llama4_part(name, "multi_modal_projector."))
                    self.assertEqual(p, text.params(tp))
                # tower + projector + language model == every parameter of HF's composite
                self.assertEqual(whole.num_params, sum(math.prod(s) for s in hf_tensors(name).values()))

    def test_missing_tower_key_refused_by_name(self):
        cfg = fixture_config(LLAMA4[0])
        cfg["vision_config"] = {k: v for k, v in cfg["vision_config"].items() if k != "pixel_shuffle_ratio"}
        with self.assertRaisesRegex(ValueError, "llama4_vision_model.*'pixel_shuffle_ratio'"):
            model_shape_from_config(cfg)


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

    def test_llama4_vision(self):
        """Tower + projector, as the composite runs them per image. Five and 17 tiles (Scout's largest image): with
        one tile of this small tower the meter's count is dominated by the weights' transposed views it counts as
        new tensors, not by activations."""
        text_hidden = 96
        tower = llama4_vision_tower(SMALL_LLAMA4_VISION, text_hidden)
        hf_keys = {k: v for k, v in SMALL_LLAMA4_VISION.items() if k != "model_type"}

        def module_of(impl):
            config = _with_attention(Llama4VisionConfig(**hf_keys), impl)
            vision = Llama4VisionModel(config)
            projector = Llama4MultiModalProjector(types.SimpleNamespace(
                vision_config=config, text_config=types.SimpleNamespace(hidden_size=text_hidden)))

            class TowerAndProjector(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.vision, self.projector = vision, projector

                def forward(self, pixels):
                    return self.projector(self.vision(pixels).last_hidden_state)

            return TowerAndProjector().eval()

        for tiles in (5, 17):
            pixels = torch.zeros(tiles, 3, 112, 112)
            work = VisionWork((tiles, 8, 8))
            # the rotary table is a buffer of the module, made before counting: like the input, not in the reference
            made_before = pixels.numel() * 4 + tower.rotary_table_bytes()
            self.check(tower.peak_bytes(work, 4, False), tower.peak_bytes(work, 4, True), module_of, (pixels,),
                       made_before, f"llama4 vision {tiles} tiles")
            self.assertEqual(tuple(module_of("sdpa")(pixels).shape), (tiles, tower.output_tokens_per_tile, text_hidden))

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

    def test_llama4_scout_image_term(self):
        """Scout's largest image: transformers' Llama4ImageProcessor cuts it into at most max_patches 16 tiles of
        336 x 336 and adds a global view: 17 tiles of 24 x 24 patches + a class token = 577 tokens, attending within
        a tile; bf16. Per token, the attention phase (8 x 1408 x 2 B + 4 x 1408 x 4 B) outweighs the MLP ([1408 + 2 x
        5632] x 2 B); per tile that phase (577 x [residual + attention]) outweighs the unfold phase and the adapter /
        projector phase."""
        tiles, S, H, heads = 17, 577, 1408, 16
        inventory = [
            ("pixel values, fp32 [17, 3, 336, 336]", tiles * 3 * 336 * 336 * 4),
            ("rotary table, complex64 [577, 1, 44]", S * 44 * 8),
            ("residual stream [17, 577, 1408]", tiles * S * H * 2),
            ("normed x, q, k, v, rotated q and k, attention output + its copy [17, 577, 8 x 1408]", tiles * S * 8 * H * 2),
            ("rotary fp32 q and k and their complex products [17, 577, 4 x 1408] fp32", tiles * S * 4 * H * 4),
        ]
        total = sum(b for _, b in inventory)
        self.assertEqual(total, 492_810_336)
        shape = model_shape_from_config(fixture_config(LLAMA4[0]))
        work = encoder_workloads(shape, ServerArgs())
        self.assertEqual(list(work), ["image"])  # Llama 4 encodes images only
        self.assertEqual(work["image"].vision.grid_thw, (17, 24, 24))
        self.assertEqual(work["image"].peak_bytes(2, fused_attention=True), total)
        self.assertEqual(shape.encoders[0].output_tokens(work["image"].vision), 17 * 144)  # 24 x 24 shuffled by 0.5
        # on a CPU every tile's [16, 577, 577] scores and their softmax are held at once (the tiles are one batch)
        self.assertEqual(work["image"].peak_bytes(2, fused_attention=False), total + 2 * tiles * heads * S * S * 2)


class TestLlama4Plan(unittest.TestCase):
    def test_preprocessor_max_patches(self):
        """A checkpoint's preprocessor_config.json max_patches sets the tiles (+ the global view, added only when an
        image can have more than one tile); without one, transformers' default 16."""
        cfg = fixture_config(LLAMA4[0])
        for preprocessor, tiles in ((None, 17), ({"max_patches": 4, "size": {"height": 336, "width": 336}}, 5),
                                    ({"max_patches": 1}, 1)):
            with self.subTest(preprocessor):
                shape = model_shape_from_config(dict(cfg, _preprocessor_config=preprocessor) if preprocessor else cfg)
                self.assertEqual(encoder_workloads(shape, ServerArgs())["image"].vision.grid_thw, (tiles, 24, 24))

    def test_scout_and_maverick_plan(self):
        for name in LLAMA4:
            with self.subTest(name):
                status, result, text = run(["--model-path", os.path.join(FIXTURES, name), "--gpu", "h100-80gb"])
                self.assertEqual(result["num_params"], sum(math.prod(s) for s in hf_tensors(name).values()))
                self.assertEqual(status, 1)  # bf16 weights alone exceed one card; the shortfall is named
                self.assertIn("short by", text)
                self.assertIn("encoder_image", text)
                self.assertIn("planned; not served by this runtime", text)

    def test_scout_planned_over_four_ranks_with_whole_towers(self):
        # a served multimodal model runs on one rank (configs/resolved.check_tp_sharding); a planned-only one is
        # planned over tp ranks with each rank holding the whole towers
        name = "llama-4-scout-17b-16e"
        status, result, text = run(["--model-path", os.path.join(FIXTURES, name), "--gpu", "h100-80gb", "--tp", "4"])
        self.assertEqual(status, 0, text)
        shape = model_shape_from_path(os.path.join(FIXTURES, name))
        towers = shape.params(4)["vision_tower"] + shape.params(4)["projector"]
        self.assertEqual(towers, shape.params(1)["vision_tower"] + shape.params(1)["projector"])
        self.assertIn("planned; not served by this runtime", text)


if __name__ == "__main__":
    unittest.main()
