"""Qwen2-Audio processor: audio clips -> log-mel windows and <|AUDIO|> pad tokens, as HF's Qwen2AudioProcessor.

    prompt ids with one <|AUDIO|> per audio (the chat template writes <|audio_bos|><|AUDIO|><|audio_eos|>); a
    prompt without them gets one <|AUDIO|> per audio at its start
      audio -> audio_loader.load_audio (soundfile + soxr: mono at the feature extractor's rate; at most
               min(--max-audio-seconds, the tower's chunk_length window) seconds, else a 400)
            -> audio_features.log_mel of the clip zero-padded to the window ([num_mel_bins, window frames])
      each <|AUDIO|> -> ((L - 1) // 2 + 1 - 2) // 2 + 1 pad ids, L = the clip's own mel frames (ceil(samples / hop))
    -> MultimodalInputs: items (modality "audio", the window's features, metadata mel_frames / seconds)
The clip is never truncated: HF's feature extractor would silently drop audio beyond the window, so a longer clip
is refused instead, naming the limit.
"""

from __future__ import annotations

from typing import Any, List, Optional

from sglang.srt.multimodal.audio_features import MelConfig, log_mel
from sglang.srt.multimodal.audio_features import whisper_output_tokens as output_tokens
from sglang.srt.multimodal.audio_loader import load_audio
from sglang.srt.multimodal.mm_inputs import MultimodalDataItem, MultimodalInputs, content_hash, pad_ids
from sglang.srt.multimodal.processors.base_processor import BaseMultimodalProcessor, as_list, item_limits_of

AUDIO_BOS, AUDIO_EOS = "<|audio_bos|>", "<|audio_eos|>"


class Qwen2AudioProcessor(BaseMultimodalProcessor):
    supported_modalities = ("audio",)

    def __init__(self, hf_config, model_dir: str, server_args):
        self.audio_token_id = int(getattr(hf_config, "audio_token_id", None) or hf_config.audio_token_index)
        self.image_token_id = -1  # no images
        self.vocab_size = hf_config.text_config.vocab_size
        self.allowed_local_media_path = server_args.allowed_local_media_path
        self.item_limits = item_limits_of(server_args)
        audio = hf_config.audio_config
        self.mel = MelConfig.from_model_dir(model_dir, audio.num_mel_bins)
        if self.mel.num_mel_bins != audio.num_mel_bins:
            raise ValueError(f"preprocessor_config.json has feature_size {self.mel.num_mel_bins}; the audio tower "
                             f"takes {audio.num_mel_bins} mel bins.")
        if self.mel.window_frames != 2 * audio.max_source_positions:
            raise ValueError(f"preprocessor_config.json's {self.mel.chunk_length_s} s window is "
                             f"{self.mel.window_frames} mel frames; the audio tower takes "
                             f"{2 * audio.max_source_positions} (2 x max_source_positions).")
        window_s = float(self.mel.chunk_length_s)
        self.max_audio_seconds = min(float(server_args.max_audio_seconds), window_s)
        self.limit_name = ("--max-audio-seconds" if server_args.max_audio_seconds <= window_s else
                           f"the audio encoder's {window_s:g} s window; --max-audio-seconds is "
                           f"{server_args.max_audio_seconds:g}")

    def chat_placeholder(self, modality: str, tokenizer) -> Optional[str]:
        if modality != "audio":
            return None
        pad = tokenizer.convert_ids_to_tokens(self.audio_token_id)
        ids = tokenizer.convert_tokens_to_ids([AUDIO_BOS, AUDIO_EOS])
        known = all(i is not None and i != tokenizer.unk_token_id for i in ids)
        return f"{AUDIO_BOS}{pad}{AUDIO_EOS}" if known else pad

    @property
    def max_tokens_per_image(self) -> int:  # the most tokens one item expands to (one full window)
        return output_tokens(self.mel.window_frames)

    # ---- one item ----
    def audio_item(self, data: Any) -> MultimodalDataItem:
        samples = load_audio(data, self.allowed_local_media_path, self.mel.sampling_rate, self.max_audio_seconds,
                             self.limit_name)
        frames = min(self.mel.num_frames(samples.size), self.mel.window_frames)
        feature = log_mel(samples, self.mel, pad_to_samples=self.mel.window_samples)
        seconds = samples.size / self.mel.sampling_rate
        return MultimodalDataItem(feature, content_hash(feature, f"audio{frames}"), 0, output_tokens(frames),
                                  modality="audio", metadata={"mel_frames": frames, "seconds": seconds})

    # ---- the request ----
    def process(self, input_ids: List[int], image_data: Any = None, video_data: Any = None,
                audio_data: Any = None) -> MultimodalInputs:
        audios = as_list(audio_data)
        self.check_counts({"image": len(as_list(image_data)), "video": len(as_list(video_data)),
                           "audio": len(audios)})
        if not audios:
            return MultimodalInputs(list(input_ids), [])
        items = []
        for i, d in enumerate(audios):
            try:
                items.append(self.audio_item(d))
            except ValueError as e:
                raise ValueError(f"Audio {i}: {e}" if len(audios) > 1 else str(e)) from e
        ids = list(input_ids)
        count = sum(1 for t in ids if t == self.audio_token_id)
        if count == 0:
            ids = [self.audio_token_id] * len(items) + ids
        elif count != len(items):
            raise ValueError(f"The prompt has {count} audio tokens but {len(items)} audios were sent; "
                             "send one audio per audio token.")
        out: List[int] = []
        k = 0
        for t in ids:
            if t != self.audio_token_id:
                out.append(t)
                continue
            item = items[k]
            k += 1
            item.offset = len(out)
            out.extend(pad_ids(item.hash, item.num_tokens, self.vocab_size))
        return MultimodalInputs(out, items)
