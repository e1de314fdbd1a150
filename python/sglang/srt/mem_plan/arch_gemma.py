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
from sglang.srt.mem_plan.text_shape import TextShape

DEFAULTS = {
    "gemma2": dict(vocab_size=256000, num_key_value_heads=4, head_dim=256, max_position_embeddings=8192, pattern=2),
    "gemma3_text": dict(vocab_size=262_208, num_key_value_heads=4, head_dim=256, max_position_embeddings=131_072,
                        pattern=6),
}
NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")


def _geometry(cfg: dict, model_type: str) -> dict:
    d = DEFAULTS[model_type]
    return dict(hidden=C.need(cfg, "hidden_size"), heads=C.need(cfg, "num_attention_heads"),
                layers=C.need(cfg, "num_hidden_layers"), intermediate=C.need(cfg, "intermediate_size"),
                kv_heads=C.opt(cfg, "num_key_value_heads", d["num_key_value_heads"]),
                head_dim=C.opt(cfg, "head_dim", d["head_dim"]), vocab=C.opt(cfg, "vocab_size", d["vocab_size"]),
                tied=bool(C.opt(cfg, "tie_word_embeddings", True)), bias=bool(cfg.get("attention_bias", False)))


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
    def shape(cfg: dict) -> TextShape:
        g = _geometry(cfg, model_type)
        kinds, window = layer_kinds(cfg, model_type, g["layers"])
        return TextShape(
            model_type=model_type, architectures=tuple(cfg.get("architectures") or ()), num_layers=g["layers"],
            hidden_size=g["hidden"], num_q_heads=g["heads"], num_kv_heads=g["kv_heads"], head_dim=g["head_dim"],
            vocab_size=g["vocab"], intermediate_size=g["intermediate"],
            max_position_embeddings=C.opt(cfg, "max_position_embeddings",
                                          DEFAULTS[model_type]["max_position_embeddings"]),
            tie_word_embeddings=g["tied"], dtype=C.checkpoint_dtype(cfg), qkv_bias=g["bias"], o_bias=g["bias"],
            qk_norm=model_type == "gemma3_text", layer_kinds=C.uniform_kinds(kinds), sliding_window=window)
    return shape


ARCHS = tuple(ArchSpec(mt, "hybrid-attention", _weights(mt), _shape(mt), False) for mt in ("gemma2", "gemma3_text"))
