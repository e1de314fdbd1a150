"""ERNIE 4.5 MoE (model_type ernie4_5_moe: ERNIE-4.5-21B-A3B, ERNIE-4.5-300B-A47B), text only.

Llama-shaped GQA attention, a dense SwiGLU MLP outside the MoE range, and in layer i a MoE block when
moe_layer_start_index <= i <= moe_layer_end_index and (i + 1) % moe_layer_interval == 0: moe_num_experts routed
experts of moe_intermediate_size, moe_num_shared_experts shared experts run as one MLP of moe_num_shared_experts x
moe_intermediate_size, a router (mlp.gate) and the router's score-correction bias
(mlp.moe_statics.e_score_correction_bias, [1, E]). use_bias puts a bias on every attention and MLP projection,
experts included: false in every published config, and refused when true. Every layer is full attention.
Embeddings tied by default.
"""

from __future__ import annotations

from sglang.srt.mem_plan import arch_common as C
from sglang.srt.mem_plan.arch_spec import ArchSpec, WeightGroup

# transformers' Ernie4_5_MoeConfig defaults (5.x), for keys a config leaves out
MOE_LAYER_START_INDEX_DEFAULT = 1
MOE_LAYER_END_INDEX_DEFAULT = -1  # -1: the last layer
MOE_LAYER_INTERVAL_DEFAULT = 1
MOE_NUM_SHARED_EXPERTS_DEFAULT = 2
TIE_WORD_EMBEDDINGS_DEFAULT = True


def _sparse_layers(cfg: dict, layers: int) -> tuple[int, ...]:
    start = C.opt(cfg, "moe_layer_start_index", MOE_LAYER_START_INDEX_DEFAULT)
    end = C.opt(cfg, "moe_layer_end_index", MOE_LAYER_END_INDEX_DEFAULT)
    end = layers - 1 if end == -1 else end
    interval = C.opt(cfg, "moe_layer_interval", MOE_LAYER_INTERVAL_DEFAULT)
    return tuple(i for i in range(layers) if start <= i <= end and (i + 1) % interval == 0)


def _geometry(cfg: dict) -> dict:
    if C.opt(cfg, "use_bias", False):
        raise ValueError("config.json (model_type 'ernie4_5_moe'): use_bias true (a bias on every projection) is not "
                         "a shape the planner knows; every published ERNIE 4.5 MoE has use_bias false")
    g = C.geometry(cfg, tied=TIE_WORD_EMBEDDINGS_DEFAULT)
    return dict(g, experts=C.need(cfg, "moe_num_experts"), moe_intermediate=C.need(cfg, "moe_intermediate_size"),
                shared=C.opt(cfg, "moe_num_shared_experts", MOE_NUM_SHARED_EXPERTS_DEFAULT),
                sparse=_sparse_layers(cfg, g["layers"]))


def weights(cfg: dict, tp: int = 1, ep: int = 1) -> tuple[WeightGroup, ...]:
    g = _geometry(cfg)
    H, L, S, E = g["hidden"], g["layers"], len(g["sparse"]), g["experts"]
    statics = WeightGroup("moe_router", "model.layers.*.mlp.moe_statics.e_score_correction_bias", (1, E), S)
    return tuple(C.embeddings(g["vocab"], H, g["tied"], tp)
                 + C.attention(L, H, g["heads"], g["kv_heads"], g["head_dim"], tp)
                 + C.shared_expert_moe(L, S, E, H, g["intermediate"], g["moe_intermediate"], g["shared"], tp, ep)
                 + [statics] + C.norms(L, H))


def shape(cfg: dict):
    g = _geometry(cfg)
    return C.text_shape(
        "ernie4_5_moe", cfg, g, rotary_dim=C.rotary_dim(cfg, g["head_dim"]), num_experts=g["experts"],
        num_experts_per_tok=C.need(cfg, "moe_k"), moe_intermediate_size=g["moe_intermediate"],
        num_shared_experts=g["shared"], router_bias=True, sparse_layers=g["sparse"])


ARCHS = (ArchSpec("ernie4_5_moe", "moe", weights, shape, served=False),)
