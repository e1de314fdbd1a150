"""Dense decoders of the Llama layout: embeddings, L x (attention + gated MLP + norms), final norm, lm_head.

    llama     q/k/v/o biases with attention_bias, MLP biases with mlp_bias                       served
    qwen2     q/k/v biases always, o without                                                     served
    qwen3     head_dim-wide q_norm / k_norm; attention_bias on q/k/v/o                           served
    mistral   a sliding_window on every layer (transformers' default 4096 when the key is absent; null: none)
    ministral layer_types (else every layer sliding when sliding_window is set)
    granite   Llama's tensors (its multipliers are scalars, no parameters)
    phi3      fused qkv_proj and gate_up_proj; a sliding_window set applies to every layer (Phi3Attention)
    olmo2     q_norm / k_norm over the whole projection width; post-attention and post-feedforward norms only
Defaults for absent keys are the transformers config classes' (5.x), named per architecture below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from sglang.srt.mem_plan import arch_common as C
from sglang.srt.mem_plan.arch_spec import ArchSpec, WeightGroup
from sglang.srt.mem_plan.text_shape import TextShape

@dataclass(frozen=True)
class Dense:
    """What distinguishes one dense architecture from another (weights and layer kinds)."""

    max_position_embeddings: int  # transformers' default when the key is absent
    num_key_value_heads: Optional[int] = None  # transformers' default (None: = num_attention_heads)
    head_dim: Optional[int] = None  # transformers' default (None: hidden_size // num_attention_heads)
    tie_word_embeddings: bool = False
    qkv_bias: Callable[[dict], bool] = lambda cfg: bool(cfg.get("attention_bias", False))
    o_bias: Callable[[dict], bool] = lambda cfg: bool(cfg.get("attention_bias", False))
    mlp_bias: Callable[[dict], bool] = lambda cfg: bool(cfg.get("mlp_bias", False))
    qk_norm: str = ""
    fused: bool = False  # qkv_proj + gate_up_proj (Phi-3)
    layer_norms: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm")
    kinds: Callable[[dict, int], tuple[tuple[str, ...], int]] = lambda cfg, n: ((), 0)  # -> (layer kinds, window)
    # (cfg, head_dim) -> rotary width (arch_common.rotary_dim: which RoPEs read partial_rotary_factor)
    rotary_dim: Callable[[dict, int], int] = lambda cfg, head_dim: C.rotary_dim(cfg, head_dim)


def geometry(cfg: dict, d: Dense) -> dict:
    return C.geometry(cfg, kv_heads=d.num_key_value_heads, head_dim=d.head_dim,
                      max_position_embeddings=d.max_position_embeddings, tied=d.tie_word_embeddings)


def dense_weights(d: Dense) -> Callable[[dict, int, int], tuple[WeightGroup, ...]]:
    def weights(cfg: dict, tp: int = 1, ep: int = 1) -> tuple[WeightGroup, ...]:
        g = geometry(cfg, d)
        H, L = g["hidden"], g["layers"]
        names = ("gate_up_proj", "", "down_proj") if d.fused else ("gate_proj", "up_proj", "down_proj")
        return tuple(C.embeddings(g["vocab"], H, g["tied"], tp)
                     + C.attention(L, H, g["heads"], g["kv_heads"], g["head_dim"], tp, qkv_bias=d.qkv_bias(cfg),
                                   o_bias=d.o_bias(cfg), qk_norm=d.qk_norm, fused_qkv=d.fused)
                     + C.mlp(L, H, g["intermediate"], tp, names=names, fused_gate_up=d.fused, bias=d.mlp_bias(cfg))
                     + C.norms(L, H, d.layer_norms))
    return weights


def dense_shape(d: Dense, model_type: str) -> Callable[[dict], TextShape]:
    def shape(cfg: dict) -> TextShape:
        g = geometry(cfg, d)
        kinds, window = d.kinds(cfg, g["layers"])
        return C.text_shape(model_type, cfg, g, rotary_dim=d.rotary_dim(cfg, g["head_dim"]),
                            qkv_bias=d.qkv_bias(cfg), o_bias=d.o_bias(cfg), qk_norm=bool(d.qk_norm),
                            layer_kinds=C.uniform_kinds(kinds), sliding_window=window if "sliding" in kinds else 0)
    return shape


def window_on_every_layer(default: Optional[int]) -> Callable[[dict, int], tuple[tuple[str, ...], int]]:
    """Mistral / Phi-3: one sliding_window for every layer when set (absent: transformers' default; null: none)."""
    def kinds(cfg: dict, n: int):
        window = cfg.get("sliding_window", default)
        return (("sliding",) * n, window) if window else (("full",) * n, 0)
    return kinds


def ministral_kinds(cfg: dict, n: int):
    """MinistralConfig: layer_types as given, else every layer sliding when sliding_window (default 4096) is set."""
    window = cfg.get("sliding_window", 4096)
    if cfg.get("layer_types") is not None:
        kinds = C.layer_kinds_from_types(cfg, n)
        return kinds, (C.need(cfg, "sliding_window") if "sliding" in kinds else 0)
    return (("sliding",) * n, window) if window else (("full",) * n, 0)


def qwen_kinds(cfg: dict, n: int):
    """Qwen2Config / Qwen3Config: the window exists only with use_sliding_window; then layer_types, else the layers
    from max_window_layers (default 28) on are sliding."""
    window = cfg.get("sliding_window", 4096) if cfg.get("use_sliding_window", False) else None
    if cfg.get("layer_types") is not None:
        kinds = C.layer_kinds_from_types(cfg, n)
    else:
        first = C.opt(cfg, "max_window_layers", 28)
        kinds = tuple("sliding" if window is not None and i >= first else "full" for i in range(n))
    if "sliding" in kinds and not window:
        raise ValueError(f"config.json (model_type {cfg.get('model_type')!r}): sliding layer_types without "
                         "use_sliding_window and a sliding_window")
    return kinds, (window or 0)


LLAMA = Dense(max_position_embeddings=2048)
QWEN2 = Dense(max_position_embeddings=32768, num_key_value_heads=32, qkv_bias=lambda cfg: True,
              o_bias=lambda cfg: False, mlp_bias=lambda cfg: False, kinds=qwen_kinds)
QWEN3 = Dense(max_position_embeddings=32768, num_key_value_heads=32, head_dim=128, mlp_bias=lambda cfg: False,
              qk_norm="head", kinds=qwen_kinds)
MISTRAL = Dense(max_position_embeddings=4096 * 32, num_key_value_heads=8, qkv_bias=lambda cfg: False,
                o_bias=lambda cfg: False, mlp_bias=lambda cfg: False, kinds=window_on_every_layer(4096))
MINISTRAL = Dense(max_position_embeddings=4096 * 32, num_key_value_heads=8, qkv_bias=lambda cfg: False,
                  o_bias=lambda cfg: False, mlp_bias=lambda cfg: False, kinds=ministral_kinds)
GRANITE = Dense(max_position_embeddings=2048)
PHI3 = Dense(max_position_embeddings=4096, qkv_bias=lambda cfg: False, o_bias=lambda cfg: False,
             mlp_bias=lambda cfg: False, fused=True, kinds=window_on_every_layer(None),
             rotary_dim=lambda cfg, head_dim: C.rotary_dim(cfg, head_dim, 1.0))  # Phi3Config's default
OLMO2 = Dense(max_position_embeddings=2048, mlp_bias=lambda cfg: False, qk_norm="full",
              layer_norms=("post_attention_layernorm", "post_feedforward_layernorm"))


def _spec(model_type: str, d: Dense, served: bool) -> ArchSpec:
    return ArchSpec(model_type, "dense", dense_weights(d), dense_shape(d, model_type), served)


ARCHS = (
    _spec("llama", LLAMA, True),
    _spec("qwen2", QWEN2, True),
    _spec("qwen3", QWEN3, True),
    _spec("mistral", MISTRAL, False),
    _spec("ministral", MINISTRAL, False),
    _spec("granite", GRANITE, False),
    _spec("phi3", PHI3, False),
    _spec("olmo2", OLMO2, False),
)
