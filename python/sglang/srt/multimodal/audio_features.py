"""Whisper-style log-mel features (the front end of Qwen2-Audio's and Qwen3-Omni's audio towers), in torch.

    samples (mono float32 at sampling_rate, padded with zeros to `pad_to_samples` when given)
      -> STFT: periodic Hann window of n_fft, hop `hop_length`, centred frames (reflect padding); the last frame
         is dropped, so a clip of N samples gives N // hop frames
      -> power spectrum |X|^2 -> mel filterbank (Slaney mel scale and area normalisation, 0 .. 8 kHz)
      -> log10(max(mel, 1e-10)); floor at (its max - 8); (x + 4) / 4
The filterbank is built here: mel(f) = 3 f / 200 below 1 kHz and 15 + 27 ln(f / 1000) / ln(6.4) above; num_mel + 2
points equally spaced in mel between mel(0) and mel(8000) are the filters' edges and centres; filter i is the
triangle over FFT-bin frequencies from point i up to point i + 1 and down to point i + 2, scaled by
2 / (f[i + 2] - f[i]) so each has unit area. The settings come from the checkpoint's preprocessor_config.json
(WhisperFeatureExtractor keys: feature_size = mel bins, n_fft, hop_length, sampling_rate, chunk_length).
Checked against HF transformers' WhisperFeatureExtractor (test/registered/multimodal/test_audio_features.py).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

MEL_FLOOR = 1e-10
DYNAMIC_RANGE_LOG10 = 8.0  # the log-mel floor sits this far below its max


@dataclass(frozen=True)
class MelConfig:
    num_mel_bins: int = 128
    n_fft: int = 400
    hop_length: int = 160
    sampling_rate: int = 16000
    chunk_length_s: int = 30  # a Whisper-style tower's fixed window (the processor pads every clip to it)
    max_frequency_hz: float = 8000.0

    @property
    def window_samples(self) -> int:
        return self.chunk_length_s * self.sampling_rate

    @property
    def window_frames(self) -> int:
        return self.window_samples // self.hop_length

    def num_frames(self, num_samples: int) -> int:
        """Mel frames of a clip's own samples (HF's feature attention mask: ceil(samples / hop))."""
        return -(-num_samples // self.hop_length)

    @classmethod
    def from_model_dir(cls, model_dir: str, num_mel_bins: Optional[int] = None) -> "MelConfig":
        path = os.path.join(model_dir or "", "preprocessor_config.json")
        p = {}
        if os.path.isfile(path):
            with open(path) as f:
                p = json.load(f)
        default = cls()
        return cls(num_mel_bins=int(p.get("feature_size", num_mel_bins or default.num_mel_bins)),
                   n_fft=int(p.get("n_fft", default.n_fft)), hop_length=int(p.get("hop_length", default.hop_length)),
                   sampling_rate=int(p.get("sampling_rate", default.sampling_rate)),
                   chunk_length_s=int(p.get("chunk_length", default.chunk_length_s)))


def hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear (3 / 200 per Hz) below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    linear = 3.0 * hz / 200.0
    log_part = 15.0 + 27.0 * np.log(np.maximum(hz, 1e-12) / 1000.0) / math.log(6.4)
    return np.where(hz >= 1000.0, log_part, linear)


def mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    linear = 200.0 * mel / 3.0
    log_part = 1000.0 * np.exp(math.log(6.4) * (mel - 15.0) / 27.0)
    return np.where(mel >= 15.0, log_part, linear)


def mel_filterbank(cfg: MelConfig) -> torch.Tensor:
    """[n_fft // 2 + 1, num_mel_bins] float64 triangular filters (see the module docstring)."""
    bins = cfg.n_fft // 2 + 1
    fft_hz = np.linspace(0.0, cfg.sampling_rate / 2, bins)
    points = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(cfg.max_frequency_hz), cfg.num_mel_bins + 2))
    lo, centre, hi = points[:-2, None], points[1:-1, None], points[2:, None]
    rising = (fft_hz[None, :] - lo) / (centre - lo)
    falling = (hi - fft_hz[None, :]) / (hi - centre)
    tri = np.maximum(0.0, np.minimum(rising, falling))  # [mel, bins]
    tri *= (2.0 / (hi - lo))
    return torch.from_numpy(tri.T.copy())


def whisper_conv_frames(mel_frames: int) -> int:
    """Frames after a Whisper encoder's stride-2 conv."""
    return (mel_frames - 1) // 2 + 1


def whisper_output_tokens(mel_frames: int) -> int:
    """Rows an item of mel_frames valid mel frames keeps after Qwen2-Audio's stride-2 conv and stride-2 pool (HF's
    Qwen2AudioProcessor count)."""
    return (whisper_conv_frames(mel_frames) - 2) // 2 + 1


_FILTERS: dict = {}


def _filters(cfg: MelConfig) -> torch.Tensor:
    key = (cfg.num_mel_bins, cfg.n_fft, cfg.sampling_rate, cfg.max_frequency_hz)
    if key not in _FILTERS:
        _FILTERS[key] = mel_filterbank(cfg)
    return _FILTERS[key]


def log_mel(samples: np.ndarray, cfg: MelConfig, pad_to_samples: Optional[int] = None) -> torch.Tensor:
    """Mono samples -> [num_mel_bins, frames] float32 log-mel features (frames = padded samples // hop)."""
    x = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32)).to(torch.float64)
    if pad_to_samples is not None and x.numel() < pad_to_samples:
        x = torch.nn.functional.pad(x, (0, pad_to_samples - x.numel()))
    window = torch.hann_window(cfg.n_fft, periodic=True, dtype=torch.float64)
    spec = torch.stft(x, cfg.n_fft, cfg.hop_length, window=window, center=True, pad_mode="reflect",
                      return_complex=True)  # [bins, frames + 1]
    power = spec[:, :-1].abs() ** 2
    mel = _filters(cfg).T @ power  # [mel, frames]
    logs = torch.clamp(mel, min=MEL_FLOOR).log10()
    logs = torch.maximum(logs, logs.max() - DYNAMIC_RANGE_LOG10)
    return ((logs + 4.0) / 4.0).to(torch.float32)
