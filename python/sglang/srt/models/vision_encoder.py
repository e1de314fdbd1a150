"""ViT-style vision towers in the Hugging Face checkpoint layout: CLIP and SigLIP shapes.

    pixel_values [B, C, S, S]
      -> patch_embedding (Conv2d, kernel = stride = patch)   [B, P, H]   P = (S / patch)^2
      -> (+ class token, CLIP)                               [B, T, H]   T = P (+ 1)
      -> + position_embedding, (pre_layrnorm, CLIP)          hidden_states[0]
      -> encoder.layers[i] (pre-LN attention + MLP)          hidden_states[i + 1]
post_layernorm is loaded but not applied: LLaVA-style models read intermediate hidden states
(vision_feature_layer), and hidden_states[-1] is the last layer's output before post_layernorm.
Only the layers up to the deepest requested feature layer are run.
"""

from __future__ import annotations

import math
from typing import List, Sequence

import torch
import torch.nn.functional as F
from torch import nn


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


ACTIVATIONS = {
    "quick_gelu": quick_gelu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
}


def get_activation(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"Unsupported vision activation {name!r}; supported: {sorted(ACTIVATIONS)}.")
    return ACTIVATIONS[name]


def is_clip_config(config) -> bool:
    return str(getattr(config, "model_type", "")).startswith("clip")


class VisionEmbeddings(nn.Module):
    def __init__(self, config, class_token: bool):
        super().__init__()
        h, patch = config.hidden_size, config.patch_size
        self.patch_size = patch
        self.num_patches = (config.image_size // patch) ** 2
        # CLIP's patch conv has no bias; SigLIP's has one
        self.patch_embedding = nn.Conv2d(config.num_channels, h, kernel_size=patch, stride=patch, bias=not class_token)
        self.class_embedding = nn.Parameter(torch.empty(h)) if class_token else None
        self.num_positions = self.num_patches + (1 if class_token else 0)
        self.position_embedding = nn.Embedding(self.num_positions, h)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        w = self.patch_embedding.weight
        x = self.patch_embedding(pixel_values.to(device=w.device, dtype=w.dtype))  # [B, H, S/p, S/p]
        x = x.flatten(2).transpose(1, 2)  # [B, P, H]
        if x.shape[1] != self.num_patches:
            raise ValueError(f"pixel_values give {x.shape[1]} patches; the vision tower expects {self.num_patches}.")
        if self.class_embedding is not None:
            x = torch.cat([self.class_embedding.expand(x.shape[0], 1, -1), x], dim=1)  # [B, P + 1, H]
        return x + self.position_embedding.weight


class VisionAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        h = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = h // self.num_heads
        self.q_proj = nn.Linear(h, h)
        self.k_proj = nn.Linear(h, h)
        self.v_proj = nn.Linear(h, h)
        self.out_proj = nn.Linear(h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape

        def heads(y: torch.Tensor) -> torch.Tensor:  # [B, T, H] -> [B, heads, T, d]
            return y.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x)),
                                             scale=1.0 / math.sqrt(self.head_dim))  # full (bidirectional)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, h))


class VisionMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)
        self.act = get_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class VisionEncoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attn = VisionAttention(config)
        self.layer_norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = VisionMLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class VisionEncoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList([VisionEncoderLayer(config) for _ in range(config.num_hidden_layers)])


class VisionTransformer(nn.Module):
    """CLIP (class token, pre-layernorm, no conv bias) or SigLIP (no class token, conv bias) vision tower."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.is_clip = is_clip_config(config)
        self.embeddings = VisionEmbeddings(config, class_token=self.is_clip)
        # "pre_layrnorm" is the checkpoint's spelling
        self.pre_layrnorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if self.is_clip else None
        self.encoder = VisionEncoder(config)
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    @property
    def num_layers(self) -> int:
        return len(self.encoder.layers)

    @property
    def num_positions(self) -> int:
        return self.embeddings.num_positions

    def normalize_layer_index(self, index: int) -> int:
        """HF hidden_states indexing: 0 = embeddings, i = after layer i; negatives count from num_layers."""
        n = self.num_layers + 1
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise ValueError(f"vision_feature_layer {index} is out of range for {self.num_layers} layers.")
        return i

    def forward(self, pixel_values: torch.Tensor, feature_layers: Sequence[int]) -> List[torch.Tensor]:
        """[B, C, S, S] -> the hidden states [B, T, H] at each of feature_layers (HF indexing)."""
        wanted = [self.normalize_layer_index(i) for i in feature_layers]
        x = self.embeddings(pixel_values)
        if self.pre_layrnorm is not None:
            x = self.pre_layrnorm(x)
        keep = set(wanted)
        states = {0: x} if 0 in keep else {}  # only the requested layers stay alive
        for i, layer in enumerate(self.encoder.layers[: max(wanted)], start=1):
            x = layer(x)
            if i in keep:
                states[i] = x
        return [states[i] for i in wanted]
