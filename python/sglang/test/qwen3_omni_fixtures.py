"""Helpers for Qwen3-Omni Thinker tests: a small random-weight Thinker checkpoint, test audio as Whisper log-mel
features, and HF transformers' greedy tokens for our processor's output (the reference).

The checkpoint directory holds config.json + model.safetensors saved by transformers from its own
Qwen3OmniMoeThinkerConfig (a 2-layer MoE text model of 8 experts, a 3-block vision tower with deepstack at blocks 0
and 1, a 2-layer audio tower with windows of 2 conv chunks), preprocessor_config.json (patch 16, small pixel caps,
the Whisper feature extractor's fields) and video_preprocessor_config.json, and the SmolLM2 tokenizer with Qwen's
vision and audio tokens added.
"""

from __future__ import annotations

import json
import os
from typing import List

import numpy as np
import torch

from sglang.test.engine_fixtures import spread_random_weights

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
AUDIO_TOKENS = ["<|audio_start|>", "<|audio_end|>", "<|audio_pad|>"]
PATCH = 16
MIN_PIXELS = 64 * 64  # 2 x 2 merge units
MAX_PIXELS = 32 * 32 * 16  # 16 merge units: 64 patches, 16 tokens
VIDEO_MAX_PIXELS = 32 * 32 * 6  # per frame
VIDEO_FPS = 2.0
POSITION_ID_PER_SECONDS = 13


def make_random_qwen3_omni_thinker(path: str, seed: int = 0, full_checkpoint: bool = False,
                                   video_max_frames: int = 16) -> str:
    """Save a random-weight Qwen3OmniMoeThinkerForConditionalGeneration (fp32) with tokenizer and processor configs.
    full_checkpoint: save it as the full Qwen3-Omni checkpoint lays it out (thinker.* names, a
    Qwen3OmniMoeForConditionalGeneration config.json with a thinker_config, plus talker tensors to skip)."""
    from transformers import AutoTokenizer, Qwen3OmniMoeThinkerConfig, Qwen3OmniMoeThinkerForConditionalGeneration

    from sglang.test.engine_fixtures import default_model_dir

    tok = AutoTokenizer.from_pretrained(default_model_dir())
    tok.add_special_tokens({"additional_special_tokens": VISION_TOKENS + AUDIO_TOKENS})
    ids = dict(zip(VISION_TOKENS + AUDIO_TOKENS, tok.convert_tokens_to_ids(VISION_TOKENS + AUDIO_TOKENS)))
    vocab = (len(tok) + 63) // 64 * 64
    text = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, rms_norm_eps=1e-6,
                moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                decoder_sparse_step=1, bos_token_id=1, eos_token_id=2,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2],
                                 "interleaved": True, "mrope_interleaved": True})
    vision = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=4, patch_size=PATCH, temporal_patch_size=2,
                  spatial_merge_size=2, out_hidden_size=64, num_position_embeddings=16, deepstack_visual_indexes=[0, 1],
                  hidden_act="gelu_pytorch_tanh", rope_parameters={"rope_type": "axial", "rope_theta": 10000.0})
    audio = dict(num_mel_bins=128, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64, d_model=32,
                 output_dim=64, n_window=50, n_window_infer=200, conv_chunksize=500, downsample_hidden_size=8,
                 max_source_positions=1500)
    cfg = Qwen3OmniMoeThinkerConfig(
        text_config=text, vision_config=vision, audio_config=audio, image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], audio_token_id=ids["<|audio_pad|>"],
        audio_start_token_id=ids["<|audio_start|>"], position_id_per_seconds=POSITION_ID_PER_SECONDS,
        tie_word_embeddings=False)
    cfg.vision_start_token_id = ids["<|vision_start|>"]
    cfg.vision_end_token_id = ids["<|vision_end|>"]
    cfg.audio_end_token_id = ids["<|audio_end|>"]
    torch.manual_seed(seed)
    model = spread_random_weights(Qwen3OmniMoeThinkerForConditionalGeneration(cfg).to(torch.float32))
    model.save_pretrained(path, safe_serialization=True)
    if full_checkpoint:
        _as_full_checkpoint(path)
    tok.save_pretrained(path)
    _write_processor_configs(path, video_max_frames)
    return path


def _as_full_checkpoint(path: str) -> None:
    """Rename the thinker-only save into the full Qwen3-Omni layout: thinker.{model.*, lm_head.*} tensors (the
    hub's names: thinker.model.* is the text model, thinker.visual.* / thinker.audio_tower.* the towers), a talker
    tensor the loader must skip, and a top-level config with the thinker under thinker_config."""
    from safetensors.torch import load_file, save_file

    f = os.path.join(path, "model.safetensors")
    raw = load_file(f)
    out = {}
    for name, t in raw.items():
        for old, new in (("visual.", "thinker.visual."), ("audio_tower.", "thinker.audio_tower."),
                         ("model.", "thinker.model."), ("lm_head.", "thinker.lm_head.")):
            if name.startswith(old):
                out[new + name[len(old):]] = t
                break
        else:
            raise AssertionError(name)
    out["talker.model.norm.weight"] = torch.ones(4)
    out["code2wav.decoder.0.conv.weight"] = torch.ones(2, 2)
    save_file(out, f, metadata={"format": "pt"})
    with open(os.path.join(path, "config.json")) as fh:
        thinker = json.load(fh)
    full = {"architectures": ["Qwen3OmniMoeForConditionalGeneration"], "model_type": "qwen3_omni_moe",
            "enable_audio_output": False, "thinker_config": {k: v for k, v in thinker.items() if k != "architectures"}}
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(full, fh, indent=2)


