"""gpt-oss-20b / gpt-oss-120b (model_type gpt_oss): every layer MoE, attention alternating sliding / full.

Attention: q/k/v/o with biases (attention_bias), one learned sink logit per query head (self_attn.sinks, split with
the heads), head_dim 64. layer_types names each layer's attention: "sliding_attention" keeps the last
sliding_window (128) tokens, "full_attention" every token; absent, transformers' GptOssConfig alternates them
starting with sliding. MoE: a router with a bias, num_local_experts experts whose gate and up projections are one
fused tensor (experts.gate_up_proj, [E, H, 2 x intermediate_size]) with a fused bias, and a down projection with a
bias; no shared expert, no dense layer.

The published checkpoints hold the experts' two projections in mxfp4 (quantization_config.modules_to_not_convert
keeps attention, router, embeddings and lm_head in bf16). They are declared here linear + expert, each expert's
[out, in] slice of the fused tensor one of `count` tensors, for quantization_sizes.py to price; their biases are
not linear and stay in the checkpoint dtype.
"""

from __future__ import annotations

from sglang.srt.mem_plan import arch_common as C
from sglang.srt.mem_plan.arch_spec import ArchSpec, WeightGroup

# transformers' GptOssConfig defaults (5.x), for keys a config leaves out
ATTENTION_BIAS_DEFAULT = True
HEAD_DIM_DEFAULT = 64
SLIDING_WINDOW_DEFAULT = 128


def layer_kinds(cfg: dict) -> tuple[str, ...]:
    """Each layer's kind; a sliding_window set to null makes the sliding layers attend to every token (full)."""
    layers = C.need(cfg, "num_hidden_layers")
    if cfg.get("layer_types"):
        kinds = C.layer_kinds_from_types(cfg, layers)
    else:  # GptOssConfig.__post_init__
        kinds = tuple("sliding" if i % 2 == 0 else "full" for i in range(layers))
    return kinds if _window(cfg) else ("full",) * layers


def _window(cfg: dict):
    return cfg.get("sliding_window", SLIDING_WINDOW_DEFAULT)


def _geometry(cfg: dict) -> dict:
    return dict(C.geometry(cfg, head_dim=HEAD_DIM_DEFAULT), experts=C.need(cfg, "num_local_experts"),
                bias=bool(C.opt(cfg, "attention_bias", ATTENTION_BIAS_DEFAULT)))


def weights(cfg: dict, tp: int = 1, ep: int = 1) -> tuple[WeightGroup, ...]:
    g = _geometry(cfg)
    H, L, E = g["hidden"], g["layers"], g["experts"]
    experts = C.fused_experts(L, E, H, g["intermediate"], tp, ep, prefix="model.layers.*.mlp.experts", biases=True)
    sinks = WeightGroup("attention", "model.layers.*.self_attn.sinks", (C.cdiv(g["heads"], tp),), L)
    return tuple(C.embeddings(g["vocab"], H, g["tied"], tp)
                 + C.attention(L, H, g["heads"], g["kv_heads"], g["head_dim"], tp, qkv_bias=g["bias"],
                               o_bias=g["bias"])
                 + [sinks] + experts
                 + C.router(L, E, H, module="model.layers.*.mlp.router", bias_name="bias")
                 + C.norms(L, H))


def shape(cfg: dict):
    g = _geometry(cfg)
    kinds = layer_kinds(cfg)
    return C.text_shape(
        "gpt_oss", cfg, g, rotary_dim=C.rotary_dim(cfg, g["head_dim"]), qkv_bias=g["bias"], o_bias=g["bias"],
        num_experts=g["experts"],
        num_experts_per_tok=C.need(cfg, "num_experts_per_tok"), moe_intermediate_size=g["intermediate"],
        router_bias=True, sparse_layers=tuple(range(g["layers"])), layer_kinds=C.uniform_kinds(kinds),
        sliding_window=_window(cfg) if "sliding" in kinds else 0, attention_sinks=True)


ARCHS = (ArchSpec("gpt_oss", "hybrid-attention", weights, shape, served=False),)
