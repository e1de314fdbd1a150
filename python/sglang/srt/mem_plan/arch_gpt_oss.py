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
from sglang.srt.mem_plan.moe_sizes import expert_shard_of_rank
from sglang.srt.mem_plan.text_shape import TextShape

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
    layers = C.need(cfg, "num_hidden_layers")
    return dict(hidden=C.need(cfg, "hidden_size"), heads=C.need(cfg, "num_attention_heads"), layers=layers,
                kv_heads=C.need(cfg, "num_key_value_heads"), head_dim=C.opt(cfg, "head_dim", HEAD_DIM_DEFAULT),
                vocab=C.need(cfg, "vocab_size"), experts=C.need(cfg, "num_local_experts"),
                intermediate=C.need(cfg, "intermediate_size"),
                bias=bool(C.opt(cfg, "attention_bias", ATTENTION_BIAS_DEFAULT)),
                tied=bool(C.opt(cfg, "tie_word_embeddings", False)))


def weights(cfg: dict, tp: int = 1, ep: int = 1) -> tuple[WeightGroup, ...]:
    g = _geometry(cfg)
    H, L, E = g["hidden"], g["layers"], g["experts"]
    if ep == 1:
        held, cols = E, C.cdiv(g["intermediate"], tp)
    else:
        held, cols = expert_shard_of_rank(E, g["intermediate"], tp, ep)
    x = "model.layers.*.mlp.experts"
    experts = [WeightGroup("moe_experts", f"{x}.gate_up_proj", (2 * cols, H), L * held, linear=True, expert=True),
               WeightGroup("moe_experts", f"{x}.gate_up_proj_bias", (2 * cols,), L * held, expert=True),
               WeightGroup("moe_experts", f"{x}.down_proj", (H, cols), L * held, linear=True, expert=True),
               WeightGroup("moe_experts", f"{x}.down_proj_bias", (H,), L * held, expert=True)]
    sinks = WeightGroup("attention", "model.layers.*.self_attn.sinks", (C.cdiv(g["heads"], tp),), L)
    return tuple(C.embeddings(g["vocab"], H, g["tied"], tp)
                 + C.attention(L, H, g["heads"], g["kv_heads"], g["head_dim"], tp, qkv_bias=g["bias"],
                               o_bias=g["bias"])
                 + [sinks] + experts
                 + C.router(L, E, H, module="model.layers.*.mlp.router", bias_name="bias")
                 + C.norms(L, H))


def shape(cfg: dict) -> TextShape:
    g = _geometry(cfg)
    kinds = layer_kinds(cfg)
    return TextShape(
        model_type="gpt_oss", architectures=tuple(cfg.get("architectures") or ()), num_layers=g["layers"],
        hidden_size=g["hidden"], num_q_heads=g["heads"], num_kv_heads=g["kv_heads"], head_dim=g["head_dim"],
        vocab_size=g["vocab"], intermediate_size=g["intermediate"],
        max_position_embeddings=C.need(cfg, "max_position_embeddings"), tie_word_embeddings=g["tied"],
        dtype=C.checkpoint_dtype(cfg), qkv_bias=g["bias"], o_bias=g["bias"], num_experts=g["experts"],
        num_experts_per_tok=C.need(cfg, "num_experts_per_tok"), moe_intermediate_size=g["intermediate"],
        router_bias=True, sparse_layers=tuple(range(g["layers"])), layer_kinds=C.uniform_kinds(kinds),
        sliding_window=_window(cfg) if "sliding" in kinds else 0,
        attention_sinks=True)


ARCHS = (ArchSpec("gpt_oss", "hybrid-attention", weights, shape, served=False),)
