"""load_video: an API video reference -> the sampled RGB frames and the rate they were sampled at (PyAV).

    bytes (data:video/...;base64, base64, raw bytes, a local file under --allowed-local-media-path)
      -> the stream header's frame size checked against MAX_DECODED_IMAGE_PIXELS before anything is decoded; an
         MJPEG stream's packets are whole JPEGs, and each one's own header (SOF) is checked as it is demuxed
      -> demux once, counting the first video stream's frames (no decoding), and read its frame rate
      -> frame indices: num = total / fps_in * fps (the processor's fps, default 2), at least min_frames, at most
         max_frames (the processor's, capped by --max-video-frames) and the frames there are, rounded down to the
         temporal patch size; indices spread uniformly (i * total / num)
      -> decode, keeping only those frames (RGB), each passed through `fit` (the processor's resize) as soon as it is decoded, so
         a long video never holds its frames at full size
The sampled rate is num / duration; the model's temporal positions use temporal_patch / sampled rate seconds per
temporal patch. Runs in the caller's thread: the server calls it on the OffLoopExecutor, never the event loop. The
frame -> RGB step is to_ndarray (swscale, GIL released), not PyAV's to_image, which holds the GIL ~240 ms for an
8000x8000 frame and stalled the HTTP loop that long.
Anything that is not a decodable video with frames is a ValueError (the server answers 400).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

from PIL import Image

from sglang.srt.multimodal.image_loader import MAX_DECODED_IMAGE_PIXELS, decode_error_words, media_bytes


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


def jpeg_size(data: bytes) -> Optional[Tuple[int, int]]:
    """(width, height) from a JPEG's start-of-frame marker (None if there is none): the header, no pixel data."""
    i = 2 if data[:2] == b"\xff\xd8" else -1
    while 0 <= i < len(data) - 9:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # SOF0..SOF15
            return int.from_bytes(data[i + 7:i + 9], "big"), int.from_bytes(data[i + 5:i + 7], "big")
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # markers without a length
            i += 2
            continue
        i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
    return None


def check_frame_size(width: int, height: int, where: str) -> None:
    if width * height > MAX_DECODED_IMAGE_PIXELS:
        raise ValueError(f"The video's frames are {width}x{height} = {width * height:,} pixels ({where}); at most "
                         f"{MAX_DECODED_IMAGE_PIXELS:,} pixels per frame are decoded. Downscale the video before "
                         "sending.")


def _open(data: bytes):
    import av

    try:
        return av.open(io.BytesIO(data), mode="r")
    except (av.FFmpegError, ValueError, OSError) as e:
        raise ValueError(f"The video data could not be decoded as a video ({decode_error_words(e)}).") from e


def _video_stream(container):
    streams = container.streams.video
    if not streams:
        raise ValueError("The video data has no video stream.")
    return streams[0]


def load_video(item: Any, allowed_local_media_path: Optional[str], fps: float, min_frames: int, max_frames: int,
               temporal_patch: int = 2,
               fit: Optional[Callable[[Image.Image], Image.Image]] = None) -> SampledVideo:
    """fit(frame) -> frame: applied to each kept frame right after it is decoded (the processor's resize); None keeps
    frames at their decoded size."""
    import av

    data = media_bytes(item, allowed_local_media_path, "video")
    if not data:
        raise ValueError("The video data is empty.")
    try:
        with _open(data) as container:  # pass 1: headers only -- frame sizes and count, nothing decoded
            stream = _video_stream(container)
            ctx = stream.codec_context
            check_frame_size(ctx.width or 0, ctx.height or 0, "the stream header")
            mjpeg = ctx.name in ("mjpeg", "jpeg2000", "mjpegb")
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate
            total = 0
            for packet in container.demux(stream):
                if packet.size <= 0:
                    continue
                total += 1
                size = jpeg_size(bytes(packet)) if mjpeg else None
                if size is not None:
                    check_frame_size(*size, f"the JPEG header of frame {total - 1}")
        if total == 0:
            raise ValueError("The video has no frames.")
        source_fps = float(rate) if rate else 0.0
        if source_fps <= 0:
            raise ValueError("The video does not declare a frame rate.")
        wanted = sample_indices(total, source_fps, fps, min_frames, max_frames, temporal_patch)
        keep = set(wanted)
        frames: List[Image.Image] = []
        decoded_size = None
        with _open(data) as container:  # pass 2: decode, converting only the sampled frames
            stream = _video_stream(container)
            stream.thread_type = "AUTO"
            for i, frame in enumerate(container.decode(stream)):
                check_frame_size(frame.width, frame.height, f"frame {i}")
                if i in keep:
                    img = Image.fromarray(frame.to_ndarray(format="rgb24"), "RGB")
                    if decoded_size is None:
                        decoded_size = img.size
                    elif img.size != decoded_size:
                        raise ValueError(f"The video's frames change size ({decoded_size} to {img.size}); send a "
                                         "video of one frame size.")
                    frames.append(fit(img) if fit is not None else img)
                if len(frames) == len(keep):
                    break
    except av.FFmpegError as e:
        raise ValueError(f"The video data could not be decoded ({decode_error_words(e)}).") from e
    if not frames:
        raise ValueError("The video has no decodable frames.")
    duration_s = total / source_fps
    # fewer decodable frames than packets: keep what decoded, in order
    return SampledVideo(frames, len(frames) / duration_s, total, source_fps, decoded_size)
