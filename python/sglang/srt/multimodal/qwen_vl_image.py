"""Qwen2-VL / Qwen2.5-VL pixel preprocessing: dynamic resolution, patches grouped by 2x2 merge unit.

    frames (an image is one frame; a video's sampled frames), RGB, all of one size (w, h)
      -> smart_resize: each side rounded to a multiple of factor = patch_size * merge_size (28), the area brought
         into [min_pixels, max_pixels] with the aspect ratio kept (PIL bicubic)
      -> x * rescale_factor, (x - mean) / std per channel
      -> frames in groups of temporal_patch_size (an image is repeated; a video's last frame pads the last group)
      -> patches [grid_t * grid_h * grid_w, C * T * p * p] ordered (t, h/m, w/m, m, m), each flattened (C, T, p, p)
         grid_thw = (frames / T, h / p, w / p); the LLM sees grid_t * grid_h * grid_w / m^2 tokens
Settings come from preprocessor_config.json (images) and video_preprocessor_config.json (videos; else the video
defaults below), capped by --max-image-pixels.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from PIL import Image

from sglang.srt.multimodal.image_processing import CLIP_MEAN, CLIP_STD, PIL_BICUBIC

IMAGE_MIN_PIXELS = 56 * 56
IMAGE_MAX_PIXELS = 28 * 28 * 1280
VIDEO_MIN_PIXELS = 128 * 28 * 28  # per frame
VIDEO_MAX_PIXELS = 768 * 28 * 28  # per frame
VIDEO_FPS = 2.0
VIDEO_MIN_FRAMES = 4
VIDEO_MAX_FRAMES = 768
MAX_ASPECT_RATIO = 200


@dataclass(frozen=True)
class QwenVLPixelConfig:
    min_pixels: int
    max_pixels: int
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    resample: int = PIL_BICUBIC
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: Tuple[float, ...] = CLIP_MEAN
    image_std: Tuple[float, ...] = CLIP_STD
    # videos only
    fps: float = VIDEO_FPS
    min_frames: int = VIDEO_MIN_FRAMES
    max_frames: int = VIDEO_MAX_FRAMES

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_dict(cls, raw: dict, min_pixels: int, max_pixels: int, **defaults) -> "QwenVLPixelConfig":
        size = raw.get("size") or {}
        lo = raw.get("min_pixels") or size.get("shortest_edge") or size.get("min_pixels") or min_pixels
        hi = raw.get("max_pixels") or size.get("longest_edge") or size.get("max_pixels") or max_pixels
        keys = ("patch_size", "temporal_patch_size", "merge_size", "resample", "do_rescale", "rescale_factor",
                "do_normalize", "fps", "min_frames", "max_frames")
        kw = {k: raw[k] for k in keys if raw.get(k) is not None}
        for k in ("image_mean", "image_std"):
            if raw.get(k) is not None:
                kw[k] = tuple(raw[k])
        return cls(min_pixels=int(lo), max_pixels=int(hi), **{**defaults, **kw})

    def capped(self, max_image_pixels: Optional[int]) -> "QwenVLPixelConfig":
        """--max-image-pixels lowers max_pixels (never below one factor x factor tile)."""
        if max_image_pixels is None or max_image_pixels >= self.max_pixels:
            return self
        hi = max(max_image_pixels, self.factor * self.factor)
        return replace(self, max_pixels=hi, min_pixels=min(self.min_pixels, hi))


def _read_json(model_dir: str, name: str) -> dict:
    path = os.path.join(model_dir or "", name)
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def load_pixel_configs(model_dir: str, max_image_pixels: Optional[int]):
    """(image config, video config) of a Qwen2/2.5-VL checkpoint directory."""
    img_raw = _read_json(model_dir, "preprocessor_config.json")
    image = QwenVLPixelConfig.from_dict(img_raw, IMAGE_MIN_PIXELS, IMAGE_MAX_PIXELS)
    vid_raw = _read_json(model_dir, "video_preprocessor_config.json")
    shared = {k: getattr(image, k) for k in ("patch_size", "temporal_patch_size", "merge_size", "image_mean",
                                             "image_std", "rescale_factor")}
    video = QwenVLPixelConfig.from_dict(vid_raw, VIDEO_MIN_PIXELS, VIDEO_MAX_PIXELS, **shared)
    return image.capped(max_image_pixels), video.capped(max_image_pixels)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> Tuple[int, int]:
    """(height, width): multiples of factor, area within [min_pixels, max_pixels], aspect ratio kept."""
    if min(height, width) <= 0:
        raise ValueError(f"The image has zero size ({width}x{height}).")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"The image is {width}x{height}; its aspect ratio must be at most {MAX_ASPECT_RATIO}:1.")
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        scale = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / scale / factor) * factor)
        w = max(factor, math.floor(width / scale / factor) * factor)
    elif h * w < min_pixels:
        scale = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * scale / factor) * factor
        w = math.ceil(width * scale / factor) * factor
    if min(h, w) <= 0:
        raise ValueError(f"The image is {width}x{height}; it is too small to resize (min_pixels is {min_pixels}).")
    return h, w


def resized_frame(img: Image.Image, cfg: QwenVLPixelConfig) -> Image.Image:
    """A frame at its smart_resize size (what normalized_frame would resize it to; smart_resize of that size is
    itself, so preprocess_frames leaves it as is): lets a video loader shrink each frame as it is decoded."""
    w, h = img.size
    rh, rw = smart_resize(h, w, cfg.factor, cfg.min_pixels, cfg.max_pixels)
    return img if (rw, rh) == (w, h) else img.resize((rw, rh), resample=cfg.resample)


def normalized_frame(img: Image.Image, size_hw: Tuple[int, int], cfg: QwenVLPixelConfig) -> np.ndarray:
    """RGB PIL frame -> float32 [C, h, w], resized to size_hw, rescaled and normalised."""
    h, w = size_hw
    if img.size != (w, h):
        img = img.resize((w, h), resample=cfg.resample)
    x = np.asarray(img, dtype=np.float32)
    if cfg.do_rescale:
        x = x * np.float32(cfg.rescale_factor)
    if cfg.do_normalize:
        x = (x - np.asarray(cfg.image_mean, np.float32)) / np.asarray(cfg.image_std, np.float32)
    return x.transpose(2, 0, 1)


def patchify(frames: np.ndarray, cfg: QwenVLPixelConfig) -> Tuple[torch.Tensor, Tuple[int, int, int]]:
    """float32 [F, C, h, w] -> (patches [grid_t * grid_h * grid_w, C * T * p * p], (grid_t, grid_h, grid_w))."""
    tp, p, m = cfg.temporal_patch_size, cfg.patch_size, cfg.merge_size
    if len(frames) % tp:
        frames = np.concatenate([frames, np.repeat(frames[-1:], tp - len(frames) % tp, axis=0)])
    f, c, h, w = frames.shape
    gt, gh, gw = f // tp, h // p, w // p
    x = frames.reshape(gt, tp, c, gh // m, m, p, gw // m, m, p)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)  # (t, h/m, w/m, m, m, C, T, p, p)
    return torch.from_numpy(np.ascontiguousarray(x).reshape(gt * gh * gw, c * tp * p * p)), (gt, gh, gw)


def preprocess_frames(frames: Sequence[Image.Image], cfg: QwenVLPixelConfig,
                      repeat_to_temporal_patch: bool) -> Tuple[torch.Tensor, Tuple[int, int, int]]:
    """Frames of one image / video -> (patches, grid_thw). An image's one frame is repeated temporal_patch_size
    times, as the tower's 3-D patch embedding expects."""
    w, h = frames[0].size
    size = smart_resize(h, w, cfg.factor, cfg.min_pixels, cfg.max_pixels)
    arr = np.stack([normalized_frame(f, size, cfg) for f in frames])
    if repeat_to_temporal_patch:
        arr = np.repeat(arr, cfg.temporal_patch_size, axis=0)
    return patchify(arr, cfg)


def num_tokens_of(grid_thw: Sequence[int], merge_size: int) -> int:
    t, h, w = grid_thw
    return t * h * w // (merge_size * merge_size)


def largest_grid(cfg: QwenVLPixelConfig, num_frames: int = 1) -> Tuple[int, int, int]:
    """The grid (t, h, w) with the most patches smart_resize can produce under cfg.max_pixels (a square-ish
    frame of max_pixels, at num_frames frames): the encoder's largest accepted input."""
    side = cfg.factor
    best: List[int] = [side, side]
    units = cfg.max_pixels // (side * side)
    for a in range(1, units + 1):  # a x b tiles of factor x factor, a * b <= units, most tiles
        b = units // a
        if a * b > (best[0] // side) * (best[1] // side):
            best = [a * side, b * side]
    t = max(1, math.ceil(num_frames / cfg.temporal_patch_size))
    return t, best[0] // cfg.patch_size, best[1] // cfg.patch_size
