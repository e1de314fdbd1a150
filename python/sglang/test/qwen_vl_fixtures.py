"""Helpers for Qwen2.5-VL tests: a small random-weight checkpoint, tiny videos made with PyAV, and HF
transformers' greedy tokens for our processor's output (the reference).

The checkpoint directory holds config.json + model.safetensors (saved by transformers from its own
Qwen2_5_VLConfig), preprocessor_config.json and video_preprocessor_config.json with small pixel limits, and the
SmolLM2 tokenizer with Qwen's four vision tokens added, so the server can apply its chat template.
"""

from __future__ import annotations

import base64
import io
import json
import os
from typing import List

import torch

from sglang.test.engine_fixtures import spread_random_weights

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
PATCH = 14
MIN_PIXELS = 56 * 56  # 2 x 2 merge units
MAX_PIXELS = 28 * 28 * 16  # 16 merge units: 64 patches, 16 tokens
VIDEO_MAX_PIXELS = 28 * 28 * 6  # per frame
VIDEO_FPS = 2.0


def make_random_qwen2_5_vl(path: str, seed: int = 0, vision_depth: int = 2, window_size: int = 56,
                           tokens_per_second: int = 2, video_max_frames: int = 16) -> str:
    """Save a random-weight Qwen2_5_VLForConditionalGeneration (fp32) with tokenizer and processor configs."""
    from transformers import AutoTokenizer, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from sglang.test.engine_fixtures import default_model_dir

    tok = AutoTokenizer.from_pretrained(default_model_dir())
    tok.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    ids = dict(zip(VISION_TOKENS, tok.convert_tokens_to_ids(VISION_TOKENS)))
    vocab = (len(tok) + 63) // 64 * 64
    text = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-6, bos_token_id=1,
                eos_token_id=2, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}, rope_theta=10000.0)
    vision = dict(depth=vision_depth, hidden_size=32, intermediate_size=64, num_heads=4, patch_size=PATCH,
                  temporal_patch_size=2, spatial_merge_size=2, window_size=window_size, out_hidden_size=64,
                  fullatt_block_indexes=[vision_depth - 1], tokens_per_second=tokens_per_second)
    cfg = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                           video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                           vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = spread_random_weights(Qwen2_5_VLForConditionalGeneration(cfg).to(torch.float32))
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    common = {"patch_size": PATCH, "temporal_patch_size": 2, "merge_size": 2, "do_rescale": True,
              "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
              "image_std": [0.26862954, 0.26130258, 0.27577711], "resample": 3}
    with open(os.path.join(path, "preprocessor_config.json"), "w") as f:
        json.dump({"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": MIN_PIXELS,
                   "max_pixels": MAX_PIXELS, **common}, f, indent=2)
    with open(os.path.join(path, "video_preprocessor_config.json"), "w") as f:
        json.dump({"video_processor_type": "Qwen2VLVideoProcessor", "fps": VIDEO_FPS, "min_frames": 4,
                   "max_frames": video_max_frames,
                   "size": {"shortest_edge": MIN_PIXELS, "longest_edge": VIDEO_MAX_PIXELS}, **common}, f, indent=2)
    return path


def make_video(seed: int, num_frames: int = 8, width: int = 64, height: int = 48, fps: int = 4,
               codec: str = "mpeg4") -> bytes:
    """A deterministic noisy mp4 (PyAV)."""
    import av
    import numpy as np

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as c:
        s = c.add_stream(codec, rate=fps)
        s.width, s.height, s.pix_fmt = width, height, "yuv420p"
        base = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        for i in range(num_frames):
            frame = np.roll(base, 3 * i, axis=1)  # moving content: frames differ
            for p in s.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return buf.getvalue()


def video_data_url(data: bytes) -> str:
    return "data:video/mp4;base64," + base64.b64encode(data).decode()


def hf_inputs(mm, image_token_id: int, video_token_id: int) -> dict:
    """Our processor's output -> HF's generate() kwargs: pad ids back to the image/video token, token types,
    pixel_values(_videos), grids, second_per_grid_ts."""
    ids = list(mm.input_ids)
    types = [0] * len(ids)
    kw = {}
    for modality, token, kind in (("image", image_token_id, 1), ("video", video_token_id, 2)):
        items = [it for it in mm.mm_items if it.modality == modality]
        for it in items:
            ids[it.offset : it.end] = [token] * it.num_tokens
            types[it.offset : it.end] = [kind] * it.num_tokens
        if items:
            key = "pixel_values" if modality == "image" else "pixel_values_videos"
            kw[key] = torch.cat([it.feature for it in items])
            kw[f"{modality}_grid_thw"] = torch.tensor([list(it.metadata["grid_thw"]) for it in items])
            if modality == "video":
                kw["second_per_grid_ts"] = torch.tensor([it.metadata["second_per_grid_t"] for it in items])
    x = torch.tensor([ids])
    return {"input_ids": x, "attention_mask": torch.ones_like(x), "mm_token_type_ids": torch.tensor([types]), **kw}


def hf_qwen_vl_greedy(model, mm, image_token_id: int, video_token_id: int, max_new_tokens: int) -> List[int]:
    """Greedy continuation by HF transformers' Qwen2.5-VL (fp32) on our processor's output."""
    kw = hf_inputs(mm, image_token_id, video_token_id)
    with torch.no_grad():
        y = model.generate(**kw, do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                           pad_token_id=0)
    return y[0, kw["input_ids"].shape[1]:].tolist()
