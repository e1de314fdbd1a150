"""Qwen3-Omni Thinker processor: images, videos and audios -> MultimodalInputs with M-RoPE positions.

    prompt ids with <|image_pad|>, <|video_pad|>, <|audio_pad|> (one per item; the chat template writes
    <|vision_start|><|image_pad|><|vision_end|> and <|audio_start|><|audio_pad|><|audio_end|>); a prompt without
    them gets those triples at its start
      image -> Qwen2-VL pixel preprocessing at patch 16 (qwen_vl_image.py, preprocessor_config.json)
      video -> PyAV sampling (video_preprocessor_config.json: fps, frames, per-frame pixels) -> the same patches
      audio -> multimodal.audio_loader.load_audio (16 kHz mono, --max-audio-seconds)
               -> multimodal.audio_features.log_mel(samples, MelConfig) [128, samples // 160], no padding: what HF's
               Qwen3OmniMoeProcessor feeds the tower (padding="longest" of a one-audio batch)
      each pad token -> the item's token count of pad ids: t*h*w/4 for vision, the audio tower's
               output_tokens(mel frames) for audio (13 per 100 frames + the rest's)
    -> items (modality, feature, grid_thw / mel_frames, encoder_chunks), mrope_positions [3, L] and delta
       (multimodal/mrope_positions.py: vision tokens on the (t, h, w) grid with t scaled by position_id_per_seconds
       x seconds per temporal patch; audio tokens advance all three axes like text)
Long videos and audios are encoded in the planned chunks (mem_plan/encoder_inputs.py): a video in chunks of
video_chunk_frames frames (whole temporal patches), an audio in chunks of audio_chunk_mel_frames mel frames (whole
attention windows); item.encoder_chunks gives each chunk's token rows, metadata chunk_t / chunk_mel_frames its
size for the model. Audio inside a video (use_audio_in_video) is not supported: send the audio as its own item.
"""

from __future__ import annotations

from typing import Any, List, Optional

from sglang.srt.mem_plan.encoder_inputs import audio_chunk_mel_frames, video_chunk_frames
from sglang.srt.mem_plan.encoder_towers import omni_audio_tower
from sglang.srt.multimodal.audio_features import MelConfig, log_mel
from sglang.srt.multimodal.audio_loader import load_audio
from sglang.srt.multimodal.mm_inputs import MultimodalDataItem, MultimodalInputs, content_hash, pad_ids
from sglang.srt.multimodal.mrope_positions import mrope_positions
from sglang.srt.multimodal.processors.base_processor import as_list
from sglang.srt.multimodal.processors.qwen2_5_vl import Qwen2_5_VLProcessor


def thinker_config_of(hf_config):
    """The Thinker's config: a full Qwen3-Omni config holds it under thinker_config."""
    return getattr(hf_config, "thinker_config", None) or hf_config


def chunk_rows(total: int, step: int, tokens_before) -> Optional[list]:
    """[(lo, hi)] token rows of the chunks [0, step), [step, 2 step), ... of `total` units, or None for one chunk.
    tokens_before(u): tokens of the first u units."""
    if total <= step:
        return None
    return [(tokens_before(s), tokens_before(min(s + step, total))) for s in range(0, total, step)]


