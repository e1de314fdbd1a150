"""The largest unit of encoder work per modality: what each encoder term is planned at, what the runner measures at
startup, and the chunk sizes processors and models cut long inputs into.

    image   one image at the largest accepted size: min(--max-image-pixels, the processor's max_pixels), resized to
            multiples of patch x merge (Qwen) or the tower's fixed image_size (LLaVA); a tiling processor's (Llama 4)
            max_patches tiles + the global view; x --encoder-batch-size
    video   one CHUNK of VIDEO_CHUNK_FRAMES frames (at most --max-video-frames) at the processor's per-frame pixel
            cap. A Qwen vision tower attends within one temporal slice (temporal_patch_size frames), so encoding a
            video chunk by chunk gives exactly the embeddings of encoding it whole; a longer video is encoded in
            chunks of this many frames, one after another
    audio   one CHUNK of AUDIO_CHUNK_SECONDS (at most --max-audio-seconds) of mel frames. Qwen3-Omni's audio tower
            attends within windows of n_window_infer mel frames and convolves chunks of 2 x n_window, so a chunk of
            whole windows encodes exactly as the whole input does; a Whisper-style tower (Qwen2-Audio) runs its
            fixed 30 s window
The chunk sizes are planned quantities (constants here, written once): models encode long items in these chunks and
processors report each item's chunk boundaries (docs/multimodal.md). Torch-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

from sglang.srt.mem_plan.encoder import EncoderSpec
from sglang.srt.mem_plan.encoder_llama4 import LLAMA4_MAX_PATCHES, LLAMA4_TILE_SIDE, Llama4VisionTower
from sglang.srt.mem_plan.encoder_towers import OmniAudioTower, QwenVisionTower, VisionWork

VIDEO_CHUNK_FRAMES = 16  # frames of one video encoder call (a multiple of every temporal_patch_size in use)
AUDIO_CHUNK_SECONDS = 64.0  # audio seconds of one encoder call (rounded down to whole attention windows)
MEL_FRAMES_PER_SECOND = 100  # 16 kHz audio, hop 160 (the Whisper feature extractor both Qwen audio towers use)
WHISPER_WINDOW_SECONDS = 30.0  # a Whisper-style tower's fixed input window


@dataclass(frozen=True)
class ProcessorFacts:
    """The processor's size caps (preprocessor_config.json, else the architecture's published defaults)."""

    image_max_pixels: int
    video_frame_max_pixels: int
    image_max_tiles: int = 0  # a tiling processor's max_patches (tiles per image, the global view not counted)


# Published defaults for checkpoints whose directory has no preprocessor_config.json (a config-only fixture):
#   qwen2_5_vl      Qwen2.5-VL-*-Instruct preprocessor_config.json max_pixels 12,845,056; video frames at the
#                   Qwen2-VL video processor's per-frame longest_edge 28 x 28 x 768
#   qwen3_omni_moe  Qwen3-Omni-30B-A3B-* preprocessor_config.json max_pixels 12,845,056; video frames at the Omni
#                   processor's videos_kwargs longest_edge 768 x 32 x 32
#   llama4          transformers' Llama4ImageProcessor: max_patches 16 tiles of 336 x 336 (images only; the video
#                   cap is the generic one, unused: the model has no video tower)
GENERIC_PROCESSOR = ProcessorFacts(12_845_056, 28 * 28 * 768)
PROCESSOR_DEFAULTS = {
    "qwen2_5_vl": ProcessorFacts(12_845_056, 28 * 28 * 768),
    "qwen3_omni_moe": ProcessorFacts(12_845_056, 768 * 32 * 32),
    "llama4": ProcessorFacts(LLAMA4_MAX_PATCHES * LLAMA4_TILE_SIDE ** 2, GENERIC_PROCESSOR.video_frame_max_pixels,
                             LLAMA4_MAX_PATCHES),
}


def processor_facts(model_type: str, preprocessor: Optional[dict]) -> ProcessorFacts:
    base = GENERIC_PROCESSOR
    for prefix, facts in PROCESSOR_DEFAULTS.items():
        if model_type.startswith(prefix):
            base = facts
    p = preprocessor or {}
    image = p.get("max_pixels") or (p.get("size") or {}).get("longest_edge") or base.image_max_pixels
    v = p.get("video") or {}
    video = v.get("max_pixels") or (v.get("size") or {}).get("longest_edge") or base.video_frame_max_pixels
    tiles = (p.get("max_patches") or base.image_max_tiles) if base.image_max_tiles else 0
    return ProcessorFacts(int(image), int(video), int(tiles))


def largest_grid(max_pixels: int, tower: QwenVisionTower) -> tuple[int, int]:
    """(rows, cols) of patches of the largest frame within max_pixels. smart_resize keeps h x w <= max_pixels in
    multiples of factor = patch x merge, so no frame has more than floor(max_pixels / factor^2) merged tokens; the
    grid holds exactly that many, laid out as close to square as a divisor allows (or, when the count has no divisor
    near its square root, ceil-rounded columns: a few tokens more, never fewer)."""
    tokens = max(max_pixels // tower.factor ** 2, 1)
    root = math.isqrt(tokens)
    rows = next((r for r in range(root, max(root // 2, 1) - 1, -1) if tokens % r == 0), root)
    cols = -(-tokens // rows)
    m = tower.spatial_merge_size
    return rows * m, cols * m


Tower = Union[EncoderSpec, QwenVisionTower, OmniAudioTower, Llama4VisionTower]


@dataclass(frozen=True)
class EncoderWorkload:
    """One modality's planned unit of encoder work (what the term is sized for and the runner measures)."""

    modality: str  # image / video / audio
    tower: Tower
    vision: Optional[VisionWork] = None  # Qwen vision towers; Llama 4: (tiles, side, side) patches
    mel_frames: int = 0  # audio towers: mel frames of one chunk
    units: int = 1  # admission units in the reservation (images per encoder call; one chunk for video / audio)
    chunk_frames: int = 0  # video: frames per chunk; audio: mel frames per chunk (0: items are not chunked)
    limit: str = ""  # the largest accepted item, for the rendered term

    def peak_bytes(self, act_bytes: int = 2, fused_attention: bool = True) -> int:
        t = self.tower
        if isinstance(t, (QwenVisionTower, Llama4VisionTower)):
            return t.peak_bytes(self.vision, act_bytes, fused_attention)
        if isinstance(t, OmniAudioTower):
            return t.peak_bytes(self.mel_frames, act_bytes, fused_attention)
        return t.peak_bytes_per_input * self.units  # EncoderSpec (LLaVA, Whisper-style): its own dtype and scores

    def unit_bytes(self, act_bytes: int = 2, fused_attention: bool = True) -> int:
        return -(-self.peak_bytes(act_bytes, fused_attention) // self.units)

    def describe(self) -> str:
        t = self.tower
        if isinstance(t, Llama4VisionTower):
            tiles, h, w = self.vision.grid_thw
            return (f"{t.name}: {self.units} image(s) of {tiles} tiles of {h}x{w} patches + a class token -> "
                    f"{t.output_tokens(self.vision):,} tokens ({self.limit})")
        if self.vision is not None:
            tt, h, w = self.vision.grid_thw
            what = (f"{self.units} image(s) of {h}x{w} patches" if self.modality == "image" else
                    f"chunk of {self.chunk_frames} frames = {tt}x{h}x{w} patches")
            return f"{t.name}: {what} -> {t.output_tokens(self.vision):,} tokens ({self.limit})"
        if isinstance(t, OmniAudioTower):
            return (f"{t.name}: chunk of {self.mel_frames:,} mel frames ({self.mel_frames / MEL_FRAMES_PER_SECOND:g} "
                    f"s) -> {t.output_tokens(self.mel_frames):,} tokens, windows of {t.window_tokens} ({self.limit})")
        return f"{t.name}: {t.max_tokens_per_input:,} tokens x batch {self.units}"


def video_chunk_frames(max_video_frames: int, temporal_patch_size: int) -> int:
    """Frames of one video encoder call: VIDEO_CHUNK_FRAMES, or the whole (shorter) largest video, in whole
    temporal slices."""
    frames = min(VIDEO_CHUNK_FRAMES, max_video_frames)
    return -(-frames // temporal_patch_size) * temporal_patch_size


def audio_chunk_mel_frames(tower: OmniAudioTower, max_audio_seconds: float) -> int:
    """Mel frames of one audio encoder call: AUDIO_CHUNK_SECONDS in whole attention windows (at least one), or the
    whole (shorter) longest audio."""
    longest = math.ceil(max_audio_seconds * MEL_FRAMES_PER_SECOND)
    window = tower.n_window_infer
    chunk = max(int(AUDIO_CHUNK_SECONDS * MEL_FRAMES_PER_SECOND) // window, 1) * window
    return min(chunk, longest)


def planned_workloads(encoders: tuple, processor: ProcessorFacts, sa) -> dict[str, EncoderWorkload]:
    """{modality: the largest unit of work} for a model's encoder towers under these ServerArgs limits."""
    out: dict[str, EncoderWorkload] = {}
    batch = sa.encoder_batch_size
    for tower in encoders:
        if isinstance(tower, QwenVisionTower):
            pixels = processor.image_max_pixels
            if sa.max_image_pixels is not None:
                pixels = min(pixels, sa.max_image_pixels)
            h, w = largest_grid(pixels, tower)
            out["image"] = EncoderWorkload("image", tower, VisionWork((1, h, w), batch), units=batch,
                                           limit=f"{pixels:,} pixels")
            frames = video_chunk_frames(sa.max_video_frames, tower.temporal_patch_size)
            vh, vw = largest_grid(processor.video_frame_max_pixels, tower)
            out["video"] = EncoderWorkload(
                "video", tower, VisionWork((frames // tower.temporal_patch_size, vh, vw)), chunk_frames=frames,
                limit=f"--max-video-frames {sa.max_video_frames} at {processor.video_frame_max_pixels:,} "
                      f"pixels/frame")
        elif isinstance(tower, Llama4VisionTower):
            # the processor pads an image to its tile canvas: --max-image-pixels does not bound the tiles
            tiles = processor.image_max_tiles or LLAMA4_MAX_PATCHES
            out["image"] = EncoderWorkload("image", tower, tower.largest_work(tiles, batch), units=batch,
                                           limit=f"max_patches {tiles} + the global view")
        elif isinstance(tower, OmniAudioTower):
            mel = audio_chunk_mel_frames(tower, sa.max_audio_seconds)
            out["audio"] = EncoderWorkload("audio", tower, mel_frames=mel, chunk_frames=mel,
                                           limit=f"--max-audio-seconds {sa.max_audio_seconds:g}")
        elif tower.name == "audio":  # Whisper-style: one fixed window per call
            window = int(WHISPER_WINDOW_SECONDS * MEL_FRAMES_PER_SECOND)
            out["audio"] = EncoderWorkload("audio", tower, mel_frames=window, chunk_frames=window,
                                           limit=f"--max-audio-seconds {sa.max_audio_seconds:g}")
        else:  # a fixed-resolution image tower (LLaVA)
            out["image"] = EncoderWorkload("image", tower, units=batch, limit="fixed image_size")
    return out
