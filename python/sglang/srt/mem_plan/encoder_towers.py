"""Formula encoder towers: parameter counts and the activation peak of one encoder call, from config.json.

The server measures each encoder at its largest planned input (multimodal/runner_setup.py); these formulas are the
dry run's stand-ins (`sglang plan`) and what a start is compared with. A peak counts what is on the device while the
tower runs, weights excluded (they are in the weights term): the input, the tensors every layer keeps (residual
stream, rotary tables, retained outputs) and the largest per-layer working set, all per patch / token:

    peak = N x (input + kept + max(attention phase, MLP phase, final projection phase)) + scores

    attention phase   normed x, qkv (3H), q and k after rotary (2H), the attention output and its contiguous copy:
                      8H in the activation dtype, + the rotary's fp32 q/k copies and two fp32 temporaries (4H x 4 B);
                      the audio tower (no rotary): normed x, q, k, v, output, its copy, out_proj: 7H
    MLP phase         normed x + fc1 and its activation (2I), or gate, up and act(gate) * up (3I) for a gated MLP
    scores            none on GPUs (fused attention: flash / memory-efficient); on a CPU the largest attention
                      segment's [heads, S, S] scores and their softmax are materialised, one segment at a time

Towers (HF transformers' modeling files are the reference for the structure):
    SiglipClipTower   LLaVA's fixed-resolution tower (a generic EncoderSpec; mem_plan/encoder.py)
    QwenVisionTower   Qwen2.5-VL (window attention + full-attention layers, RMSNorm, gated SiLU MLP, patch merger)
                      and Qwen3-Omni / Qwen3-VL (full attention per frame, LayerNorm, GELU MLP, learned position
                      table, patch merger + deepstack mergers whose outputs are kept for the language model)
    OmniAudioTower    Qwen3-Omni's audio tower: mel chunks of 2 x n_window frames through three stride-2 conv2d
                      (+ GELU) in groups of conv_chunksize chunks, conv_out, transformer layers attending within
                      windows of n_window_infer mel frames, ln_post + proj1 + GELU + proj2
A Whisper-style audio tower (Qwen2-Audio) keeps the generic EncoderSpec over its 30 s window; Llama 4's tiled-image
tower (Llama4VisionTower) is in encoder_llama4.py, with these conventions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

FP32_BYTES = 4
INPUT_BYTES = 4  # processor outputs (pixel values, log-mel features) reach the device as float32
SCORE_COPIES = 2  # scores and their softmax


def conv_out_len(n: int) -> int:
    """Length after a kernel-3, stride-2, padding-1 convolution."""
    return (n - 1) // 2 + 1


@dataclass(frozen=True)
class VisionWork:
    """One vision encoder call: num_inputs inputs of grid (t, h, w) patches (t temporal slices of h x w)."""

    grid_thw: tuple[int, int, int]
    num_inputs: int = 1

    @property
    def patches(self) -> int:
        t, h, w = self.grid_thw
        return t * h * w * self.num_inputs


@dataclass(frozen=True)
class QwenVisionTower:
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    patch_size: int
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    conv_bias: bool = True  # the patch embedding's Conv3d (Qwen2.5-VL: none)
    gated_mlp: bool = False  # Qwen2.5-VL: down(act(gate(x)) * up(x))
    rms_norm: bool = False  # Qwen2.5-VL: RMSNorm (weight only); Qwen3: LayerNorm (weight + bias)
    window_patches: int = 0  # Qwen2.5-VL window attention: patches per window (0: full attention everywhere)
    num_full_attention_layers: int = 0  # Qwen2.5-VL: layers that attend over a whole frame
    num_deepstack: int = 0  # Qwen3-Omni / Qwen3-VL: deepstack mergers (their outputs are kept)
    num_position_embeddings: int = 0  # Qwen3: learned position table
    name: str = "vision"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size ** 2

    @property
    def factor(self) -> int:
        """Pixels per merged token along one side: images are resized to multiples of it."""
        return self.patch_size * self.spatial_merge_size

    def params(self) -> int:
        H, I, out, m = self.hidden_size, self.intermediate_size, self.out_hidden_size, self.merge_unit
        norm = H if self.rms_norm else 2 * H
        mlp = (2 * (H * I + I) + I * H + H) if self.gated_mlp else (H * I + I + I * H + H)
        block = 2 * norm + (3 * H * H + 3 * H) + (H * H + H) + mlp
        conv = self.in_channels * self.temporal_patch_size * self.patch_size ** 2 * H + (H if self.conv_bias else 0)
        merger_mlp = (m * H) ** 2 + m * H + m * H * out + out
        merger = norm + merger_mlp
        deepstack = self.num_deepstack * (2 * m * H + merger_mlp)  # LayerNorm over the merged width
        return conv + self.num_position_embeddings * H + self.depth * block + merger + deepstack

    def per_patch_bytes(self, act_bytes: int) -> int:
        """Bytes per patch at the peak (see the module docstring), attention scores excluded."""
        H, I, d, m, b = self.hidden_size, self.intermediate_size, self.head_dim, self.merge_unit, act_bytes
        out_per_patch = self.out_hidden_size / m
        pixels = self.in_channels * self.temporal_patch_size * self.patch_size ** 2 * INPUT_BYTES
        kept = pixels + 2 * d * FP32_BYTES + b * (H + self.num_deepstack * out_per_patch)
        attention = 8 * H * b + 4 * H * FP32_BYTES
        mlp = (H + (3 if self.gated_mlp else 2) * I) * b
        final = (3 * H + out_per_patch) * b  # merger: norm, fc1, GELU (merged width = m x H over m patches), fc2
        return int(kept + max(attention, mlp, final))

    def largest_segment(self, work: VisionWork) -> int:
        """Patches of the largest attention segment: one temporal slice (full attention) or one window."""
        _, h, w = work.grid_thw
        if self.window_patches and not self.num_full_attention_layers:
            return min(self.window_patches, h * w)
        return h * w

    def peak_bytes(self, work: VisionWork, act_bytes: int = 2, fused_attention: bool = True) -> int:
        scores = 0 if fused_attention else SCORE_COPIES * self.num_heads * self.largest_segment(work) ** 2 * act_bytes
        return work.patches * self.per_patch_bytes(act_bytes) + scores

    def output_tokens(self, work: VisionWork) -> int:
        return work.patches // self.merge_unit


@dataclass(frozen=True)
class OmniAudioTower:
    d_model: int
    encoder_layers: int
    encoder_attention_heads: int
    encoder_ffn_dim: int
    output_dim: int
    num_mel_bins: int = 128
    n_window: int = 50
    n_window_infer: int = 800
    conv_chunksize: int = 500
    downsample_hidden_size: int = 480
    name: str = "audio"

    @property
    def chunk_frames(self) -> int:
        """Mel frames of one conv chunk (2 x n_window)."""
        return 2 * self.n_window

    @property
    def tokens_per_chunk(self) -> int:
        return conv_out_len(conv_out_len(conv_out_len(self.chunk_frames)))

    @property
    def window_tokens(self) -> int:
        """Tokens one attention window holds: n_window_infer mel frames of full chunks."""
        return self.tokens_per_chunk * (self.n_window_infer // self.chunk_frames)

    def conv_shapes(self) -> list[tuple[int, int]]:
        """(mel bins, frames) after each of the three convolutions, for one full chunk."""
        f, t, out = self.num_mel_bins, self.chunk_frames, []
        for _ in range(3):
            f, t = conv_out_len(f), conv_out_len(t)
            out.append((f, t))
        return out

    def output_tokens(self, mel_frames: int) -> int:
        """Tokens of an input of mel_frames frames (HF's _get_feat_extract_output_lengths)."""
        full, rest = divmod(mel_frames, self.chunk_frames)
        return full * self.tokens_per_chunk + (conv_out_len(conv_out_len(conv_out_len(rest))) if rest else 0)

    def params(self) -> int:
        H, I, C, out = self.d_model, self.encoder_ffn_dim, self.downsample_hidden_size, self.output_dim
        f3 = self.conv_shapes()[-1][0]
        convs = (9 * C + C) + 2 * (9 * C * C + C) + C * f3 * H  # conv2d1..3 (+bias), conv_out (no bias)
        layer = 4 * (H * H + H) + 2 * 2 * H + (H * I + I) + (I * H + H)
        return convs + self.encoder_layers * layer + 2 * H + (H * H + H) + (H * out + out)

    def peak_bytes(self, mel_frames: int, act_bytes: int = 2, fused_attention: bool = True) -> int:
        """Peak of one call on mel_frames frames: the larger of the conv phase and the transformer phase."""
        H, I, C, b = self.d_model, self.encoder_ffn_dim, self.downsample_hidden_size, act_bytes
        chunks = -(-mel_frames // self.chunk_frames)
        (f1, t1), _, (f3, t3) = self.conv_shapes()
        # the features as given, their padded chunks, and the padded chunks in the activation dtype
        inputs = (self.num_mel_bins * mel_frames * INPUT_BYTES
                  + chunks * self.num_mel_bins * self.chunk_frames * (INPUT_BYTES + b))
        group = min(chunks, self.conv_chunksize)
        conv = b * (group * 2 * C * f1 * t1 + chunks * C * f3 * t3)  # conv1 + its GELU; the finished groups
        tokens = self.output_tokens(mel_frames)
        conv_out = b * chunks * t3 * H  # padded conv_out rows, kept until the call returns
        attention = 7 * H * b
        mlp = (H + 2 * I) * b
        final = (3 * H + self.output_dim) * b
        transformer = conv_out + tokens * (H * b + max(attention, mlp, final))
        scores = 0 if fused_attention else SCORE_COPIES * self.encoder_attention_heads * self.window_tokens ** 2 * b
        return inputs + max(conv, transformer) + scores


def qwen_vision_tower(v: dict, model_type: str) -> QwenVisionTower:
    """Qwen2.5-VL (`qwen2_5_vl`) or Qwen3-Omni / Qwen3-VL vision_config -> QwenVisionTower."""
    common = dict(depth=v.get("depth", v.get("num_hidden_layers")), hidden_size=v["hidden_size"],
                  intermediate_size=v["intermediate_size"], num_heads=v.get("num_heads", v.get("num_attention_heads")),
                  out_hidden_size=v["out_hidden_size"], patch_size=v.get("patch_size", 14),
                  temporal_patch_size=v.get("temporal_patch_size", 2),
                  spatial_merge_size=v.get("spatial_merge_size", 2),
                  in_channels=v.get("in_channels", v.get("in_chans", 3)))
    if model_type.startswith("qwen2_5_vl"):
        window_units = v.get("window_size", 112) // v.get("spatial_merge_size", 2) // common["patch_size"]
        return QwenVisionTower(**common, conv_bias=False, gated_mlp=True, rms_norm=True,
                               window_patches=window_units ** 2 * common["spatial_merge_size"] ** 2,
                               num_full_attention_layers=len(v.get("fullatt_block_indexes", [])))
    return QwenVisionTower(**common, num_deepstack=len(v.get("deepstack_visual_indexes", [])),
                           num_position_embeddings=v.get("num_position_embeddings", 0))


def omni_audio_tower(a: dict) -> OmniAudioTower:
    keys = ("num_mel_bins", "n_window", "n_window_infer", "conv_chunksize", "downsample_hidden_size")
    return OmniAudioTower(a["d_model"], a["encoder_layers"], a["encoder_attention_heads"], a["encoder_ffn_dim"],
                          a["output_dim"], **{k: a[k] for k in keys if k in a})


def is_qwen_vision(cfg: dict, v: Optional[dict]) -> bool:
    return v is not None and "out_hidden_size" in v and "patch_size" in v


def is_omni_audio(a: Optional[dict]) -> bool:
    return a is not None and "n_window" in a and "downsample_hidden_size" in a
