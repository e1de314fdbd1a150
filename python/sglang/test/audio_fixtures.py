"""Helpers for Qwen2-Audio tests: a small random-weight checkpoint, synthetic audio files made with soundfile, and
HF transformers' greedy tokens on HF's own features (WhisperFeatureExtractor) of the same samples (the reference).

The checkpoint directory holds config.json + model.safetensors (saved by transformers from its own
Qwen2AudioConfig: a 2-layer Whisper encoder of width 32 over its full 1500-position window, a 2-layer Qwen2 LM),
Qwen2-Audio's preprocessor_config.json (WhisperFeatureExtractor, 128 mel bins, 30 s), and the SmolLM2 tokenizer
with Qwen's three audio tokens added.
"""

from __future__ import annotations

import base64
import io
import json
import os
from typing import List, Sequence

import numpy as np
import torch

from sglang.test.engine_fixtures import spread_random_weights

AUDIO_TOKENS = ["<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>"]
SAMPLING_RATE = 16000


def make_random_qwen2_audio(path: str, seed: int = 0, num_mel_bins: int = 128) -> str:
    from transformers import AutoTokenizer, Qwen2AudioConfig, Qwen2AudioForConditionalGeneration

    from sglang.test.engine_fixtures import default_model_dir

    tok = AutoTokenizer.from_pretrained(default_model_dir())
    tok.add_special_tokens({"additional_special_tokens": AUDIO_TOKENS})
    ids = dict(zip(AUDIO_TOKENS, tok.convert_tokens_to_ids(AUDIO_TOKENS)))
    vocab = (len(tok) + 63) // 64 * 64
    text = dict(model_type="qwen2", vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-6,
                bos_token_id=1, eos_token_id=2, rope_theta=10000.0, tie_word_embeddings=False)
    audio = dict(model_type="qwen2_audio_encoder", num_mel_bins=num_mel_bins, encoder_layers=2,
                 encoder_attention_heads=4, encoder_ffn_dim=64, d_model=32, max_source_positions=1500)
    cfg = Qwen2AudioConfig(audio_config=audio, text_config=text, audio_token_index=ids["<|AUDIO|>"])
    torch.manual_seed(seed)
    model = spread_random_weights(Qwen2AudioForConditionalGeneration(cfg).to(torch.float32))
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    with open(os.path.join(path, "preprocessor_config.json"), "w") as f:
        json.dump({"feature_extractor_type": "WhisperFeatureExtractor", "feature_size": num_mel_bins,
                   "sampling_rate": SAMPLING_RATE, "hop_length": 160, "n_fft": 400, "chunk_length": 30,
                   "n_samples": 480000, "nb_max_frames": 3000, "padding_side": "right", "padding_value": 0.0,
                   "return_attention_mask": True}, f, indent=2)
    return path


def tone(seconds: float, rate: int = SAMPLING_RATE, channels: int = 1, seed: int = 0) -> np.ndarray:
    """A deterministic chirp + noise, [frames] or [frames, channels] float32 in [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(round(seconds * rate))) / rate
    f0 = 200.0 + 150.0 * seed
    x = 0.4 * np.sin(2 * np.pi * (f0 + 300.0 * t) * t) + 0.05 * rng.standard_normal(t.size)
    if channels == 1:
        return x.astype(np.float32)
    return np.stack([x * (0.5 + 0.5 * c / channels) for c in range(channels)], axis=1).astype(np.float32)


def audio_file(samples: np.ndarray, rate: int = SAMPLING_RATE, fmt: str = "WAV", subtype: str = "FLOAT") -> bytes:
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, samples, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def audio_data_url(data: bytes, mime: str = "audio/wav") -> str:
    return f"data:{mime};base64,{b64(data)}"


def hf_features(samples: Sequence[np.ndarray], num_mel_bins: int = 128):
    """HF's WhisperFeatureExtractor, as HF's Qwen2AudioProcessor calls it: (input_features, feature_attention_mask,
    tokens per audio)."""
    from transformers import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor(feature_size=num_mel_bins)
    out = fe(list(samples), sampling_rate=SAMPLING_RATE, return_tensors="pt", padding="max_length",
             return_attention_mask=True)
    lengths = out["attention_mask"].sum(-1).tolist()
    tokens = [(((n - 1) // 2 + 1) - 2) // 2 + 1 for n in lengths]
    return out["input_features"], out["attention_mask"], tokens


def hf_qwen2_audio_greedy(model, mm, audio_token_id: int, samples: Sequence[np.ndarray],
                          max_new_tokens: int) -> List[int]:
    """Greedy continuation by HF transformers' Qwen2-Audio (fp32): our prompt with each audio's pad ids turned back
    into <|AUDIO|> tokens (their number checked against HF's count), on HF's features of the same samples."""
    feats, mask, tokens = hf_features(samples, model.config.audio_config.num_mel_bins)
    ids = list(mm.input_ids)
    assert [it.num_tokens for it in mm.mm_items] == tokens, ([it.num_tokens for it in mm.mm_items], tokens)
    for it in mm.mm_items:
        ids[it.offset : it.end] = [audio_token_id] * it.num_tokens
    x = torch.tensor([ids])
    with torch.no_grad():
        y = model.generate(input_ids=x, attention_mask=torch.ones_like(x), input_features=feats,
                           feature_attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                           min_new_tokens=max_new_tokens, pad_token_id=0)
    return y[0, x.shape[1]:].tolist()
