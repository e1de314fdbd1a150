"""What a `gemma3` GGUF file (llama.cpp's converter) needs beyond the converter's Llama-shaped defaults.

Tensor names: llama.cpp's ffn_norm is Gemma's pre_feedforward_layernorm, and the two post-norms have their own names.
Norm weights: llama.cpp stores every Gemma RMSNorm weight as 1 + w (its norm multiplies by the stored value); the
Hugging Face checkpoint holds w, so the converter subtracts 1 in float32, as transformers' GGUF loader does.
Config: the file carries no sliding-window pattern, local RoPE base or query scale; llama.cpp's Gemma 3 fixes them
(every 6th layer global, local base 10000, scores scaled by 1 / sqrt(head_dim), except the 62-layer 27B's
1 / sqrt(hidden / heads)), which are also transformers' Gemma3TextConfig defaults.
"""

from __future__ import annotations

import numpy as np

ARCH = "gemma3"
LAYER_TENSORS = {
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
SLIDING_WINDOW_PATTERN = 6
LOCAL_ROPE_BASE = 10000.0
NORM_SHIFT = np.float32(1.0)


def unshift_norm(hf_name: str, w: np.ndarray) -> np.ndarray:
    """The HF weight w of a norm tensor stored as 1 + w (float32 subtraction); other tensors unchanged."""
    return w - NORM_SHIFT if hf_name.endswith("norm.weight") else w


def config_fields(meta, config: dict) -> dict:
    """The gemma3_text config.json keys for this file, over `config` (the converter's Llama-shaped dict)."""
    layers, hidden = config["num_hidden_layers"], config["hidden_size"]
    heads, head_dim = config["num_attention_heads"], config["head_dim"]
    window = int(meta.arch_get("attention.sliding_window", 4096))
    full_rope = {"rope_type": "default", "rope_theta": config["rope_theta"]}
    scaling = meta.arch_get("rope.scaling.type")
    if scaling not in (None, "none"):
        if scaling != "linear":
            raise ValueError(f"gemma3 GGUF: rope.scaling.type {scaling!r} is not supported (linear is)")
        full_rope = {**full_rope, "rope_type": "linear", "factor": float(meta.arch_get("rope.scaling.factor"))}
    fields = {k: v for k, v in config.items() if k not in ("hidden_act", "rope_theta")}
    fields.update(
        hidden_activation="gelu_pytorch_tanh",
        sliding_window=window,
        layer_types=["full_attention" if (i + 1) % SLIDING_WINDOW_PATTERN == 0 else "sliding_attention"
                     for i in range(layers)],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": LOCAL_ROPE_BASE},
                         "full_attention": full_rope},
        query_pre_attn_scalar=hidden // heads if layers == 62 else head_dim,
        final_logit_softcapping=None,
        attn_logit_softcapping=None,
    )
    return fields
