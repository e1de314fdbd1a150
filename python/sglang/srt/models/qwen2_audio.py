"""Qwen2-Audio: a Whisper-style audio encoder (whisper_audio_encoder.py), a linear projector, and the Qwen2 LM.

    audio item (log-mel [num_mel_bins, 3000] of the zero-padded 30 s window, metadata["mel_frames"] = its own L)
      -> audio_tower                              [tokens, d_model]   tokens = ((L - 1) // 2 + 1 - 2) // 2 + 1
      -> multi_modal_projector.linear             [tokens, H_text]
    prompt rows of the item's pad tokens are replaced by those rows (multimodal.mm_utils); the LM runs on the
    embeddings as usual (paged KV, chunked prefill through an audio, prefix cache).

One item is one encoder unit (the tower's fixed window): mm_encoder_probes() gives the runner an "audio" probe that
encodes one full window, so the plan's encoder_audio term is measured at the largest accepted input.

Checkpoint layouts: transformers 5's `model.audio_tower.* / model.multi_modal_projector.* / model.language_model.*
/ lm_head.*` and the hub's `audio_tower.* / multi_modal_projector.* / language_model.model.* /
language_model.lm_head.*` are both accepted.
"""

from __future__ import annotations

from typing import Iterable, List, Tuple

import torch
from torch import nn

from sglang.srt.models.mm_weights import load_multimodal_weights
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.models.llava import EncoderStats
from sglang.srt.models.qwen2 import Qwen2ForCausalLM
from sglang.srt.models.whisper_audio_encoder import WhisperAudioEncoder
from sglang.srt.multimodal.audio_features import whisper_output_tokens as output_tokens

_PREFIX_MAP = (
    ("model.audio_tower.", "audio_tower."),
    ("model.multi_modal_projector.", "multi_modal_projector."),
    ("model.language_model.", "language_model.model."),
    ("lm_head.", "language_model.lm_head."),
)


class Qwen2AudioProjector(nn.Module):
    def __init__(self, audio_dim: int, text_dim: int):
        super().__init__()
        self.linear = nn.Linear(audio_dim, text_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class Qwen2AudioForConditionalGeneration(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.audio_tower = WhisperAudioEncoder(config.audio_config)
        self.multi_modal_projector = Qwen2AudioProjector(config.audio_config.d_model, config.text_config.hidden_size)
        self.language_model = Qwen2ForCausalLM(config.text_config)
        # set by the model runner (multimodal.runner_setup)
        self.embedding_cache = None
        self.encoder_batch_size = 1
        self.encoder_workloads = {}
        self.encoder_stats = EncoderStats()

    # ------------------------------------------------------------------ audio
    def encode_items(self, items) -> List[torch.Tensor]:
        """Audio items -> [tokens, H_text] each, at most encoder_batch_size windows per tower call."""
        out: List[torch.Tensor] = []
        bs = max(self.encoder_batch_size, 1)
        device = self.multi_modal_projector.linear.weight.device
        for i in range(0, len(items), bs):
            group = items[i : i + bs]
            self.encoder_stats.record(len(group))
            feats = torch.stack([it.feature for it in group]).to(device)
            rows = self.audio_tower(feats, [int(it.metadata["mel_frames"]) for it in group])
            out.extend(self.multi_modal_projector(r) for r in rows)
        return out

    def mm_encoder_probes(self) -> dict:
        return {"audio": self._probe_audio}

    def _probe_audio(self, work, device: str) -> None:
        """One full window of mel frames (the largest accepted audio), encoded as serving encodes it."""
        from sglang.srt.multimodal.mm_inputs import MultimodalDataItem

        frames = self.audio_tower.window_frames
        feature = torch.zeros(self.audio_tower.num_mel_bins, frames, device=device)
        items = [MultimodalDataItem(feature, "", 0, output_tokens(frames), modality="audio",
                                    metadata={"mel_frames": frames}) for _ in range(work.units)]
        saved = self.encoder_stats
        try:
            self.encode_items(items)
        finally:
            self.encoder_stats = saved  # the probe is not real work

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
        load_multimodal_weights(self, weights, self.checkpoint_name)


EntryClass = Qwen2AudioForConditionalGeneration
