"""Image preprocessing as a model's preprocessor_config.json says: resize, center crop, rescale, normalise.

    RGB image (w, h)
      -> cap: w*h > --max-image-pixels  => downscaled (aspect kept) when do_resize, else ValueError with the limit
      -> resize: size {"shortest_edge": s} (CLIP: short side to s, aspect kept) or {"height", "width"} (SigLIP)
      -> center crop to crop_size (when do_center_crop)
      -> x * rescale_factor, then (x - mean) / std per channel
      -> float32 [C, S, S], S = the vision tower's image_size (patchified by the tower's conv)
Without a preprocessor_config.json the defaults follow the vision config: resize to image_size x image_size,
bicubic, CLIP or SigLIP mean/std.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch
from PIL import Image

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
SIGLIP_MEAN = (0.5, 0.5, 0.5)
SIGLIP_STD = (0.5, 0.5, 0.5)
PIL_BICUBIC = 3


@dataclass(frozen=True)
class ImageProcessorConfig:
    image_size: int  # the vision tower's input side (pixels)
    do_resize: bool = True
    size: Tuple[str, ...] = ()  # ("shortest_edge", s) or ("height", h, "width", w), flattened for hashing
    resample: int = PIL_BICUBIC
    do_center_crop: bool = False
    crop_size: Tuple[int, int] = (0, 0)  # (height, width)
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: Tuple[float, ...] = CLIP_MEAN
    image_std: Tuple[float, ...] = CLIP_STD
    max_image_pixels: Optional[int] = None  # --max-image-pixels

    @classmethod
    def from_model_dir(cls, model_dir: str, vision_config, max_image_pixels: Optional[int] = None):
        clip = str(getattr(vision_config, "model_type", "")).startswith("clip")
        s = vision_config.image_size
        raw = {}
        path = os.path.join(model_dir, "preprocessor_config.json")
        if os.path.isfile(path):
            with open(path) as f:
                raw = json.load(f)
        size = raw.get("size", {"height": s, "width": s})
        if isinstance(size, int):
            size = {"shortest_edge": size}
        crop = raw.get("crop_size", {"height": s, "width": s})
        if isinstance(crop, int):
            crop = {"height": crop, "width": crop}
        return cls(
            image_size=s,
            do_resize=raw.get("do_resize", True),
            size=tuple(x for kv in size.items() for x in kv),
            resample=int(raw.get("resample", PIL_BICUBIC)),
            do_center_crop=raw.get("do_center_crop", False),
            crop_size=(crop["height"], crop["width"]),
            do_rescale=raw.get("do_rescale", True),
            rescale_factor=raw.get("rescale_factor", 1 / 255),
            do_normalize=raw.get("do_normalize", True),
            image_mean=tuple(raw.get("image_mean", CLIP_MEAN if clip else SIGLIP_MEAN)),
            image_std=tuple(raw.get("image_std", CLIP_STD if clip else SIGLIP_STD)),
            max_image_pixels=max_image_pixels,
        )

    def size_dict(self) -> dict:
        return dict(zip(self.size[0::2], self.size[1::2]))


def resize_output_size(w: int, h: int, size: dict) -> Tuple[int, int]:
    """(w, h) after the configured resize."""
    if "shortest_edge" in size:
        short = size["shortest_edge"]
        if w <= h:
            return short, int(short * h / w)
        return int(short * w / h), short
    return size["width"], size["height"]


def cap_pixels(img: Image.Image, cfg: ImageProcessorConfig) -> Image.Image:
    """Enforce --max-image-pixels: downscale (aspect kept) when the processor resizes anyway, else refuse."""
    w, h = img.size
    limit = cfg.max_image_pixels
    if limit is None or w * h <= limit:
        return img
    if not cfg.do_resize:
        raise ValueError(f"The image is {w}x{h} = {w * h:,} pixels, over this server's limit of {limit:,} pixels "
                         "(--max-image-pixels), and this model's processor does not resize. Send a smaller image.")
    scale = math.sqrt(limit / (w * h))
    return img.resize((max(1, int(w * scale)), max(1, int(h * scale))), resample=cfg.resample)


def preprocess_image(img: Image.Image, cfg: ImageProcessorConfig) -> torch.Tensor:
    """RGB PIL image -> float32 [C, S, S] for the vision tower."""
    img = cap_pixels(img, cfg)
    if cfg.do_resize:
        img = img.resize(resize_output_size(*img.size, cfg.size_dict()), resample=cfg.resample)
    x = np.asarray(img, dtype=np.float32)  # [h, w, C]
    if cfg.do_center_crop:
        ch, cw = cfg.crop_size
        h, w = x.shape[:2]
        top, left = (h - ch) // 2, (w - cw) // 2
        if top < 0 or left < 0:  # smaller than the crop: pad with zeros around it
            padded = np.zeros((max(h, ch), max(w, cw), x.shape[2]), dtype=np.float32)
            pt, pl = max(-top, 0), max(-left, 0)
            padded[pt:pt + h, pl:pl + w] = x
            x, top, left = padded, max(top, 0), max(left, 0)
        x = x[top:top + ch, left:left + cw]
    if cfg.do_rescale:
        x = x * np.float32(cfg.rescale_factor)
    if cfg.do_normalize:
        x = (x - np.asarray(cfg.image_mean, np.float32)) / np.asarray(cfg.image_std, np.float32)
    h, w = x.shape[:2]
    if (h, w) != (cfg.image_size, cfg.image_size):
        raise ValueError(f"The image is {w}x{h} after preprocessing; this model's vision tower takes "
                         f"{cfg.image_size}x{cfg.image_size} images and its processor does not resize to that.")
    return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))  # [C, S, S]
