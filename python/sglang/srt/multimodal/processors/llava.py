"""LLaVA processor: one fixed-resolution image per image token, num_patches (+ CLS with strategy "full") tokens."""

from __future__ import annotations

import torch

from sglang.srt.multimodal.image_processing import ImageProcessorConfig, preprocess_image
from sglang.srt.multimodal.processors.base_processor import BaseMultimodalProcessor, item_limits_of


def image_token_id_of(hf_config) -> int:
    for name in ("image_token_id", "image_token_index"):
        value = getattr(hf_config, name, None)
        if value is not None:
            return int(value)
    raise ValueError("The LLaVA config has no image_token_index / image_token_id.")


def llava_num_image_tokens(hf_config) -> int:
    v = hf_config.vision_config
    n = (v.image_size // v.patch_size) ** 2
    clip = str(getattr(v, "model_type", "")).startswith("clip")
    if clip and getattr(hf_config, "vision_feature_select_strategy", "default") == "full":
        n += 1  # the class token is kept
    return n


class LlavaImageProcessor(BaseMultimodalProcessor):
    def __init__(self, hf_config, model_dir: str, server_args):
        self.image_token_id = image_token_id_of(hf_config)
        text = hf_config.text_config
        self.vocab_size = text.vocab_size
        self.bos_token_id = getattr(text, "bos_token_id", None)
        self.allowed_local_media_path = server_args.allowed_local_media_path
        self.item_limits = item_limits_of(server_args)
        self.config = ImageProcessorConfig.from_model_dir(model_dir, hf_config.vision_config,
                                                          server_args.max_image_pixels)
        self.tokens_per_image = llava_num_image_tokens(hf_config)

    def preprocess(self, image) -> torch.Tensor:
        return preprocess_image(image, self.config)

    def num_image_tokens(self, pixel_values: torch.Tensor) -> int:
        return self.tokens_per_image

    @property
    def max_tokens_per_image(self) -> int:
        return self.tokens_per_image

    @property
    def max_pixel_values_shape(self) -> tuple:
        s = self.config.image_size
        return (3, s, s)
