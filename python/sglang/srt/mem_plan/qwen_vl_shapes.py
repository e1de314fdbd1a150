"""The Qwen2-VL / Qwen2.5-VL vision tower in the plan: its parameter count and its EncoderSpec.

The tower (models/qwen2_5_vl_vision.py): a bias-free 3-D patch embedding, `depth` blocks (two RMSNorms, qkv + proj
with biases, a SwiGLU MLP with biases), and the patch merger (RMSNorm, Linear(4H, 4H), GELU, Linear(4H, out)) that
also projects into the language model -- so there is no separate projector. Its input size is dynamic: the spec's
largest input is an image of `max_pixels` (the processor's default unless the caller knows better), one patch per
patch_size^2 pixels.
"""

from __future__ import annotations

from sglang.srt.mem_plan.encoder import EncoderSpec

# Qwen2-VL's image processor default (preprocessor_config.json "max_pixels"): 1280 tokens of 28 x 28 pixels.
QWEN_VL_DEFAULT_MAX_PIXELS = 28 * 28 * 1280


def is_qwen_vl_vision(v: dict) -> bool:
    return str(v.get("model_type", "")).startswith(("qwen2_5_vl", "qwen2_vl")) or "depth" in v


def qwen_vl_vision_params(v: dict) -> int:
    h, inter, depth = v["hidden_size"], v["intermediate_size"], v["depth"]
    c, p, t = v.get("in_channels", 3), v.get("patch_size", 14), v.get("temporal_patch_size", 2)
    m, out = v.get("spatial_merge_size", 2), v.get("out_hidden_size", h)
    block = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * (h * inter + inter) + (inter * h + h)
    unit = h * m * m
    merger = h + (unit * unit + unit) + (unit * out + out)
    return c * t * p * p * h + depth * block + merger


def qwen_vl_encoder_spec(v: dict, act_dtype_bytes: int = 2,
                         max_pixels: int = QWEN_VL_DEFAULT_MAX_PIXELS) -> EncoderSpec:
    p = v.get("patch_size", 14)
    return EncoderSpec("vision", v["depth"], v["hidden_size"], v["intermediate_size"], v["num_heads"],
                       max_pixels // (p * p), v.get("out_hidden_size", v["hidden_size"]), act_dtype_bytes)
