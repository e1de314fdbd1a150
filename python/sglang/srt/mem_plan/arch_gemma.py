"""Gemma 2 and Gemma 3: alternating sliding-window ("local") and global attention layers.

    gemma2       layer_types, else even-numbered layers (i + 1 odd) slide over sliding_window (default 4096)
    gemma3_text  + head_dim-wide q_norm / k_norm; layer_types, else 5 local : 1 global (sliding_window_pattern,
                 default 6: layer i is global when (i + 1) % 6 == 0); also the text model of the gemma3 composite
                 (Gemma3ForConditionalGeneration: a SigLIP tower and a multi_modal_projector, encoder_shapes.py)
Both: tied embeddings (default), four hidden-width norms per layer (input, post-attention, pre- and post-feedforward),
biases with attention_bias. Logit soft-capping and the query scaling have no parameters. Defaults for absent keys are
transformers' Gemma2Config / Gemma3TextConfig (the 27B composite's text_config omits vocab_size, for one).
"""

from __future__ import annotations

from sglang.srt.mem_plan import arch_common as C
from sglang.srt.mem_plan.arch_spec import ArchSpec, WeightGroup

DEFAULTS = {
    "gemma2": dict(vocab_size=256000, num_key_value_heads=4, head_dim=256, max_position_embeddings=8192, pattern=2),
    "gemma3_text": dict(vocab_size=262_208, num_key_value_heads=4, head_dim=256, max_position_embeddings=131_072,
                        pattern=6),
}
NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")


def _geometry(cfg: dict, model_type: str) -> dict:
    d = DEFAULTS[model_type]
    return dict(C.geometry(cfg, kv_heads=d["num_key_value_heads"], head_dim=d["head_dim"], vocab=d["vocab_size"],
                           max_position_embeddings=d["max_position_embeddings"], tied=True),
                bias=bool(cfg.get("attention_bias", False)))


def layer_kinds(cfg: dict, model_type: str, n: int) -> tuple[tuple[str, ...], int]:
    window = cfg.get("sliding_window", 4096)
    if cfg.get("layer_types") is not None:
        kinds = C.layer_kinds_from_types(cfg, n)
    else:
        pattern = C.opt(cfg, "sliding_window_pattern", DEFAULTS[model_type]["pattern"])
        kinds = tuple("sliding" if (i + 1) % pattern else "full" for i in range(n))
    if "sliding" in kinds and not window:
        raise ValueError(f"config.json (model_type {model_type!r}): sliding layers without a sliding_window")
    return kinds, (window if "sliding" in kinds else 0)


def rope_tables(cfg: dict, model_type: str) -> int:
    """Gemma 3's local (sliding) layers rotate with their own base (rope_local_base_freq, or rope_parameters'
    sliding_attention entry) beside the global layers' rope_theta: two tables when the model has both kinds of
    layer (Gemma3RotaryEmbedding holds one inv_freq per layer type). Gemma 2: one RoPE for every layer."""
    if model_type != "gemma3_text":
        return 1
    kinds, _ = layer_kinds(cfg, model_type, C.need(cfg, "num_hidden_layers"))
    return len(set(kinds))


def _weights(model_type: str):
    def weights(cfg: dict, tp: int = 1, ep: int = 1) -> tuple[WeightGroup, ...]:
        g = _geometry(cfg, model_type)
        H, L = g["hidden"], g["layers"]
        return tuple(C.embeddings(g["vocab"], H, g["tied"], tp)
                     + C.attention(L, H, g["heads"], g["kv_heads"], g["head_dim"], tp, qkv_bias=g["bias"],
                                   o_bias=g["bias"], qk_norm="head" if model_type == "gemma3_text" else "")
                     + C.mlp(L, H, g["intermediate"], tp) + C.norms(L, H, NORMS))
    return weights


def _shape(model_type: str):
    def shape(cfg: dict):
        g = _geometry(cfg, model_type)
        kinds, window = layer_kinds(cfg, model_type, g["layers"])
        return C.text_shape(model_type, cfg, g, rotary_dim=C.rotary_dim(cfg, g["head_dim"]),
                            rope_tables=rope_tables(cfg, model_type),
                            qkv_bias=g["bias"], o_bias=g["bias"], qk_norm=model_type == "gemma3_text",
                            layer_kinds=C.uniform_kinds(kinds), sliding_window=window)
    return shape


ARCHS = tuple(ArchSpec(mt, "hybrid-attention", _weights(mt), _shape(mt), False) for mt in ("gemma2", "gemma3_text"))
