"""The Qwen3-Omni audio tower (checkpoint layout `audio_tower.*`): Whisper-style log-mel features in, one embedding
per output token out.

    features [num_mel_bins, T] (16 kHz, hop 160: 100 frames per second)
      -> conv chunks of 2 * n_window frames (the last one shorter, zero-padded to a full chunk)
      -> three Conv2d(3x3, stride 2, padding 1) + GELU over (mel, time): [chunk, c, mel/8, 13] for a full chunk
      -> conv_out Linear(c * mel/8 -> d_model) per time step, + sinusoidal positions 0.. within the chunk
      -> the valid time steps of each chunk (a short last chunk gives fewer), concatenated per audio
      -> layers: LayerNorm, attention within windows of n_window_infer frames' tokens (window_tokens), LayerNorm,
         GELU MLP; then LayerNorm, Linear, GELU, Linear -> [tokens, output_dim]
Tokens of T frames (HF's _get_feat_extract_output_lengths; mem_plan.encoder_towers.OmniAudioTower.output_tokens):
13 per full chunk + the short chunk's. Conv chunks and attention windows never mix audios, so several audios encode
in one call exactly as alone, and an audio split at whole windows (n_window_infer frames) encodes exactly as whole.
The last short chunk is padded to a full chunk, always; HF pads it to the longest chunk of its batch, which is the
same whenever the batch holds an audio of at least 2 * n_window frames (1 s).
"""

from __future__ import annotations

import math
from typing import List, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.models.qwen2_5_vl_vision import segment_attention


def conv_len(n: int) -> int:
    """Length after one Conv(kernel 3, stride 2, padding 1)."""
    return (n - 1) // 2 + 1


def sinusoid_table(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """[length, channels]: sin of position x the channels/2 timescales, then cos."""
    step = math.log(max_timescale) / (channels // 2 - 1)
    inv = torch.exp(-step * torch.arange(channels // 2, dtype=torch.float32))
    angle = torch.arange(length, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cat([angle.sin(), angle.cos()], dim=1)


class OmniAudioAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, segments) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = (p(x).view(n, self.num_heads, self.head_dim) for p in (self.q_proj, self.k_proj, self.v_proj))
        return self.out_proj(segment_attention(q, k, v, segments).reshape(n, -1))


class OmniAudioLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        if cfg.activation_function != "gelu":
            raise ValueError(f"Qwen3-Omni audio activation {cfg.activation_function!r} is not supported; only gelu.")
        d = cfg.d_model
        self.self_attn = OmniAudioAttention(d, cfg.encoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, cfg.encoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.encoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, segments) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), segments)
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class Qwen3OmniAudioEncoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c, d = cfg.downsample_hidden_size, cfg.d_model
        self.num_mel_bins = cfg.num_mel_bins
        self.chunk = 2 * cfg.n_window
        self.chunk_tokens = conv_len(conv_len(conv_len(self.chunk)))
        self.window_tokens = self.chunk_tokens * (cfg.n_window_infer // self.chunk)
        self.conv_chunksize = cfg.conv_chunksize
        self.conv2d1 = nn.Conv2d(1, c, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(c, c, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(c, c, 3, 2, padding=1)
        self.conv_out = nn.Linear(c * conv_len(conv_len(conv_len(cfg.num_mel_bins))), d, bias=False)
        self.register_buffer("positions", sinusoid_table(cfg.max_source_positions, d), persistent=False)
        self.layers = nn.ModuleList([OmniAudioLayer(cfg) for _ in range(cfg.encoder_layers)])
        self.ln_post = nn.LayerNorm(d)
        self.proj1 = nn.Linear(d, d)
        self.proj2 = nn.Linear(d, cfg.output_dim)

    def num_tokens(self, mel_frames: int) -> int:
        full, rest = divmod(mel_frames, self.chunk)
        return full * self.chunk_tokens + (conv_len(conv_len(conv_len(rest))) if rest else 0)

    def forward(self, features: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        """features: one [num_mel_bins, T_i] per audio -> [num_tokens(T_i), output_dim] each."""
        w = self.conv2d1.weight
        chunks, valid, sizes = [], [], []
        for f in features:
            if f.dim() != 2 or f.shape[0] != self.num_mel_bins:
                raise ValueError(f"Audio features must be [{self.num_mel_bins}, frames]; got {tuple(f.shape)}.")
            f = f.to(w.device, w.dtype)
            n = f.shape[1]
            for s in range(0, n, self.chunk):
                piece = f[:, s:s + self.chunk]
                valid.append(conv_len(conv_len(conv_len(piece.shape[1]))))
                chunks.append(F.pad(piece, (0, self.chunk - piece.shape[1])))
            sizes.append(self.num_tokens(n))
        x = torch.stack(chunks).unsqueeze(1)  # [chunks, 1, mel, 2 * n_window]
        outs = []
        for group in x.split(self.conv_chunksize):
            y = F.gelu(self.conv2d1(group))
            y = F.gelu(self.conv2d2(y))
            outs.append(F.gelu(self.conv2d3(y)))
        y = torch.cat(outs)
        b, c, fq, t = y.shape
        y = self.conv_out(y.permute(0, 3, 1, 2).reshape(b, t, c * fq)) + self.positions[:t].to(y.dtype)
        keep = torch.arange(t, device=y.device)[None, :] < torch.tensor(valid, device=y.device)[:, None]
        x = y[keep]  # [tokens of all audios, d_model], chunk by chunk
        segments, row = [], 0
        for n in sizes:
            for s in range(0, n, self.window_tokens):
                segments.append((row + s, row + min(s + self.window_tokens, n)))
            row += n
        for layer in self.layers:
            x = layer(x, segments)
        x = self.proj2(F.gelu(self.proj1(self.ln_post(x))))
        return list(x.split(sizes))
