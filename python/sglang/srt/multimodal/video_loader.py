"""load_video: an API video reference -> the sampled RGB frames and the rate they were sampled at (PyAV).

    bytes (data:video/...;base64, base64, raw bytes, a local file under --allowed-local-media-path)
      -> demux once, counting the first video stream's frames (no decoding), and read its frame rate
      -> frame indices: num = total / fps_in * fps (the processor's fps, default 2), at least min_frames, at most
         max_frames (the processor's, capped by --max-video-frames) and the frames there are, rounded down to the
         temporal patch size; indices spread uniformly (i * total / num)
      -> decode, keeping only those frames (RGB)
The sampled rate is num / duration; the model's temporal positions use temporal_patch / sampled rate seconds per
temporal patch. Runs in the caller's thread: the server calls it on the OffLoopExecutor, never the event loop.
Anything that is not a decodable video with frames is a ValueError (the server answers 400).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any, List, Optional

from PIL import Image

from sglang.srt.multimodal.image_loader import MAX_DECODED_IMAGE_PIXELS, media_bytes


@dataclass
class SampledVideo:
    frames: List[Image.Image]
    sampled_fps: float  # frames kept per second of video
    total_frames: int
    source_fps: float
    size: tuple  # (width, height)


def sample_indices(total: int, source_fps: float, fps: float, min_frames: int, max_frames: int,
                   temporal_patch: int) -> List[int]:
    """Indices of the frames to keep (see the module docstring)."""
    cap = max(temporal_patch, math.floor(min(max_frames, total) / temporal_patch) * temporal_patch)
    num = min(max(total / source_fps * fps, min_frames), cap, total)
    num = max(1, math.floor(num / temporal_patch) * temporal_patch) if num >= temporal_patch else max(1, int(num))
    return sorted({min(total - 1, int(i * total / num)) for i in range(num)})


def _open(data: bytes):
    import av

    try:
        return av.open(io.BytesIO(data), mode="r")
    except (av.FFmpegError, ValueError, OSError) as e:
        raise ValueError(f"The video data could not be decoded as a video ({type(e).__name__}: {e}).") from e


def _video_stream(container):
    streams = container.streams.video
    if not streams:
        raise ValueError("The video data has no video stream.")
    return streams[0]


def load_video(item: Any, allowed_local_media_path: Optional[str], fps: float, min_frames: int, max_frames: int,
               temporal_patch: int = 2) -> SampledVideo:
    import av

    data = media_bytes(item, allowed_local_media_path, "video")
    if not data:
        raise ValueError("The video data is empty.")
    try:
        with _open(data) as container:  # pass 1: count frames without decoding
            stream = _video_stream(container)
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate
            total = sum(1 for packet in container.demux(stream) if packet.size > 0)
        if total == 0:
            raise ValueError("The video has no frames.")
        source_fps = float(rate) if rate else 0.0
        if source_fps <= 0:
            raise ValueError("The video does not declare a frame rate.")
        wanted = sample_indices(total, source_fps, fps, min_frames, max_frames, temporal_patch)
        keep = set(wanted)
        frames: List[Image.Image] = []
        with _open(data) as container:  # pass 2: decode, converting only the sampled frames
            stream = _video_stream(container)
            stream.thread_type = "AUTO"
            for i, frame in enumerate(container.decode(stream)):
                if frame.width * frame.height > MAX_DECODED_IMAGE_PIXELS:
                    raise ValueError(f"The video's frames are {frame.width}x{frame.height}; at most "
                                     f"{MAX_DECODED_IMAGE_PIXELS:,} pixels per frame are accepted.")
                if i in keep:
                    frames.append(frame.to_image())
                if len(frames) == len(keep):
                    break
    except av.FFmpegError as e:
        raise ValueError(f"The video data could not be decoded ({type(e).__name__}: {e}).") from e
    if not frames:
        raise ValueError("The video has no decodable frames.")
    if len(frames) < len(wanted):  # fewer decodable frames than packets: keep what decoded, in order
        frames = frames[: max(1, len(frames))]
    sizes = {f.size for f in frames}
    if len(sizes) != 1:
        raise ValueError(f"The video's frames change size ({sorted(sizes)[:2]}); send a video of one frame size.")
    duration_s = total / source_fps
    return SampledVideo([f.convert("RGB") for f in frames], len(frames) / duration_s, total, source_fps,
                        frames[0].size)