def _write_processor_configs(path: str, video_max_frames: int) -> None:
    common = {"patch_size": PATCH, "temporal_patch_size": 2, "merge_size": 2, "do_rescale": True,
              "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5],
              "image_std": [0.5, 0.5, 0.5], "resample": 3}
    whisper = {"feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 128, "hop_length": 160,
               "n_fft": 400, "n_samples": 4800000, "nb_max_frames": 30000, "sampling_rate": 16000}
    with open(os.path.join(path, "preprocessor_config.json"), "w") as f:
        json.dump({"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": MIN_PIXELS,
                   "max_pixels": MAX_PIXELS, **common, **whisper}, f, indent=2)
    with open(os.path.join(path, "video_preprocessor_config.json"), "w") as f:
        json.dump({"video_processor_type": "Qwen2VLVideoProcessor", "fps": VIDEO_FPS, "min_frames": 4,
                   "max_frames": video_max_frames,
                   "size": {"shortest_edge": MIN_PIXELS, "longest_edge": VIDEO_MAX_PIXELS}, **common}, f, indent=2)


def make_waveform(seed: int, seconds: float, sampling_rate: int = 16000) -> np.ndarray:
    """A deterministic test signal: two tones and a little noise, float32 in [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sampling_rate)) / sampling_rate
    f1, f2 = 200 + 100 * seed, 900 + 50 * seed
    x = 0.4 * np.sin(2 * np.pi * f1 * t) + 0.2 * np.sin(2 * np.pi * f2 * t) + 0.05 * rng.standard_normal(t.size)
    return x.astype(np.float32)


def whisper_log_mel(waveform: np.ndarray, num_mel_bins: int = 128) -> torch.Tensor:
    """[num_mel_bins, frames] log-mel features of a 16 kHz waveform by HF's WhisperFeatureExtractor (no padding to
    30 s; frames = samples // 160), the features Qwen3-Omni's processor feeds its audio tower."""
    from transformers import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor(feature_size=num_mel_bins)
    out = fe(waveform, sampling_rate=16000, return_tensors="pt", padding=True, truncation=False,
             return_attention_mask=True)  # Qwen3OmniMoeProcessor's audio_kwargs
    n = int(out["attention_mask"].sum())
    return out["input_features"][0, :, :n].float()


def hf_inputs(mm, cfg, audio_features=None) -> dict:
    """Our processor's output -> HF's generate() kwargs: pad ids back to the item tokens, pixel values, grids,
    video_second_per_grid, audio input_features [B, mel, T] + feature_attention_mask (audio_features: HF's own
    features of each audio, in order, instead of our processor's)."""
    ids = list(mm.input_ids)
    tokens = {"image": cfg.image_token_id, "video": cfg.video_token_id, "audio": cfg.audio_token_id}
    kw = {}
    for modality, token in tokens.items():
        items = [it for it in mm.mm_items if it.modality == modality]
        for it in items:
            ids[it.offset : it.end] = [token] * it.num_tokens
        if not items:
            continue
        if modality == "audio":
            if audio_features is not None:
                for it, f in zip(items, audio_features):
                    assert f.shape == it.feature.shape, (f.shape, it.feature.shape)
                items = [type(it)(f, it.hash, it.offset, it.num_tokens, modality="audio")
                         for it, f in zip(items, audio_features)]
            n = max(it.feature.shape[1] for it in items)
            feats = torch.zeros(len(items), items[0].feature.shape[0], n)
            mask = torch.zeros(len(items), n, dtype=torch.long)
            for i, it in enumerate(items):
                feats[i, :, : it.feature.shape[1]] = it.feature
                mask[i, : it.feature.shape[1]] = 1
            kw["input_features"], kw["feature_attention_mask"] = feats, mask
            continue
        key = "pixel_values" if modality == "image" else "pixel_values_videos"
        kw[key] = torch.cat([it.feature for it in items])
        kw[f"{modality}_grid_thw"] = torch.tensor([list(it.metadata["grid_thw"]) for it in items])
        if modality == "video":
            kw["video_second_per_grid"] = torch.tensor([it.metadata["second_per_grid_t"] for it in items])
    x = torch.tensor([ids])
    return {"input_ids": x, "attention_mask": torch.ones_like(x), **kw}


def hf_omni_greedy(model, mm, max_new_tokens: int, audio_features=None) -> List[int]:
    """Greedy continuation by HF transformers' Qwen3-Omni Thinker (fp32) on our processor's output."""
    kw = hf_inputs(mm, model.config, audio_features)
    with torch.no_grad():
        y = model.generate(**kw, do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                           pad_token_id=0)
    return y[0, kw["input_ids"].shape[1]:].tolist()
