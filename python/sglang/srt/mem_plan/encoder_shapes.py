"""The encoder half of a multimodal config.json: tower parameter counts (the weights term) and the towers whose
activation peaks the encoder terms are planned from (encoder_towers.py / encoder.EncoderSpec).

    LLaVA          vision_config siglip / clip  -> EncoderSpec "vision" (fixed image_size) + the llava projector
    Gemma 3        the same SigLIP tower (no head) + its projector (an RMSNorm and one matrix)
    Qwen2.5-VL     flat config + vision_config with out_hidden_size / fullatt_block_indexes -> QwenVisionTower
    Qwen3-Omni     thinker_config: vision_config with deepstack_visual_indexes -> QwenVisionTower, audio_config with
                   n_window / downsample_hidden_size -> OmniAudioTower
    Llama 4        vision_config llama4_vision_model -> Llama4VisionTower (tiled images, pixel-shuffle adapter) + its
                   projector (one [vision_output_dim, text hidden] matrix); encoder_llama4.py
    Whisper-style  audio_config (d_model, encoder_layers, ...) -> EncoderSpec "audio" over max_source_positions
                   (Qwen2-Audio: + its multi_modal_projector, one Linear(d_model, text hidden))
Qwen towers carry their own merger / output projection (counted in the tower); LLaVA, Gemma 3 and Llama 4 have a
separate projector.
The processor's size caps come from preprocessor_config.json when the model directory has one (encoder_inputs.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Optional

from sglang.srt.mem_plan.encoder import EncoderSpec
from sglang.srt.mem_plan.encoder_inputs import ProcessorFacts, processor_facts
from sglang.srt.mem_plan.encoder_llama4 import is_llama4_vision, llama4_vision_tower
from sglang.srt.mem_plan.encoder_towers import is_omni_audio, is_qwen_vision, omni_audio_tower, qwen_vision_tower

PREPROCESSOR_KEY = "_preprocessor_config"  # where load_config keeps the directory's preprocessor_config.json
PREPROCESSOR_FILES = ("preprocessor_config.json", "video_preprocessor_config.json")
# The towers the generic paths below count (vision_tower_params, audio_tower_params); any other vision_config /
# audio_config model_type is refused, naming it: a tower counted as another is the guess the planner never makes.
GENERIC_VISION_TOWERS = ("siglip_vision_model", "clip_vision_model")
GENERIC_AUDIO_TOWERS = ("whisper_encoder", "qwen2_audio_encoder")


def load_preprocessor_config(directory: str) -> Optional[dict]:
    """preprocessor_config.json of a model directory (+ video_preprocessor_config.json under "video"), or None."""
    out = None
    for name in PREPROCESSOR_FILES:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            with open(path) as f:
                data = json.load(f)
            out = out or {}
            if name.startswith("video"):
                out["video"] = data
            else:
                out.update(data)
    return out


def vision_tower_params(v: dict) -> int:
    """SigLIP / CLIP vision transformer (+ SigLIP's pooling head only when vision_use_head is true)."""
    h, inter, layers = v["hidden_size"], v["intermediate_size"], v["num_hidden_layers"]
    channels, patch, image = v.get("num_channels", 3), v["patch_size"], v["image_size"]
    num_patches = (image // patch) ** 2
    layer = 4 * (h * h + h) + 2 * 2 * h + (h * inter + inter) + (inter * h + h)
    n = layers * layer + 2 * h  # + post_layernorm
    if v.get("model_type", "siglip_vision_model").startswith("clip"):
        n += h + channels * patch * patch * h + (num_patches + 1) * h + 2 * h  # class emb, conv (no bias), pos, pre-LN
    else:
        n += channels * patch * patch * h + h + num_patches * h  # conv + bias, positions
        if v.get("vision_use_head", False):
            n += h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (h * inter + inter) + (inter * h + h)
    return n


def audio_tower_params(a: dict) -> int:
    """Whisper-style encoder: two convs, learned positions, pre-LN layers (k_proj without bias), final LN,
    optional output projection to output_dim."""
    d, ffn, layers = a["d_model"], a["encoder_ffn_dim"], a["encoder_layers"]
    mel, positions = a.get("num_mel_bins", 128), a.get("max_source_positions", 1500)
    layer = 3 * (d * d + d) + d * d + 2 * 2 * d + (d * ffn + ffn) + (ffn * d + d)
    n = (mel * d * 3 + d) + (d * d * 3 + d) + positions * d + layers * layer + 2 * d
    out = a.get("output_dim", 0)
    if out:
        n += d * out + out
    return n


def projector_params(vision_hidden: int, text_hidden: int) -> int:
    """LLaVA multi_modal_projector: Linear(Hv, Ht) + GELU + Linear(Ht, Ht), with biases."""
    return vision_hidden * text_hidden + text_hidden + text_hidden * text_hidden + text_hidden


def gemma3_projector_params(vision_hidden: int, text_hidden: int) -> int:
    """Gemma 3's multi_modal_projector: an RMSNorm over the pooled patches and one [Hv, Ht] matrix, no bias."""
    return vision_hidden + vision_hidden * text_hidden


def vision_encoder_spec(v: dict, output_dim: int, act_dtype_bytes: int = 2) -> EncoderSpec:
    tokens = (v["image_size"] // v["patch_size"]) ** 2
    if v.get("model_type", "").startswith("clip"):
        tokens += 1
    return EncoderSpec("vision", v["num_hidden_layers"], v["hidden_size"], v["intermediate_size"],
                       v["num_attention_heads"], tokens, output_dim, act_dtype_bytes)


def audio_encoder_spec(a: dict, act_dtype_bytes: int = 2, output_dim: int = 0) -> EncoderSpec:
    """output_dim: the width of the embeddings kept per row (the tower's own output_dim, else a projector's)."""
    return EncoderSpec("audio", a["encoder_layers"], a["d_model"], a["encoder_ffn_dim"],
                       a["encoder_attention_heads"], a.get("max_source_positions", 1500),
                       a.get("output_dim", 0) or output_dim, act_dtype_bytes)


@dataclass(frozen=True)
class EncoderParts:
    vision_params: int
    audio_params: int
    projector_params: int
    encoders: tuple
    processor: ProcessorFacts


def _check_generic_tower(cfg: dict, key: str, known: tuple) -> None:
    tower = cfg[key].get("model_type")
    if tower not in known:
        raise ValueError(f"{cfg.get('model_type', 'this model')}: the planner does not know the {key} tower "
                         f"{tower or '(no model_type)'!r}; it counts {', '.join(known)} and the Qwen2.5-VL / "
                         f"Qwen3-Omni / Llama 4 towers. A text-only config of the model plans its text part.")


def encoder_parts(cfg: dict, text_hidden: int, act_dtype_bytes: int,
                  preprocessor: Optional[dict] = None) -> EncoderParts:
    """The towers of a multimodal config (cfg: the thinker / top-level dict holding vision_config / audio_config)."""
    model_type = cfg.get("model_type", "")
    vision = audio = projector = 0
    encoders = []
    v, a = cfg.get("vision_config"), cfg.get("audio_config")
    if v:
        if is_qwen_vision(cfg, v):
            tower = qwen_vision_tower(v, model_type)
            vision = tower.params()
            encoders.append(tower)
        elif is_llama4_vision(v):
            tower = llama4_vision_tower(v, text_hidden)
            vision, projector = tower.params(), tower.projector_params()
            encoders.append(tower)
        else:
            _check_generic_tower(cfg, "vision_config", GENERIC_VISION_TOWERS)
            vision = vision_tower_params(v)
            projector = (gemma3_projector_params(v["hidden_size"], text_hidden) if model_type == "gemma3"
                         else projector_params(v["hidden_size"], text_hidden))
            encoders.append(vision_encoder_spec(v, text_hidden, act_dtype_bytes))
    if a:
        if is_omni_audio(a):
            tower = omni_audio_tower(a)
            audio = tower.params()
            encoders.append(tower)
        else:
            _check_generic_tower(cfg, "audio_config", GENERIC_AUDIO_TOWERS)
            audio = audio_tower_params(a)
            qwen2_audio = model_type == "qwen2_audio"
            encoders.append(audio_encoder_spec(a, act_dtype_bytes, text_hidden if qwen2_audio else 0))
            if qwen2_audio:  # multi_modal_projector: Linear(d_model, text hidden) with bias
                projector += a["d_model"] * text_hidden + text_hidden
    return EncoderParts(vision, audio, projector, tuple(encoders), processor_facts(model_type, preprocessor))