class Qwen3OmniThinkerProcessor(Qwen2_5_VLProcessor):
    supported_modalities = ("image", "video", "audio")

    def __init__(self, hf_config, model_dir: str, server_args):
        cfg = thinker_config_of(hf_config)
        super().__init__(cfg, model_dir, server_args)
        self.tokens_per_second = float(getattr(cfg, "position_id_per_seconds", 13))  # M-RoPE t units per second
        self.audio_token_id = int(cfg.audio_token_id)
        self.audio_start_id = int(cfg.audio_start_token_id)
        self.audio_end_id = int(getattr(cfg, "audio_end_token_id", self.audio_start_id + 1))
        audio = cfg.audio_config
        self.audio_tower = omni_audio_tower(audio.to_dict() if hasattr(audio, "to_dict") else dict(audio))
        self.mel = MelConfig.from_model_dir(model_dir, audio.num_mel_bins)
        if self.mel.num_mel_bins != audio.num_mel_bins:
            raise ValueError(f"preprocessor_config.json has feature_size {self.mel.num_mel_bins}; the audio tower "
                             f"takes {audio.num_mel_bins} mel bins.")
        self.max_audio_seconds = float(server_args.max_audio_seconds)
        self.video_chunk_t = video_chunk_frames(self.max_video_frames, self.video_cfg.temporal_patch_size) \
            // self.video_cfg.temporal_patch_size
        self.audio_chunk_mel = audio_chunk_mel_frames(self.audio_tower, self.max_audio_seconds)

    def chat_placeholder(self, modality: str, tokenizer) -> Optional[str]:
        if modality != "audio":
            return super().chat_placeholder(modality, tokenizer)
        return "".join(tokenizer.convert_ids_to_tokens([self.audio_start_id, self.audio_token_id, self.audio_end_id]))

    @property
    def max_tokens_per_image(self) -> int:  # the most tokens one item expands to
        audio = self.audio_tower.output_tokens(int(self.max_audio_seconds * self.mel.sampling_rate)
                                               // self.mel.hop_length)
        return max(super().max_tokens_per_image, audio)

    # ---- one item ----
    def _video_item(self, data: Any) -> MultimodalDataItem:
        item = super()._video_item(data)
        t, h, w = item.metadata["grid_thw"]
        per_slice = h * w // (self.merge * self.merge)
        item.encoder_chunks = chunk_rows(t, self.video_chunk_t, lambda u: u * per_slice)
        item.metadata["chunk_t"] = self.video_chunk_t
        return item

    def _audio_item(self, data: Any) -> MultimodalDataItem:
        samples = load_audio(data, self.allowed_local_media_path, self.mel.sampling_rate, self.max_audio_seconds)
        feature = log_mel(samples, self.mel)  # [mel, samples // hop]
        frames = feature.shape[1]
        if frames == 0:
            raise ValueError(f"The audio is too short: {samples.size} samples give no {self.mel.hop_length}-sample "
                             "mel frame.")
        tokens = self.audio_tower.output_tokens
        item = MultimodalDataItem(feature, content_hash(feature, f"audio{frames}"), 0, tokens(frames),
                                  modality="audio", metadata={"mel_frames": frames,
                                                              "chunk_mel_frames": self.audio_chunk_mel,
                                                              "seconds": samples.size / self.mel.sampling_rate})
        item.encoder_chunks = chunk_rows(frames, self.audio_chunk_mel, tokens)
        return item

    # ---- the request ----
    def process(self, input_ids: List[int], image_data: Any = None, video_data: Any = None,
                audio_data: Any = None) -> MultimodalInputs:
        images, videos, audios = as_list(image_data), as_list(video_data), as_list(audio_data)
        self.check_counts({"image": len(images), "video": len(videos), "audio": len(audios)})
        if not images and not videos and not audios:
            return MultimodalInputs(list(input_ids), [])
        queues = {self.image_token_id: self._items(images, self._image_item, "Image"),
                  self.video_token_id: self._items(videos, self._video_item, "Video"),
                  self.audio_token_id: self._items(audios, self._audio_item, "Audio")}
        ids = self._place_all(list(input_ids), {t: len(q) for t, q in queues.items()})
        out: List[int] = []
        items: List[MultimodalDataItem] = []
        taken = {t: 0 for t in queues}
        for t in ids:
            if t not in queues:
                out.append(t)
                continue
            item = queues[t][taken[t]]
            taken[t] += 1
            item.offset = len(out)
            items.append(item)
            out.extend(pad_ids(item.hash, item.num_tokens, self.vocab_size))
        self._refuse_audio_in_video(out, items)
        positions, delta = mrope_positions(len(out), items, self.merge, self.tokens_per_second)
        if positions.numel() and int(positions.max()) >= self.max_position:
            raise ValueError(f"The request's multimodal positions reach {int(positions.max())}; the model has "
                             f"{self.max_position} (max_position_embeddings). Send shorter inputs or fewer items.")
        return MultimodalInputs(out, items, positions, delta)

    def _place_all(self, ids: List[int], counts: dict) -> List[int]:
        head: List[int] = []
        names = {self.image_token_id: "image", self.video_token_id: "video", self.audio_token_id: "audio"}
        for token, n in counts.items():
            name = names[token]
            count = sum(1 for t in ids if t == token)
            if count == 0 and n:
                start, end = ((self.audio_start_id, self.audio_end_id) if name == "audio"
                              else (self.vision_start_id, self.vision_end_id))
                head += [start, token, end] * n
            elif count != n:
                raise ValueError(f"The prompt has {count} {name} tokens but {n} {name}s were sent; "
                                 f"send one {name} per {name} token.")
        return head + ids

    def _refuse_audio_in_video(self, ids: List[int], items) -> None:
        """HF reads <|vision_start|> directly followed by <|audio_start|> as a video with its audio interleaved
        (use_audio_in_video), which this server does not serve."""
        for a, b in zip(ids, ids[1:]):
            if a == self.vision_start_id and b == self.audio_start_id:
                raise ValueError("Audio inside a video (<|vision_start|><|audio_start|>, use_audio_in_video) is not "
                                 "supported; send the video and its audio as separate items.")
