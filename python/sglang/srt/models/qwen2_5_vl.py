"""Qwen2.5-VL: the dynamic-resolution vision tower (qwen2_5_vl_vision.py) and the Qwen2 language model with
multimodal rotary positions (M-RoPE, layers/mrotary_embedding.py).

    items (images, videos) -> visual(patches, grid_thw)               [tokens_i, H_text] each
    prompt rows of each item's pad tokens are replaced by its rows (multimodal.mm_utils)
    positions: EXTEND batches with a multimodal request carry forward_batch.mrope_positions [3, N] (the
    processor's per-request table, managers/batch_runner.py); otherwise 1-D positions (text, decode: + delta)

Checkpoint layouts: transformers 5's `model.visual.* / model.language_model.* / lm_head.*` and the hub's older
`visual.* / model.* / lm_head.*` are both accepted.
"""

from __future__ import annotations

from typing import Iterable, List, Tuple

import torch
from torch import nn

from sglang.srt.models.mm_weights import load_multimodal_weights
from sglang.srt.configs.model_config import get_rope_parameters
from sglang.srt.layers.mrotary_embedding import MRotaryEmbedding
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.models.llava import EncoderStats
from sglang.srt.models.qwen2 import Qwen2ForCausalLM
from sglang.srt.models.qwen2_5_vl_vision import Qwen2_5_VisionTransformer

DEFAULT_MROPE_SECTION = (16, 24, 24)


def mrope_section_of(text_config) -> List[int]:
    rope = get_rope_parameters(text_config)
    return list(rope.get("mrope_section") or DEFAULT_MROPE_SECTION)


def make_mrope(text_config) -> MRotaryEmbedding:
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
    rope = get_rope_parameters(text_config)
    return MRotaryEmbedding(head_dim, head_dim, text_config.max_position_embeddings, rope["rope_theta"],
                            torch.get_default_dtype(), mrope_section_of(text_config), rope)


class Qwen2_5_VLForConditionalGeneration(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        tc = config.text_config
        if getattr(config, "tie_word_embeddings", None) is not None:  # the checkpoint's top-level setting rules
            tc.tie_word_embeddings = config.tie_word_embeddings
        self.visual = Qwen2_5_VisionTransformer(config.vision_config)
        self.language_model = Qwen2ForCausalLM(tc)
        rope = make_mrope(tc)
        for layer in self.language_model.model.layers:  # one shared table, three position axes
            layer.self_attn.rotary_emb = rope
        self.merge_units = config.vision_config.spatial_merge_size ** 2
        # set by the model runner (multimodal.runner_setup)
        self.embedding_cache = None
        self.encoder_batch_size = 1
        self.encoder_stats = EncoderStats()

    # ------------------------------------------------------------------ vision
    def encode_items(self, items) -> List[torch.Tensor]:
        """Images / videos (MultimodalDataItems: patches + metadata["grid_thw"]) -> [tokens, H_text] each, at most
        encoder_batch_size items per tower call."""
        out: List[torch.Tensor] = []
        bs = max(self.encoder_batch_size, 1)
        for i in range(0, len(items), bs):
            group = items[i : i + bs]
            self.encoder_stats.record(len(group))
            grids = [tuple(int(x) for x in it.metadata["grid_thw"]) for it in group]
            patches = torch.cat([it.feature for it in group])
            out.extend(self.visual(patches, grids))
        return out

    def mm_encoder_probes(self) -> dict:
        """{"image": probe, "video": probe} (multimodal/runner_setup.py): each encodes its planned largest unit of
        work -- work.vision.num_inputs inputs of work.vision.grid_thw patches: images at the pixel cap, one video
        chunk of the planned frames -- through encode_items, as serving does."""
        return {"image": self._probe_encoder, "video": self._probe_encoder}

    def _probe_encoder(self, work, device: str) -> None:
        from sglang.srt.multimodal.mm_inputs import MultimodalDataItem

        t, h, w = work.vision.grid_thw
        v = self.config.vision_config
        dim = v.in_channels * v.temporal_patch_size * v.patch_size ** 2
        n = work.vision.num_inputs
        saved = self.encoder_batch_size
        self.encoder_batch_size = n
        dummy = [MultimodalDataItem(torch.zeros(t * h * w, dim, device=device), "", 0, t * h * w // self.merge_units,
                                    modality=work.modality, metadata={"grid_thw": (t, h, w)}) for _ in range(n)]
        try:
            self.encode_items(dummy)
        finally:
            self.encoder_batch_size = saved
            self.encoder_stats = EncoderStats()  # the profile run is not real work

    # ------------------------------------------------------------------ forward
    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        embeds = None
        if forward_batch.mm_inputs is not None and forward_batch.forward_mode.is_extend():
            from sglang.srt.multimodal.mm_utils import general_mm_embed_routine

            embeds = general_mm_embed_routine(input_ids, forward_batch, self.language_model.model.embed_tokens,
                                              self.encode_items, self.embedding_cache)
        if forward_batch.mrope_positions is not None:
            positions = forward_batch.mrope_positions
        return self.language_model(input_ids, positions, forward_batch, input_embeds=embeds)

    # ------------------------------------------------------------------ weights
    @staticmethod
    def checkpoint_name(name: str) -> str:
        for old, new in (("model.visual.", "visual."), ("model.language_model.", "language_model.model."),
                         ("lm_head.", "language_model.lm_head."), ("visual.", "visual."),
                         ("model.", "language_model.model.")):
            if name.startswith(old):
                return new + name[len(old):]
        return name

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        load_multimodal_weights(self, weights, self.checkpoint_name)


EntryClass = Qwen2_5_VLForConditionalGeneration
