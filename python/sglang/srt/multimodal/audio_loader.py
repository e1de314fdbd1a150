"""load_audio: an API audio reference -> mono float32 samples at the feature extractor's rate, or ValueError.

Accepted references (each resolved to bytes by image_loader.media_bytes, kind "audio"):
    OpenAI's input_audio object   {"data": <base64>, "format": "wav" | "mp3" | "flac" | "ogg" | ...}
    SGLang's audio_url            "data:audio/...;base64,...", a bare base64 string, a local file (plain or file://)
                                  under --allowed-local-media-path ({"url": ...} too); remote URLs are refused
    raw bytes, or an already decoded (samples, sampling_rate) pair / 1-D numpy array at the target rate
Decoding is libsndfile's (`soundfile`: wav, flac, ogg/vorbis, mp3 with libsndfile >= 1.1), channels are averaged
to mono, and `soxr` resamples to the target rate. The duration is checked against the limit from the header,
before the samples are read, so an over-long input costs no decoding. Runs in the caller's thread: the server calls
it on the OffLoopExecutor (request_tokenizer), never on the event loop.
"""

from __future__ import annotations

import io
from typing import Any, Optional

import numpy as np

from sglang.srt.multimodal.image_loader import decode_error_words, media_bytes

# OpenAI's input_audio "format" values (and common aliases) this loader decodes; libsndfile sniffs the container
# itself, so the declared format is checked against the data's magic bytes (container_of) instead.
AUDIO_FORMATS = ("wav", "mp3", "flac", "ogg", "oga", "opus", "aiff", "aif", "au", "webm")
# the container each format value names
_CONTAINER_OF_FORMAT = {"wav": "wav", "mp3": "mp3", "flac": "flac", "ogg": "ogg", "oga": "ogg", "opus": "ogg",
                        "aiff": "aiff", "aif": "aiff", "au": "au", "webm": "webm"}


def container_of(data: bytes) -> Optional[str]:
    """The audio container the bytes start with, by its magic bytes (None: not one of AUDIO_FORMATS')."""
    if data[:4] in (b"RIFF", b"RF64") and data[8:12] == b"WAVE":
        return "wav"
    if data[:4] == b"fLaC":
        return "flac"
    if data[:4] == b"OggS":
        return "ogg"
    if data[:4] == b"FORM" and data[8:12] in (b"AIFF", b"AIFC"):
        return "aiff"
    if data[:4] == b".snd":
        return "au"
    if data[:4] == b"\x1a\x45\xdf\xa3":
        return "webm"
    if data[:3] == b"ID3" or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):  # tag or frame sync
        return "mp3"
    return None


def _input_audio_bytes(item: dict) -> bytes:
    fmt = item.get("format")
    if fmt is not None and str(fmt).lower() not in AUDIO_FORMATS:
        raise ValueError(f"input_audio.format {fmt!r} is not supported; use one of {', '.join(AUDIO_FORMATS[:4])}.")
    data = item.get("data")
    if not isinstance(data, str):
        raise ValueError("input_audio.data must be a base64 string of the audio file.")
    raw = media_bytes(data, None, "audio")  # base64 only: input_audio carries no URLs or paths
    found = container_of(raw) if fmt is not None else None
    want = _CONTAINER_OF_FORMAT[str(fmt).lower()] if fmt is not None else None
    if found is not None and found != want:  # unrecognised bytes are the decoder's 400
        raise ValueError(f"input_audio.format is {fmt!r} but input_audio.data is a {found} file; set "
                         f"input_audio.format to {found!r} or send {want} data.")
    return raw


def audio_bytes(item: Any, allowed_local_media_path: Optional[str]) -> bytes:
    if isinstance(item, dict) and "data" in item:
        return _input_audio_bytes(item)
    return media_bytes(item, allowed_local_media_path, "audio")


def _check_duration(seconds: float, max_seconds: float, limit_name: str) -> None:
    if seconds > max_seconds:
        raise ValueError(f"The audio is {seconds:.2f} s long; this server accepts at most {max_seconds:g} s per "
                         f"audio ({limit_name}). Send a shorter clip.")


def to_mono(samples: np.ndarray) -> np.ndarray:
    """[frames] or [frames, channels] -> [frames] float32 (the channel mean)."""
    x = np.asarray(samples, dtype=np.float32)
    return x.mean(axis=1) if x.ndim == 2 else x


def resample(samples: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    if rate_in == rate_out:
        return samples
    import soxr

    return np.asarray(soxr.resample(samples, rate_in, rate_out, quality="HQ"), dtype=np.float32)


def decode_audio(data: bytes) -> tuple:
    """(samples [frames] or [frames, channels] float32, sampling rate) from an audio file's bytes."""
    import soundfile as sf

    try:
        samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=False)
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as e:
        raise ValueError(f"The audio data could not be decoded as audio ({decode_error_words(e)}).") from e
    return samples, int(rate)


def audio_info_seconds(data: bytes) -> Optional[float]:
    """The duration the file's header declares (None if it declares none)."""
    import soundfile as sf

    try:
        info = sf.info(io.BytesIO(data))
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as e:
        raise ValueError(f"The audio data could not be decoded as audio ({decode_error_words(e)}).") from e
    return info.frames / info.samplerate if info.frames > 0 and info.samplerate > 0 else None


def load_audio(item: Any, allowed_local_media_path: Optional[str], sampling_rate: int, max_seconds: float,
               limit_name: str = "--max-audio-seconds") -> np.ndarray:
    """Decode, mix down and resample one audio input; ValueError (a 400) for anything unusable or too long."""
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], (int, float)):
        samples, rate = to_mono(item[0]), int(item[1])
    elif isinstance(item, np.ndarray):
        samples, rate = to_mono(item), sampling_rate
    else:
        data = audio_bytes(item, allowed_local_media_path)
        if not data:
            raise ValueError("The audio data is empty.")
        declared = audio_info_seconds(data)
        if declared is not None:
            _check_duration(declared, max_seconds, limit_name)
        samples, rate = decode_audio(data)
        samples = to_mono(samples)
    if samples.ndim != 1 or samples.size == 0:
        raise ValueError("The audio has no samples.")
    if not np.isfinite(samples).all():
        raise ValueError("The audio has non-finite samples.")
    _check_duration(samples.size / rate, max_seconds, limit_name)
    return resample(samples, rate, sampling_rate)
