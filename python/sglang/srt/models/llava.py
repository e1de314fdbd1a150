"""LLaVA: a CLIP/SigLIP vision tower, a two-layer projector, and a Llama/Qwen2/Qwen3 language model.

    image  [C, S, S] -> vision_tower hidden_states[vision_feature_layer]   [T_v, H_v]  (list: concatenated on H)
                     -> "default" strategy drops the CLS row (CLIP)        [T, H_v * len(layers)]
                     -> multi_modal_projector (linear_1, act, linear_2)    [T, H_text]
    prompt rows of an image's pad tokens are replaced by those T rows (multimodal.mm_utils), then the language
    model runs on the embeddings as usual (paged KV, chunked prefill, prefix cache).

Checkpoint layouts: HF's saved layout (`language_model.model.*`, `language_model.lm_head.*`, `vision_tower.*`,
`multi_modal_projector.*`), the llava-hf hub layout (`vision_tower.vision_model.*`) and the newer
`model.language_model.* / model.vision_tower.* / lm_head.*` layout are all accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List, Tuple

import torch
from torch import nn

from sglang.srt.models.mm_weights import load_multimodal_weights
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.models.registry import get_model_class
from sglang.srt.models.vision_encoder import VisionTransformer, get_activation

# text model_type -> architecture, for text_configs that do not list their architectures
_TEXT_ARCHS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
               "mistral": "LlamaForCausalLM"}

# checkpoint prefix -> our prefix, tried in order
_PREFIX_MAP = (
    ("model.language_model.", "language_model.model."),
    ("model.vision_tower.", "vision_tower."),
    ("model.multi_modal_projector.", "multi_modal_projector."),
    ("lm_head.", "language_model.lm_head."),
    ("vision_tower.vision_model.", "vision_tower."),
)


@dataclass
class EncoderStats:
    """How the vision tower has been used (counted for tests and server info)."""

    num_calls: int = 0
    num_images: int = 0
    max_images_per_call: int = 0

    def record(self, num_images: int) -> None:
        self.num_calls += 1
        self.num_images += num_images
        self.max_images_per_call = max(self.max_images_per_call, num_images)


class LlavaMultiModalProjector(nn.Module):
    def __init__(self, in_features: int, out_features: int, act: str, bias: bool):
        super().__init__()
        self.linear_1 = nn.Linear(in_features, out_features, bias=bias)
        self.act = get_activation(act)
        self.linear_2 = nn.Linear(out_features, out_features, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


def text_architecture(text_config) -> str:
    archs = getattr(text_config, "architectures", None) or []
    if archs:
        return archs[0]
    model_type = getattr(text_config, "model_type", "llama")
    if model_type not in _TEXT_ARCHS:
        raise ValueError(f"LLaVA text model type {model_type!r} is not supported; supported: {sorted(_TEXT_ARCHS)}.")
    return _TEXT_ARCHS[model_type]


class LlavaForConditionalGeneration(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        vc, tc = config.vision_config, config.text_config
        layers = config.vision_feature_layer
        self.feature_layers: List[int] = [layers] if isinstance(layers, int) else list(layers)
        self.select_strategy = getattr(config, "vision_feature_select_strategy", "default")
        if self.select_strategy not in ("default", "full"):
            raise ValueError(f"vision_feature_select_strategy {self.select_strategy!r} is not supported.")
        self.vision_tower = VisionTransformer(vc)
        self.multi_modal_projector = LlavaMultiModalProjector(
            vc.hidden_size * len(self.feature_layers), tc.hidden_size,
            getattr(config, "projector_hidden_act", "gelu"), getattr(config, "multimodal_projector_bias", True))
        self.language_model = get_model_class(text_architecture(tc))(tc)
        # set by the model runner (multimodal.runner_setup)
        self.embedding_cache = None
        self.encoder_batch_size = 1
        self.encoder_stats = EncoderStats()

    # ------------------------------------------------------------------ vision
    def encode_images(self, pixel_values: List[torch.Tensor]) -> List[torch.Tensor]:
        """Images [C, S, S] -> projected embeddings [T, H_text] each, at most encoder_batch_size per tower call."""
        out: List[torch.Tensor] = []
        bs = max(self.encoder_batch_size, 1)
        for i in range(0, len(pixel_values), bs):
            group = torch.stack(pixel_values[i : i + bs])  # [B, C, S, S]
            self.encoder_stats.record(group.shape[0])
            states = self.vision_tower(group, self.feature_layers)  # each [B, T_v, H_v]
            if self.select_strategy == "default" and self.vision_tower.is_clip:
                states = [s[:, 1:] for s in states]  # drop the CLS row
            feats = self.multi_modal_projector(torch.cat(states, dim=-1))  # [B, T, H_text]
            out.extend(feats.unbind(0))
        return out

    def encode_items(self, items) -> List[torch.Tensor]:
        """MultimodalDataItems (images only) -> projected embeddings [T, H_text] each."""
        bad = [it.modality for it in items if it.modality != "image"]
        if bad:
            raise ValueError(f"LLaVA encodes images only, not {bad[0]}.")
        return self.encode_images([it.feature for it in items])

    @torch.inference_mode()
    def profile_encoder(self, batch_size: int, pixel_shape: Tuple[int, ...], device: str) -> int:
        """Measured peak bytes of encoding batch_size largest-size images (weights excluded)."""
        from sglang.srt.mem_plan.measure import measure_peak

        saved = self.encoder_batch_size
        self.encoder_batch_size = batch_size
        dummy = [torch.zeros(pixel_shape, device=device) for _ in range(batch_size)]
        try:
            with measure_peak(device) as meter:
                self.encode_images(dummy)
        finally:
            self.encoder_batch_size = saved
            self.encoder_stats = EncoderStats()  # the profile run is not real work
        return meter.increase_bytes

    # ------------------------------------------------------------------ forward
    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        embeds = None
        if forward_batch.mm_inputs is not None and forward_batch.forward_mode.is_extend():
            from sglang.srt.multimodal.mm_utils import general_mm_embed_routine

            embeds = general_mm_embed_routine(input_ids, forward_batch, self.language_model.model.embed_tokens,
                                              self.encode_items, self.embedding_cache)
        return self.language_model(input_ids, positions, forward_batch, input_embeds=embeds)

    # ------------------------------------------------------------------ weights
    @staticmethod
    def checkpoint_name(name: str) -> str:
        for old, new in _PREFIX_MAP:
            if name.startswith(old):
                return new + name[len(old):]
        return name

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        def rename(raw_name: str):
            name = self.checkpoint_name(raw_name)
            if not name.startswith("language_model.") and (name.startswith("vision_tower.head.")
                                                           or name.endswith("position_ids")):
                return None  # SigLIP's pooling head is not used by LLaVA; position_ids are a buffer
            return name

        load_multimodal_weights(self, weights, rename)


EntryClass = LlavaForConditionalGeneration
