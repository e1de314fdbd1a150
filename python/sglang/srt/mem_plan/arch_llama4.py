"""Llama 4 text models (model_type llama4_text: Llama-4-Scout-17B-16E, Llama-4-Maverick-17B-128E).

Attention: GQA, q/k/v/o biases only with attention_bias (false in the published configs); the query / key norm
(use_qk_norm) is an L2 norm with no weights. no_rope_layers[i] = 1 marks a layer that applies RoPE and, with
attention_chunk_size set, attends only within its attention_chunk_size chunk ("chunked"); the others (every
no_rope_layer_interval-th: NoPE) attend to every token ("full"). layer_types, when given, names the kinds directly.
Scout: 36 chunked + 12 full of 48.
FFN: layers in moe_layers (default: every interleave_moe_layer_step-th, ending each step) hold num_local_experts
routed experts of intermediate_size, fused in the checkpoint as experts.gate_up_proj [E, H, 2I] and
experts.down_proj [E, I, H] (declared per expert as [out, in] slices), one shared expert of intermediate_size and a
router without bias; the other layers a dense MLP of intermediate_size_mlp (Maverick alternates; Scout has none).

The published checkpoints are the composite "llama4" (text_config + vision_config): the names below are the text
model's (Llama4ForCausalLM; the composite prefixes them with language_model.). The composite's vision tower
(vision_config model_type llama4_vision_model) is not priced by this module.
"""

from __future__ import annotations

from sglang.srt.mem_plan import arch_common as C
from sglang.srt.mem_plan.arch_spec import ArchSpec, WeightGroup

# transformers' Llama4TextConfig defaults (5.x), for keys a config leaves out
INTERLEAVE_MOE_LAYER_STEP_DEFAULT = 1
NO_ROPE_LAYER_INTERVAL_DEFAULT = 4
ATTENTION_CHUNK_SIZE_DEFAULT = 8192  # an explicit null: no chunking, every layer full
MAX_POSITION_EMBEDDINGS_DEFAULT = 4096 * 32


def moe_layers(cfg: dict) -> tuple[int, ...]:
    layers = C.need(cfg, "num_hidden_layers")
    if cfg.get("moe_layers") is not None:
        return tuple(sorted(set(cfg["moe_layers"])))
    step = C.opt(cfg, "interleave_moe_layer_step", INTERLEAVE_MOE_LAYER_STEP_DEFAULT)
    return tuple(range(step - 1, layers, step))


def _chunk(cfg: dict):
    return cfg.get("attention_chunk_size", ATTENTION_CHUNK_SIZE_DEFAULT)


def layer_kinds(cfg: dict) -> tuple[str, ...]:
    layers = C.need(cfg, "num_hidden_layers")
    if cfg.get("layer_types"):
        return C.layer_kinds_from_types(cfg, layers)
    interval = C.opt(cfg, "no_rope_layer_interval", NO_ROPE_LAYER_INTERVAL_DEFAULT)
    uses_rope = cfg.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
    if len(uses_rope) != layers:
        raise ValueError(f"config.json (model_type 'llama4_text'): {len(uses_rope)} no_rope_layers for {layers} "
                         f"num_hidden_layers")
    return tuple("chunked" if rope and _chunk(cfg) is not None else "full" for rope in uses_rope)


def _geometry(cfg: dict) -> dict:
    """intermediate: the dense layers' MLP (intermediate_size_mlp; 0 when every layer is MoE); the experts' is
    config.json's intermediate_size."""
    sparse = moe_layers(cfg)
    g = C.geometry(cfg, intermediate=0, max_position_embeddings=MAX_POSITION_EMBEDDINGS_DEFAULT)
    return dict(g, intermediate=C.need(cfg, "intermediate_size_mlp") if len(sparse) < g["layers"] else 0,
                experts=C.need(cfg, "num_local_experts"), moe_intermediate=C.need(cfg, "intermediate_size"),
                sparse=sparse, bias=bool(C.opt(cfg, "attention_bias", False)))


def weights(cfg: dict, tp: int = 1, ep: int = 1) -> tuple[WeightGroup, ...]:
    g = _geometry(cfg)
    H, L, S, E = g["hidden"], g["layers"], len(g["sparse"]), g["experts"]
    experts = C.fused_experts(S, E, H, g["moe_intermediate"], tp, ep, prefix="model.layers.*.feed_forward.experts")
    return tuple(C.embeddings(g["vocab"], H, g["tied"], tp)
                 + C.attention(L, H, g["heads"], g["kv_heads"], g["head_dim"], tp, qkv_bias=g["bias"],
                               o_bias=g["bias"])
                 + C.mlp(L - S, H, g["intermediate"], tp, prefix="model.layers.*.feed_forward")
                 + experts
                 + C.mlp(S, H, g["moe_intermediate"], tp, prefix="model.layers.*.feed_forward.shared_expert",
                         component="moe_experts")
                 + C.router(S, E, H, module="model.layers.*.feed_forward.router")
                 + C.norms(L, H))


def shape(cfg: dict):
    g = _geometry(cfg)
    kinds = layer_kinds(cfg)
    # the NoPE layers rotate nothing; the chunked ones the whole head (Llama4TextRotaryEmbedding: one table)
    return C.text_shape(
        "llama4_text", cfg, g, rotary_dim=C.rotary_dim(cfg, g["head_dim"]), qkv_bias=g["bias"], o_bias=g["bias"],
        num_experts=g["experts"], num_experts_per_tok=C.need(cfg, "num_experts_per_tok"),
        moe_intermediate_size=g["moe_intermediate"], num_shared_experts=1, sparse_layers=g["sparse"],
        layer_kinds=C.uniform_kinds(kinds), attention_chunk_size=_chunk(cfg) if "chunked" in kinds else 0)


ARCHS = (ArchSpec("llama4_text", "hybrid-attention", weights, shape, served=False),)
