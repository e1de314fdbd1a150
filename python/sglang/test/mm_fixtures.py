"""Helpers for multimodal tests: small random-weight LLaVA checkpoints (CLIP or SigLIP tower) and test images.

The checkpoint directory holds config.json + model.safetensors (saved by transformers), preprocessor_config.json,
and the SmolLM2 tokenizer with an added "<image>" token (id IMAGE_TOKEN_ID), so the server can apply its chat
template. No pretrained VLM exists on the test machines; the weights are random (shapes, memory, equality with HF).
"""

from __future__ import annotations

import base64
import io
import json
import os
from typing import List, Optional

import torch

from sglang.test.engine_fixtures import spread_random_weights

IMAGE_TOKEN = "<image>"
IMAGE_SIZE = 64
PATCH_SIZE = 16


def make_random_llava(path: str, tower: str = "clip", seed: int = 0, image_size: int = IMAGE_SIZE,
                      patch_size: int = PATCH_SIZE, vision_layers: int = 2, vision_hidden: int = 64,
                      feature_layer=-2, select_strategy: Optional[str] = None, text_layers: int = 2,
                      preprocessor: Optional[dict] = None) -> str:
    """Save a random-weight LlavaForConditionalGeneration (fp32) with tokenizer and processor config to path."""
    from transformers import (AutoTokenizer, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration, SiglipVisionConfig)

    from sglang.test.engine_fixtures import default_model_dir

    tok = AutoTokenizer.from_pretrained(default_model_dir())
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    image_token_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
    vocab = (len(tok) + 63) // 64 * 64

    vkw = dict(hidden_size=vision_hidden, intermediate_size=2 * vision_hidden, num_hidden_layers=vision_layers,
               num_attention_heads=4, image_size=image_size, patch_size=patch_size)
    if tower == "clip":
        vision = CLIPVisionConfig(projection_dim=32, **vkw)
        strategy = select_strategy or "default"
    else:
        vision = SiglipVisionConfig(vision_use_head=False, **vkw)
        strategy = select_strategy or "full"
    text = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=text_layers,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                       bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_index=image_token_id,
                      vision_feature_layer=feature_layer, vision_feature_select_strategy=strategy)
    torch.manual_seed(seed)
    model = spread_random_weights(LlavaForConditionalGeneration(cfg).to(torch.float32))
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    if preprocessor is None:
        if tower == "clip":
            preprocessor = {"image_processor_type": "CLIPImageProcessor", "do_resize": True,
                            "size": {"shortest_edge": image_size}, "do_center_crop": True,
                            "crop_size": {"height": image_size, "width": image_size}, "resample": 3,
                            "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
                            "image_mean": [0.48145466, 0.4578275, 0.40821073],
                            "image_std": [0.26862954, 0.26130258, 0.27577711], "do_convert_rgb": True}
        else:
            preprocessor = {"image_processor_type": "SiglipImageProcessor", "do_resize": True,
                            "size": {"height": image_size, "width": image_size}, "resample": 3,
                            "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
                            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
    with open(os.path.join(path, "preprocessor_config.json"), "w") as f:
        json.dump(preprocessor, f, indent=2)
    return path


def make_image(seed: int, width: int = IMAGE_SIZE, height: int = IMAGE_SIZE):
    """A deterministic noisy RGB PIL image."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")


def png_bytes(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def data_url(img) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(img)).decode()


def hf_llava_greedy(model_dir: str, input_ids: List[int], pixel_values: torch.Tensor, max_new_tokens: int) -> List[int]:
    """Greedy continuation by HF transformers' LLaVA in float32 (input_ids with expanded image tokens)."""
    from transformers import LlavaForConditionalGeneration

    model = LlavaForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    x = torch.tensor([input_ids])
    with torch.no_grad():
        y = model.generate(x, pixel_values=pixel_values, attention_mask=torch.ones_like(x), do_sample=False,
                           max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, pad_token_id=0)
    return y[0, len(input_ids):].tolist()
