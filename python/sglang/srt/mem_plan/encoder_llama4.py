"""Llama 4's vision tower (vision_config model_type llama4_vision_model) and its projector: parameter counts and the
activation peak of one encoder call, from config.json. HF transformers' Llama4VisionModel and
Llama4MultiModalProjector are the reference for the structure.

Parameters (replicated on every TP rank, as every encoder tower here):
    patch embedding     an unfold + Linear(C x p^2, H), no bias
    class embedding     H; positional embedding (P + 1) x H, P = (image_size / patch_size)^2 patches per tile
    layernorm_pre/post  2 x LayerNorm(H) (weight + bias)
    layers              num_hidden_layers x (q, k, v, o with biases + fc1, fc2 with biases + two LayerNorms)
    vision adapter      pixel shuffle (no parameters) + fc1 [intermediate_size -> projector_input_dim] + fc2
                        [projector_output_dim -> projector_output_dim], no biases
    projector           Linear(vision_output_dim, text hidden), no bias (transformers builds it without one whatever
                        multi_modal_projector_bias says)

The largest input: one image is cut into tiles of image_size^2 pixels, at most the processor's max_patches of them
(transformers' Llama4ImageProcessor: max_patches 16, size 336 x 336), plus one global view of the whole image when it
has more than one tile: T = max_patches + 1 tiles. Each tile is S = P + 1 tokens (its patches and a class token) and
attends only within itself. A tile's patches leave the tower pixel-shuffled to Q = P x ratio^2 tokens
(pixel_shuffle_ratio), which the projector maps to the text width. The processor pads an image to its tile canvas,
so --max-image-pixels does not bound T: the term is planned at the processor's max_patches.

Peak of one call on T tiles, weights excluded (b: activation bytes; encoder_towers.py's conventions):

    peak = T x C x image_size^2 x 4                        pixel values (float32)
         + S x head_dim / 2 x 8                            the rotary table, complex64 [S, 1, head_dim / 2]
         + T x max(embedding, S x (H x b + max(attention, mlp)), final)
         + scores

    embedding   C x p^2 x 4 x P + (P + 3 S) x H x b      unfolded patches (float32), their projection, the class
                                                          token concatenated, positions added, layernorm_pre
    attention   8 H x b + 4 H x 4  per token              normed x, q, k, v, rotated q and k, the attention output
                                                          and its contiguous copy; the rotary's float32 q / k and
                                                          their complex products
    mlp         (H + 2 I) x b  per token                  normed x, fc1 and its GELU
    final       (2 S H + 2 P H + Q (2 in + 2 out + Ht)) x b   the encoder output and layernorm_post, the two pixel
                                                          shuffle copies, the adapter's fc1 / fc2 and their GELUs,
                                                          and the projected embeddings kept for the language model
    scores      none on GPUs (fused attention); on a CPU every tile's [heads, S, S] scores and their softmax at once
                (the tiles are one batch): 2 x T x heads x S^2 x b
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.mem_plan.encoder_towers import FP32_BYTES, INPUT_BYTES, SCORE_COPIES, VisionWork

COMPLEX64_BYTES = 8
LLAMA4_VISION_TOWER = "llama4_vision_model"
LLAMA4_MAX_PATCHES = 16  # transformers' Llama4ImageProcessor default max_patches (tiles per image, before the global)
LLAMA4_TILE_SIDE = 336  # transformers' Llama4ImageProcessor default size {"height": 336, "width": 336}


def _need(v: dict, key: str):
    value = v.get(key)
    if value is None:
        raise ValueError(f"vision_config (model_type {LLAMA4_VISION_TOWER!r}) lacks {key!r}, which the planner "
                         f"needs to size Llama 4's vision tower; add the value the model's published config.json has.")
    return value


@dataclass(frozen=True)
class Llama4VisionTower:
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    image_size: int
    patch_size: int
    pixel_shuffle_ratio: float
    projector_input_dim: int
    projector_output_dim: int
    vision_output_dim: int
    text_hidden_size: int
    num_channels: int = 3
    name: str = "vision"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patches_per_tile(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def tokens_per_tile(self) -> int:
        """The patches and the class token."""
        return self.patches_per_tile + 1

    @property
    def output_tokens_per_tile(self) -> int:
        """Tokens a tile gives the language model after the pixel shuffle."""
        return int(self.patches_per_tile * self.pixel_shuffle_ratio ** 2)

    def params(self) -> int:
        H, I = self.hidden_size, self.intermediate_size
        patch = self.num_channels * self.patch_size ** 2 * H
        layer = 4 * (H * H + H) + (H * I + I) + (I * H + H) + 2 * 2 * H
        adapter = I * self.projector_input_dim + self.projector_output_dim ** 2
        return patch + H + self.tokens_per_tile * H + 2 * 2 * H + self.num_layers * layer + adapter

    def projector_params(self) -> int:
        return self.vision_output_dim * self.text_hidden_size

    def rotary_table_bytes(self) -> int:
        return self.tokens_per_tile * (self.head_dim // 2) * COMPLEX64_BYTES

    def tile_bytes(self, act_bytes: int) -> int:
        """Bytes one tile adds at the peak (the module docstring's max of the phases), scores excluded."""
        H, I, b = self.hidden_size, self.intermediate_size, act_bytes
        P, S, Q = self.patches_per_tile, self.tokens_per_tile, self.output_tokens_per_tile
        embedding = self.num_channels * self.patch_size ** 2 * INPUT_BYTES * P + (P + 3 * S) * H * b
        attention = 8 * H * b + 4 * H * FP32_BYTES
        mlp = (H + 2 * I) * b
        layers = S * (H * b + max(attention, mlp))
        final = (2 * S * H + 2 * P * H
                 + Q * (2 * self.projector_input_dim + 2 * self.projector_output_dim + self.text_hidden_size)) * b
        return max(embedding, layers, final)

    def peak_bytes(self, work: VisionWork, act_bytes: int = 2, fused_attention: bool = True) -> int:
        """Peak of one call on work: grid_thw = (tiles per image, side, side) patches, num_inputs images."""
        tiles = work.grid_thw[0] * work.num_inputs
        pixels = tiles * self.num_channels * self.image_size ** 2 * INPUT_BYTES
        scores = 0 if fused_attention else SCORE_COPIES * tiles * self.num_heads * self.tokens_per_tile ** 2 * act_bytes
        return pixels + self.rotary_table_bytes() + tiles * self.tile_bytes(act_bytes) + scores

    def output_tokens(self, work: VisionWork) -> int:
        return work.grid_thw[0] * work.num_inputs * self.output_tokens_per_tile

    def largest_work(self, max_patches: int, num_images: int = 1) -> VisionWork:
        """max_patches tiles and the global view (the processor adds it whenever an image has more than one tile)."""
        side = self.image_size // self.patch_size
        return VisionWork((max_patches + (1 if max_patches > 1 else 0), side, side), num_images)


def is_llama4_vision(v: dict) -> bool:
    return v.get("model_type") == LLAMA4_VISION_TOWER


def llama4_vision_tower(v: dict, text_hidden_size: int) -> Llama4VisionTower:
    """vision_config of a Llama 4 composite -> Llama4VisionTower. Every key the tower is sized by is required (the
    published configs carry them all); num_channels takes Llama4VisionConfig's default 3."""
    keys = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "image_size",
            "patch_size", "pixel_shuffle_ratio", "projector_input_dim", "projector_output_dim", "vision_output_dim")
    values = [_need(v, k) for k in keys]
    return Llama4VisionTower(*values, text_hidden_size=text_hidden_size, num_channels=v.get("num_channels") or 3)
