"""Qwen3-Omni's Thinker (text output): the vision tower with deepstack (qwen3_omni_vision.py), the audio tower
(qwen3_omni_audio.py) and the Qwen3-MoE language model with interleaved multimodal rotary positions.

    items -> encoder chunks (an image; a video chunk of whole temporal slices; an audio chunk of whole windows),
             each from the embedding cache under encoder_admission.unit_key, else encoded
    prompt rows of an item's pad tokens <- its embedding rows (only the rows inside this extend chunk)
    vision rows also carry D deepstack features: after decoder layer i < D, feature i is added to the hidden
             state of those rows (HF: visual_pos_masks + deepstack_visual_embeds), so chunked prefill and prefix
             hits add exactly the rows the chunk holds
    positions: [3, N] from the processor's per-request table (mrope_positions) in EXTEND batches with items,
             else 1-D (+ delta); frequencies take their axis interleaved: (T, H, W, T, H, W, ...) over the first
             3 x mrope_section[1|2] frequencies, T for the rest (HF's recomposition_frequencies)

Checkpoints: the full Qwen3-Omni layout (thinker.{visual, audio_tower, model, lm_head}.*; talker.* and code2wav.*
skipped), a thinker-only save (visual.*, audio_tower.*, model.*, lm_head.*) and transformers 5's runtime names
(model.visual.*, model.audio_tower.*, model.language_model.*). Experts load per expert (experts.{e}.{proj}).
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Tuple

import torch
from torch import nn

from sglang.srt.models.mm_weights import load_multimodal_weights
from sglang.srt.configs.model_config import get_rope_parameters
from sglang.srt.layers.mrotary_embedding import MRotaryEmbedding
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.models.llava import EncoderStats
from sglang.srt.models.qwen3_moe import Qwen3MoeForCausalLM, Qwen3MoeModel
from sglang.srt.models.qwen3_omni_audio import Qwen3OmniAudioEncoder
from sglang.srt.models.qwen3_omni_vision import Qwen3OmniVisionTransformer
from sglang.srt.multimodal.encoder_admission import encoder_chunks, unit_key

SKIPPED_PREFIXES = ("talker.", "code2wav.")
NAME_MAP = (("thinker.", ""), ("model.visual.", "visual."), ("model.audio_tower.", "audio_tower."),
            ("model.language_model.", "language_model.model."), ("lm_head.", "language_model.lm_head."),
            ("visual.", "visual."), ("audio_tower.", "audio_tower."), ("model.", "language_model.model."))


class InterleavedMRotaryEmbedding(MRotaryEmbedding):
    """M-RoPE whose frequency j follows axis H when j % 3 == 1 and j < 3 * section[1], W when j % 3 == 2 and
    j < 3 * section[2], else T."""

    def __init__(self, head_dim: int, max_position: int, base: float, section, rope: dict):
        params = {k: v for k, v in rope.items() if k not in ("interleaved", "mrope_interleaved")}
        super().__init__(head_dim, head_dim, max_position, base, torch.get_default_dtype(), section, params)
        j = torch.arange(head_dim // 2)
        axis = torch.zeros_like(j)
        axis[(j % 3 == 1) & (j < 3 * section[1])] = 1
        axis[(j % 3 == 2) & (j < 3 * section[2])] = 2
        self.section_axis.copy_(axis.to(self.section_axis.device))


class OmniTextModel(Qwen3MoeModel):
    def forward(self, input_ids, positions, forward_batch, input_embeds=None, deepstack=None) -> torch.Tensor:
        """deepstack: (batch rows [R], features [R, D, hidden]) -- feature i is added after layer i."""
        hidden_states = self.embed_tokens(input_ids) if input_embeds is None else input_embeds
        residual = None
        for i, layer in enumerate(self.layers):
            hidden_states, residual = layer(positions, hidden_states, forward_batch, residual)
            if deepstack is not None and i < deepstack[1].shape[1]:
                rows, feats = deepstack
                hidden_states = hidden_states.index_add(0, rows, feats[:, i].to(hidden_states.dtype))
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class OmniThinkerLM(Qwen3MoeForCausalLM):
    model_cls = OmniTextModel


class Qwen3OmniMoeThinkerForConditionalGeneration(nn.Module):
    def __init__(self, config):
        super().__init__()
        cfg = getattr(config, "thinker_config", None) or config
        self.config = cfg
        tc = cfg.text_config
        self.visual = Qwen3OmniVisionTransformer(cfg.vision_config)
        self.audio_tower = Qwen3OmniAudioEncoder(cfg.audio_config)
        self.language_model = OmniThinkerLM(tc)
        rope = get_rope_parameters(tc)
        head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
        mrope = InterleavedMRotaryEmbedding(head_dim, tc.max_position_embeddings, rope["rope_theta"],
                                            list(rope.get("mrope_section") or (24, 20, 20)), rope)
        for layer in self.language_model.model.layers:
            layer.self_attn.rotary_emb = mrope
        self.hidden = tc.hidden_size
        self.merge_units = cfg.vision_config.spatial_merge_size ** 2
        # set by the model runner (multimodal.runner_setup)
        self.embedding_cache = None
        self.encoder_batch_size = 1
        self.encoder_workloads = {}
        self.encoder_stats = EncoderStats()

    # ------------------------------------------------------------------ encoders
    def _vision(self, patches: List[torch.Tensor], grids: List[Tuple[int, int, int]]) -> List[torch.Tensor]:
        self.encoder_stats.record(len(grids))
        return self.visual(torch.cat(patches), grids)

    def _chunk_input(self, item, index: int, num_chunks: int):
        """(feature, grid) of one encoder chunk of an item (the whole item when it has one chunk)."""
        if item.modality == "audio":
            if num_chunks == 1:
                return item.feature, None
            step = item.metadata["chunk_mel_frames"]
            return item.feature[:, index * step:(index + 1) * step], None
        t, h, w = (int(v) for v in item.metadata["grid_thw"])
        if num_chunks == 1:
            return item.feature, (t, h, w)
        ct = item.metadata["chunk_t"]
        t0, t1 = index * ct, min((index + 1) * ct, t)
        return item.feature[t0 * h * w:t1 * h * w], (t1 - t0, h, w)

    def encode_chunks(self, chunks) -> List[torch.Tensor]:
        """[(item, index, num_chunks)] -> embeddings of each chunk: [tokens, (1 + D) * hidden] for vision (merged,
        then deepstack), [tokens, hidden] for audio. Images go up to encoder_batch_size per tower call; a video or
        audio chunk is one call (the planned unit)."""
        out: List[Optional[torch.Tensor]] = [None] * len(chunks)
        images = []
        for k, (item, index, n) in enumerate(chunks):
            feature, grid = self._chunk_input(item, index, n)
            if item.modality == "audio":
                self.encoder_stats.record(1)
                out[k] = self.audio_tower([feature])[0]
            elif item.modality == "image":
                images.append((k, feature, grid))
            else:
                out[k] = self._vision([feature], [grid])[0]
        bs = max(self.encoder_batch_size, 1)
        for i in range(0, len(images), bs):
            group = images[i:i + bs]
            for (k, _, _), e in zip(group, self._vision([f for _, f, _ in group], [g for _, _, g in group])):
                out[k] = e
        return out

    def mm_encoder_probes(self):
        """{modality: probe(work, device)} on the planned unit, through encode_chunks as serving runs it."""
        from sglang.srt.multimodal.mm_inputs import MultimodalDataItem

        v = self.config.vision_config
        dim = v.in_channels * v.temporal_patch_size * v.patch_size ** 2

        def vision_probe(modality):
            def probe(work, device):
                t, h, w = work.vision.grid_thw
                items = [MultimodalDataItem(torch.zeros(t * h * w, dim, device=device), "", 0,
                                            t * h * w // self.merge_units, modality=modality,
                                            metadata={"grid_thw": (t, h, w)}) for _ in range(work.vision.num_inputs)]
                self._probe([(it, 0, 1) for it in items])
            return probe

        def audio_probe(work, device):
            mel = self.config.audio_config.num_mel_bins
            item = MultimodalDataItem(torch.zeros(mel, work.mel_frames, device=device), "", 0,
                                      self.audio_tower.num_tokens(work.mel_frames), modality="audio")
            self._probe([(item, 0, 1)])

        return {"image": vision_probe("image"), "video": vision_probe("video"), "audio": audio_probe}

    def _probe(self, chunks) -> None:
        saved_bs, stats = self.encoder_batch_size, self.encoder_stats
        self.encoder_batch_size = max(len(chunks), 1)
        try:
            outs = self.encode_chunks(chunks)
            del outs
        finally:
            self.encoder_batch_size, self.encoder_stats = saved_bs, stats

    # ------------------------------------------------------------------ embeddings
    def embed_with_items(self, input_ids: torch.Tensor, forward_batch: ForwardBatch):
        """(prompt embeddings [N, hidden] with item rows spliced in, deepstack (rows, [R, D, hidden]) or None)."""
        embeds = self.language_model.model.embed_tokens(input_ids)
        spans = []  # (batch row of the item's token `offset`, item, chunk index, num chunks, lo, hi) to copy
        row = 0
        for b, mm in enumerate(forward_batch.mm_inputs or []):
            start, n = forward_batch.extend_prefix_lens_cpu[b], forward_batch.extend_seq_lens_cpu[b]
            if mm is not None:
                for item, lo, hi in mm.items_in_range(start, start + n):
                    chunks = encoder_chunks(item)
                    for idx, (clo, chi) in enumerate(chunks):
                        a, z = max(lo, clo), min(hi, chi)
                        if a < z:
                            spans.append((row + item.offset - start, item, idx, len(chunks), a, z, clo))
            row += n
        if not spans:
            return embeds, None
        feats, missing = {}, {}
        cache = self.embedding_cache
        for _, item, idx, n, _, _, _ in spans:
            key = unit_key(item.hash, idx, n)
            if key in feats or key in missing:
                continue
            hit = cache.get(key) if cache is not None else None
            if hit is not None:
                feats[key] = hit
            else:
                missing[key] = (item, idx, n)
        if missing:
            for (key, (item, idx, n)), e in zip(missing.items(), self.encode_chunks(list(missing.values()))):
                lo, hi = encoder_chunks(item)[idx]
                if e.shape[0] != hi - lo:
                    raise ValueError(f"The encoder produced {e.shape[0]} embeddings for an {item.modality} chunk of "
                                     f"{hi - lo} tokens; the processor and the model disagree.")
                feats[key] = e
                if cache is not None:
                    cache.put(key, e.clone())
        h = self.hidden
        deep_rows, deep_feats = [], []
        for base, item, idx, n, a, z, clo in spans:
            e = feats[unit_key(item.hash, idx, n)]
            dst = base + a
            embeds[dst:dst + z - a] = e[a - clo:z - clo, :h].to(embeds.dtype)
            if item.modality != "audio" and e.shape[1] > h:
                deep_rows.append(torch.arange(dst, dst + z - a))
                deep_feats.append(e[a - clo:z - clo, h:])
        if not deep_rows:
            return embeds, None
        feats_all = torch.cat(deep_feats).to(embeds.device)
        return embeds, (torch.cat(deep_rows).to(embeds.device), feats_all.view(feats_all.shape[0], -1, h))

    # ------------------------------------------------------------------ forward
    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        embeds, deepstack = None, None
        if forward_batch.mm_inputs is not None and forward_batch.forward_mode.is_extend():
            embeds, deepstack = self.embed_with_items(input_ids, forward_batch)
        if forward_batch.mrope_positions is not None:
            positions = forward_batch.mrope_positions
        lm = self.language_model
        hidden = lm.model(input_ids, positions, forward_batch, embeds, deepstack)
        return lm.logits_processor(input_ids, hidden, lm.lm_head, forward_batch)

    # ------------------------------------------------------------------ weights
    @staticmethod
    def checkpoint_name(name: str) -> Optional[str]:
        """The parameter a checkpoint tensor fills, or None for the talker / code2wav tensors."""
        if name.startswith("thinker."):
            name = name[len("thinker."):]
        elif name.startswith(SKIPPED_PREFIXES):
            return None
        for old, new in NAME_MAP[1:]:
            if name.startswith(old):
                return new + name[len(old):]
        return name

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        load_multimodal_weights(self, weights, self.checkpoint_name)


class Qwen3OmniMoeForConditionalGeneration(Qwen3OmniMoeThinkerForConditionalGeneration):
    """The full Qwen3-Omni checkpoint, served as its Thinker (text output; the talker and code2wav are skipped)."""


EntryClass = Qwen3OmniMoeThinkerForConditionalGeneration
