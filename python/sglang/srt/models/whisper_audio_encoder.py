"""A Whisper-style audio encoder in the Hugging Face checkpoint layout (Qwen2-Audio's audio_tower).

    log-mel features [B, num_mel_bins, F]   (F = 2 x max_source_positions: the 30 s window, zero-padded audio)
      -> conv1 (k 3, pad 1) -> GELU -> conv2 (k 3, stride 2, pad 1) -> GELU        [B, F / 2, D]
      -> + embed_positions (a learned table of max_source_positions rows)
      -> layers[i]: x + self_attn(self_attn_layer_norm(x)); x + fc2(act(fc1(final_layer_norm(x))))   (pre-LN)
         attention is bidirectional; keys beyond an item's own conv frames ((L - 1) // 2 + 1 of its L mel frames)
         are masked out, so the padding of the window changes no real row through attention
      -> avg_pool (k 2, stride 2) over time -> layer_norm                          [B, F / 4, D]
An item of L mel frames keeps its first ((L - 1) // 2 + 1 - 2) // 2 + 1 rows (output_tokens). The query is scaled
by head_dim^-0.5 before the product, as the checkpoint was trained; k_proj has no bias. (The config's
scale_embedding is not applied: HF transformers' Qwen2-Audio and Whisper encoders do not apply it either.)
"""

from __future__ import annotations

from typing import List, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.models.vision_encoder import get_activation
from sglang.srt.multimodal.audio_features import whisper_conv_frames as conv_frames
from sglang.srt.multimodal.audio_features import whisper_output_tokens as output_tokens


class WhisperAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.scaling = self.head_dim ** -0.5
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        split = lambda y: y.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)  # noqa: E731
        q = split(self.q_proj(x) * self.scaling)
        k, v = split(self.k_proj(x)), split(self.v_proj(x))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, scale=1.0)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, d))


class WhisperEncoderLayer(nn.Module):
    def __init__(self, dim: int, num_heads: int, ffn_dim: int, act: str):
        super().__init__()
        self.self_attn = WhisperAttention(dim, num_heads)
        self.self_attn_layer_norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, dim)
        self.final_layer_norm = nn.LayerNorm(dim)
        self.act = get_activation(act)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), key_mask)
        return x + self.fc2(self.act(self.fc1(self.final_layer_norm(x))))


class WhisperAudioEncoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        d = config.d_model
        self.num_mel_bins = config.num_mel_bins
        self.window_frames = 2 * config.max_source_positions
        act = getattr(config, "activation_function", "gelu")
        self.act = get_activation(act)
        self.conv1 = nn.Conv1d(config.num_mel_bins, d, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d, d, kernel_size=3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(config.max_source_positions, d)
        self.layers = nn.ModuleList(WhisperEncoderLayer(d, config.encoder_attention_heads, config.encoder_ffn_dim,
                                                        act) for _ in range(config.encoder_layers))
        self.layer_norm = nn.LayerNorm(d)

    def forward(self, features: torch.Tensor, mel_frames: Sequence[int]) -> List[torch.Tensor]:
        """features [B, num_mel_bins, window_frames], mel_frames: each item's valid frames -> [tokens_i, D] each."""
        if features.shape[1:] != (self.num_mel_bins, self.window_frames):
            raise ValueError(f"The audio encoder takes [B, {self.num_mel_bins}, {self.window_frames}] mel features; "
                             f"got {list(features.shape)}.")
        w = self.conv1.weight
        x = self.act(self.conv1(features.to(w.dtype)))
        x = self.act(self.conv2(x)).transpose(1, 2)  # [B, T, D]
        x = x + self.embed_positions.weight[: x.shape[1]]
        frames = torch.tensor([conv_frames(n) for n in mel_frames], device=x.device)
        key_mask = (torch.arange(x.shape[1], device=x.device)[None, :] < frames[:, None])[:, None, None, :]
        for layer in self.layers:
            x = layer(x, key_mask)
        x = F.avg_pool1d(x.transpose(1, 2), kernel_size=2, stride=2).transpose(1, 2)
        x = self.layer_norm(x)
        return [x[i, : output_tokens(n)] for i, n in enumerate(mel_frames)]
